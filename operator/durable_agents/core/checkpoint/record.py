"""The checkpoint record: the typed fields of ``status.checkpoint``, schema version 3.

State-machine position, the lease epoch that committed it (fencing token), evidence references,
completed tool-call records, pending actions, approval records, policy version, runtime
configuration IDs, trace link, attempt count, timestamps, what a wait is waiting on, and sealed
sensitive values. Plain JSON with camelCase keys, compact; large data (transcripts, tool results,
documents) is referenced, never copied. Which state names exist is the state machine's business.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from pydantic.alias_generators import to_camel

from durable_agents.api.v1alpha1.meta import SEALED_STRING_MAX
from durable_agents.core.agent_facts import AgentFacts
from durable_agents.core.definitions import PinnedDefinition
from durable_agents.core.sealing import SealedField


def _to_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:  # 0001-01-01T00:00+05:00 has no UTC instant; must not escape validation
        raise ValueError("instant is out of range in UTC") from exc


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_to_utc)]
"""A timezone-aware instant, normalised to UTC; naive datetimes are rejected."""
Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
"""A SHA-256 content or approval digest: ``sha256:`` and 64 lowercase hex digits."""
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=253)]
KubernetesName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")]
Namespace = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
FieldName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")]
Stamp = Annotated[str, StringConstraints(min_length=3, max_length=512, pattern=r"^[^:]+:[A-Za-z0-9+/=]+$")]
"""An operator stamp, ``<key ID>:<base64 MAC>`` (:mod:`durable_agents.core.stamps`)."""
Traceparent = Annotated[
    str, StringConstraints(pattern=r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
]
Count = Annotated[int, Field(ge=0, le=2**53 - 1)]
"""A non-negative integer JSON carries exactly (RFC 8785, which stamps are computed over)."""
StepIndex = Count

ActionTier = Literal["read-only", "reversible", "consequential"]
ApprovalDecision = Literal["approved", "rejected"]
ToolCallOutcome = Literal["succeeded", "failed"]


class _Contract(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class Position(_Contract):
    """Where the run stands in its state machine; selects the permitted transitions."""

    state: Annotated[str, StringConstraints(min_length=1, max_length=63)]
    step: StepIndex
    """Index of the next scripted step."""
    state_version: Count


class Fencing(_Contract):
    """The lease epoch of the worker that committed this checkpoint: a stale holder's commit fails."""

    holder: Identifier
    lease_transitions: Count


class _EvidenceRefBase(_Contract):
    id: Identifier
    """Stable reference ID, unique within the checkpoint; tool-call records point at it."""
    step_index: StepIndex
    """The step that recorded the reference."""
    recorded_at: UtcDatetime


class KubernetesEvidenceRef(_EvidenceRefBase):
    """A Kubernetes object, pinned to the version and content the run saw."""

    source: Literal["kubernetes"] = "kubernetes"
    api_version: Identifier
    kind: Annotated[str, StringConstraints(min_length=1, max_length=63)]
    namespace: Namespace | None = None
    """None for cluster-scoped objects."""
    name: Identifier
    uid: Identifier | None = None
    resource_version: Identifier
    content_digest: Digest


class ExternalEvidenceRef(_EvidenceRefBase):
    """A record in an authoritative system outside Kubernetes."""

    source: Literal["external"] = "external"
    uri: Annotated[str, StringConstraints(min_length=1, max_length=2048)]
    content_digest: Digest | None = None


EvidenceRef = Annotated[KubernetesEvidenceRef | ExternalEvidenceRef, Field(discriminator="source")]
"""An evidence reference; ``source`` says which kind."""


class ToolCallRecord(_Contract):
    """A completed tool call. Its result is an evidence reference, never the raw body."""

    id: Identifier
    tool: Identifier
    step_index: StepIndex
    started_at: UtcDatetime
    finished_at: UtcDatetime
    outcome: ToolCallOutcome
    result_ref: Identifier | None = None
    """ID of an evidence reference in this checkpoint."""
    error: Annotated[str, StringConstraints(max_length=1024)] | None = None
    """Why a failed call failed (reason: message); never a raw response body."""
    attempt: Count = 0
    """The retry attempt (``retry.attempts`` when the call was made) it belongs to."""


class PendingAction(_Contract):
    """A side effect whose intent is committed in the action ledger and not yet reconciled here."""

    idempotency_key: Identifier
    action_record_name: KubernetesName
    effect: Identifier
    tier: ActionTier
    step_index: StepIndex
    approval_request_id: Identifier | None = None
    """ID of the approval record that authorises this action, when its tier needs one."""


class ApprovalRecord(_Contract):
    """An approval request, bound by digest to the consequential fields it covers."""

    request_id: Identifier
    digest: Digest
    """SHA-256 over the canonical JSON of the consequential fields."""
    step_index: StepIndex | None = None
    """The step whose action this request covers."""
    expires_at: UtcDatetime
    policy_version: Identifier
    decision: ApprovalDecision | None = None
    decided_by: Identifier | None = None
    """Who decided: the rejecter, or the approver whose approval reached the quorum."""
    decided_at: UtcDatetime | None = None
    # Optional additions within schema version 3 (absent, as in every record written before them
    # and in every record of a request one approval decides: the stored form is unchanged).
    quorum: Annotated[int, Field(ge=2, le=10)] | None = None
    """Distinct approvals the request needs, when more than one (the policy's, at request time)."""
    four_eyes: Literal[True] | None = None
    """The creator may not decide it (the policy's fourEyes, at request time)."""
    approved_by: Annotated[list[Identifier], Field(max_length=10)] | None = None
    """Under a quorum, once approved: the distinct verified approvers, in the order they approved."""

    @model_validator(mode="after")
    def _decided_together(self) -> Self:
        decided = (self.decision is not None, self.decided_by is not None, self.decided_at is not None)
        if any(decided) and not all(decided):
            raise ValueError("decision, decidedBy and decidedAt are set together or not at all")
        return self


class PolicyRef(_Contract):
    """The policy the run was accepted under (resolved: named, its namespace's default, or the
    cluster's baseline). ``kind`` and ``digest`` are optional additions within schema version 3
    (absent: an AgentPolicy, recorded before they were)."""

    name: Identifier
    version: Identifier | None = None
    kind: Literal["AgentPolicy", "ClusterAgentPolicy"] | None = None
    """AgentPolicy (of the run's namespace) or ClusterAgentPolicy."""
    digest: Digest | None = None
    """The content digest of the policy's spec (core/policy_identity.content_digest)."""


class RuntimeConfig(_Contract):
    """Identifiers of the behavioural dependencies: model, prompt and tool set."""

    model: Identifier | None = None
    prompt: Identifier | None = None
    tool_set: Identifier | None = None
    operator: Identifier | None = None
    """The operator version that committed the checkpoint; another version means a deployment change."""


class Timestamps(_Contract):
    """Wall-clock instants. Deliberately not cross-checked: workers' clocks skew, runs must not die of it."""

    created_at: UtcDatetime
    updated_at: UtcDatetime
    entered_state_at: UtcDatetime


class PendingInput(_Contract):
    """The question a run in ``waiting_input`` waits to have answered."""

    request_id: Identifier
    question: Annotated[str, StringConstraints(min_length=1, max_length=SEALED_STRING_MAX)]
    """The step's question as the spec holds it: sealed, when the admission webhook sealed it."""
    expires_at: UtcDatetime
    key: Identifier | None = None
    """The ``spec.answers`` key awaited, once one was refused (core/deliveries.py); None: ``request_id``."""


class PendingExternal(_Contract):
    """The external event a run in ``waiting_external`` waits for."""

    request_id: Identifier
    event: Identifier
    expires_at: UtcDatetime
    key: Identifier | None = None
    """The ``spec.events`` key awaited, once one was refused (core/deliveries.py); None: ``event``."""


class RetryState(_Contract):
    """Failed attempts so far and, in ``waiting_retry``, when the next one is due."""

    attempts: Count = 0
    """Failed attempts so far; the current attempt has this number."""
    retry_at: UtcDatetime | None = None
    last_failure: Annotated[str, StringConstraints(max_length=1024)] | None = None


ChildOutcome = Literal["completed", "failed", "canceled", "expired"]


class ChildRecord(_Contract):
    """A child run this run started (intent committed before the child is created)."""

    name: KubernetesName
    step_index: StepIndex
    outcome: ChildOutcome | None = None
    """The child's terminal state, once reconciled; None while it runs."""
    reason: Annotated[str, StringConstraints(max_length=128)] | None = None


CancelScope = Literal["turn", "toolCall", "children", "task"]


class CancellationRecord(_Contract):
    """A cancellation request this run has acted on (spec.cancellations[requestId])."""

    request_id: Identifier
    scope: CancelScope
    step_index: StepIndex
    """The step that was current when the request was handled."""
    handled_at: UtcDatetime
    effective: bool = True
    """False when nothing in its scope existed when it was handled: recorded, never acted on later."""


class Checkpoint(_Contract):
    """The authoritative, resumable record of one run, schema version 3."""

    schema_version: Literal[3] = 3
    position: Position
    fencing: Fencing | None = None
    """None only before any worker has committed under a lease."""
    input_refs: list[EvidenceRef] = Field(default_factory=list)
    output_refs: list[EvidenceRef] = Field(default_factory=list)
    evidence: list[EvidenceRef] = Field(default_factory=list)
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    pending_actions: list[PendingAction] = Field(default_factory=list)
    approvals: list[ApprovalRecord] = Field(default_factory=list)
    policy: PolicyRef | None = None
    runtime_config: RuntimeConfig = Field(default_factory=RuntimeConfig)
    trace_link: Traceparent | None = None
    """W3C ``traceparent`` of the run's trace."""
    retry: RetryState = Field(default_factory=RetryState)
    timestamps: Timestamps
    pending_input: PendingInput | None = None
    pending_external: PendingExternal | None = None
    sealed: dict[FieldName, SealedField] | None = None
    """Sensitive values, sealed, by field name; see :func:`seal_field`."""
    children: list[ChildRecord] = Field(default_factory=list)
    cancellations: list[CancellationRecord] = Field(default_factory=list)
    agent: AgentFacts | None = None
    """The model planner's turns (sealed, bounded); None for other planners. Added within version 3:
    absent in older checkpoints, and omitted when None, so their stamps are unchanged."""
    definition: PinnedDefinition | None = None
    """A run of an Agent (spec.agentRef): the definition it pinned at acceptance, which it uses for
    its whole life. Added within version 3, omitted when None."""
    position_stamped: Literal[True] | None = None
    """True: its committer stamps every position in ``status.positionStamp``
    (:mod:`durable_agents.core.positions`). Added within version 3, omitted when None."""
    data_key_digest: Annotated[str, StringConstraints(max_length=80)] | None = None
    """The run's data key's fingerprint once it had one: answers must be sealed with it (deliveries.py)."""
    plan: Digest | None = None
    """What the operator accepted the run to do: the digest of its immutable spec fields
    (:mod:`durable_agents.core.plan_guard`), compared at every decision. Added within version 3,
    omitted when None (a run accepted before it records it at its next commit)."""
    integrity: Stamp | None = None
    """The operator's stamp over :func:`integrity_payload`; None only where no keyring stamps."""

    def evidence_refs(self) -> list[KubernetesEvidenceRef | ExternalEvidenceRef]:
        """All evidence references: inputs, outputs and evidence, in that order."""
        return [*self.input_refs, *self.output_refs, *self.evidence]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        ref_ids = _unique("evidence reference id", (ref.id for ref in self.evidence_refs()))
        _unique("tool call id", (call.id for call in self.tool_calls))
        _unique("child run name", (child.name for child in self.children))
        _unique("cancellation requestId", (cancellation.request_id for cancellation in self.cancellations))
        _unique("pending action idempotencyKey", (action.idempotency_key for action in self.pending_actions))
        request_ids = _unique("approval requestId", (approval.request_id for approval in self.approvals))
        for call in self.tool_calls:
            if call.result_ref is not None and call.result_ref not in ref_ids:
                raise ValueError(
                    f"tool call {call.id!r} names unknown evidence reference {call.result_ref!r}"
                )
        for action in self.pending_actions:
            if action.approval_request_id is not None and action.approval_request_id not in request_ids:
                raise ValueError(
                    f"pending action {action.idempotency_key!r} names unknown approval request "
                    f"{action.approval_request_id!r}"
                )
        if self.pending_input is not None and self.pending_external is not None:
            raise ValueError("a run waits on pendingInput or pendingExternal, not both")
        return self


def _unique(what: str, values: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"duplicate {what} {value!r}")
        seen.add(value)
    return seen
