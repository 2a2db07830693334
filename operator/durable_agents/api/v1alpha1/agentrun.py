"""AgentRun: the run a user applies (spec) and the operator's record of it (status)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from durable_agents.api.v1alpha1.agent import AgentConfig
from durable_agents.api.v1alpha1.controls import (
    EscalationRequest,
    EscalationStatus,
    ReconcileNowRequest,
    ReconcileNowStatus,
)
from durable_agents.api.v1alpha1.identity import Identity as Identity  # here before its own module
from durable_agents.api.v1alpha1.identity import stamp_field as _stamp
from durable_agents.api.v1alpha1.meta import (
    API_VERSION,
    CONDITIONS_SCHEMA_EXTRA,
    DURATION_PATTERN,
    NAME_PATTERN,
    REQUEST_ID_PATTERN,
    SEALED_STRING_MAX,
    Answer,
    ApiModel,
    Condition,
    LocalReference,
    ObjectReference,
    RunReference,
    append_only,
    bounded_duration,
    cel,
    immutable,
)
from durable_agents.api.v1alpha1.runstatus import (
    REFUSED_LIMIT,
    ApprovalRequest,
    CancellationStatus,
    CancelScope,
    OwningRegion,
    RefusedRequest,
)
from durable_agents.api.v1alpha1.states import RunState

# --- AgentRun ------------------------------------------------------------------------------


class ReadStep(ApiModel):
    """Read a Kubernetes object as the run's ServiceAccount; record it as an evidence reference."""

    object: ObjectReference


class AskStep(ApiModel):
    """Enter waiting_input with a question; answered via ``spec.answers[requestId]``."""

    question: str = Field(min_length=1, max_length=SEALED_STRING_MAX, description="Sealed at admission.")
    expires_in: str | None = Field(
        default=None, max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("expiresIn")
    )


class AwaitStep(ApiModel):
    """Enter waiting_external until ``spec.events[event]`` is set."""

    event: str = Field(max_length=63, pattern=REQUEST_ID_PATTERN)
    expires_in: str | None = Field(
        default=None, max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("expiresIn")
    )


class CompleteStep(ApiModel):
    """Finish the run with a result."""

    result: str = Field(default="", max_length=4096)


class EffectStep(ApiModel):
    """Perform a side effect through the action ledger (intent, dispatch, reconcile).

    ``effect`` names an effect plugin (built in: ``http.post``, ``kubernetes.apply``); ``target``
    and ``arguments`` are the plugin's. ``compensates`` names an earlier effect step whose action
    this one compensates: compensation is a new action, never a rollback by assumption.
    """

    effect: str = Field(max_length=128, pattern=r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$")
    target: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    arguments: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    compensates: str | None = Field(default=None, max_length=63, pattern=NAME_PATTERN)


LEAF_STEP_KINDS = ("read", "ask", "await", "effect", "complete")
STEP_KINDS = (*LEAF_STEP_KINDS, "child")


def _exactly_one(kinds: tuple[str, ...]) -> ConfigDict:
    return ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    " + ".join(f"(has(self.{k}) ? 1 : 0)" for k in kinds) + " == 1",
                    "exactly one of " + ", ".join(kinds) + " must be set in a step",
                )
            ]
        }
    )


class LeafStep(ApiModel):
    """A step of a child run: any step kind except ``child`` (CRD schemas cannot recurse)."""

    model_config = _exactly_one(LEAF_STEP_KINDS)

    name: str = Field(max_length=63, pattern=NAME_PATTERN)
    read: ReadStep | None = None
    ask: AskStep | None = None
    await_: AwaitStep | None = Field(default=None, alias="await")
    effect: EffectStep | None = None
    complete: CompleteStep | None = None


class ChildStep(ApiModel):
    """Start a child AgentRun and wait (in waiting_external) for its terminal outcome.

    The child is named ``<parent>-<step>``, owned by the parent (garbage-collected with it), carries
    ``spec.parentRef`` and inherits the parent's ServiceAccount and policy. It is created AS the
    parent's ServiceAccount, so a run may only start children if that account may create AgentRuns.
    """

    task_type: str = Field(max_length=63, pattern=NAME_PATTERN)
    objective: str = Field(max_length=4096)
    steps: list[LeafStep] = Field(default_factory=list, max_length=16)
    expires_in: str | None = Field(
        default=None, max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("expiresIn")
    )


class Step(LeafStep):
    """One scripted step: exactly one of the step kinds is set."""

    model_config = _exactly_one(STEP_KINDS)

    child: ChildStep | None = None


class Creator(Identity):
    """The run's creator, stamped by the admission webhook at creation. ``stamp`` is the operator's
    proof that this creator was allowed to ``use`` the run's ServiceAccount (the run acts as it),
    for this namespace, name and ServiceAccount, made at ``stampedAt``: the operator acts on it
    only if that is this object's ``metadata.creationTimestamp`` (within a few seconds), so a
    ``createdBy`` copied into a run re-created under the same name proves nothing."""

    stamped_at: datetime | None = Field(
        default=None,
        description="When the admission webhook stamped the run (set by the webhook, with the stamp).",
    )
    stamp: str | None = _stamp()


class ApprovalDecision(ApiModel):
    """An approver's decision on one approval request, keyed by its request ID in ``spec.approvals``.

    ``digest`` must equal the request's digest (it binds the decision to the exact action).
    ``approver``, ``decidedAt`` and ``stamp`` are overwritten by the admission webhook from the
    request's authenticated user; whatever a client writes there is discarded. The operator acts
    only on a decision whose stamp verifies.
    """

    digest: str = Field(max_length=71, pattern=r"^sha256:[0-9a-f]{64}$")
    decision: Literal["approve", "reject"]
    reason: str | None = Field(default=None, max_length=1024)
    approver: Identity | None = None
    decided_at: datetime | None = None
    stamp: str | None = _stamp()


class CancelRequest(ApiModel):
    """A user's request to cancel, keyed by a request ID in ``spec.cancellations``.

    ``requestedBy``, ``requestedAt`` and ``stamp`` are stamped by the admission webhook; the
    operator acts only on a request whose stamp verifies.
    """

    scope: CancelScope = CancelScope.TASK
    reason: str = Field(default="", max_length=1024)
    requested_by: Identity | None = None
    requested_at: datetime | None = None
    stamp: str | None = _stamp()


class Reconciliation(ApiModel):
    """A person's answer for an action whose outcome is unknown (its authoritative system cannot be
    asked by key, say an MCP tool), keyed in ``spec.reconciliations`` by the ActionRecord's name
    (``NAME.ATTEMPT`` for a later attempt of a record already reconciled once).

    ``attempt`` is the record's ``status.attempts`` the person looked at: the answer speaks of that
    send only (after a "not applied" the action is sent again, and that send needs its own answer).
    ``applied``: it happened (the record succeeds, nothing is sent again) or it did not (it is sent
    again with the same idempotency key). ``reconciler``, ``reconciledAt`` and ``stamp`` are
    overwritten by the admission webhook, which lets only who holds the policy's approver verb
    reconcile; the operator acts only on an answer whose stamp verifies.
    """

    applied: bool
    attempt: int = Field(ge=0, le=1_000_000)
    reason: str = Field(default="", max_length=1024)
    reconciler: Identity | None = None
    reconciled_at: datetime | None = None
    stamp: str | None = _stamp()


class ControlRequest(ApiModel):
    """Who asked for a control that is a single field (``spec.retryQuarantine``), when, and the
    operator's stamp over it: all three set by the admission webhook, never by a client."""

    requested_by: Identity | None = None
    requested_at: datetime | None = None
    stamp: str | None = _stamp()


IMMUTABLE_ONCE_SET = ("tenant", "owner", "policyRef", "deadline", "agent", "steps", "createdBy", "parentRef")
# Requests to a live run. A map's own rule (append_only) is skipped when the whole field goes (a
# merge patch with null, a JSON patch remove): these rules refuse that too, webhook or not.
REQUEST_FIELDS = ("answers", "events", "approvals", "cancellations", "reconciliations")


def _not_withdrawn(field: str) -> dict[str, Any]:
    return cel(
        f"!has(oldSelf.{field}) || size(oldSelf.{field}) == 0 || has(self.{field})",
        f"{field} cannot be withdrawn once given",
        fieldPath=f".{field}",
    )


class AgentRunSpec(ApiModel):
    """What the user asked for, plus the user's requests to a live run (answers, events)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *(
                    cel(
                        f"has(self.{f}) == has(oldSelf.{f})",
                        f"{f} cannot be added or removed after creation",
                        fieldPath=f".{f}",
                    )
                    for f in IMMUTABLE_ONCE_SET
                ),
                *(_not_withdrawn(f) for f in REQUEST_FIELDS),
                cel(
                    "!has(oldSelf.retryQuarantine) || has(self.retryQuarantine)",
                    "retryQuarantine cannot be withdrawn (set a new token to retry again)",
                    fieldPath=".retryQuarantine",
                ),
                # Set once when absent (a run created before regions existed), never removed: the
                # field's own rule refuses a change, which only an authorised failover may make.
                cel(
                    "!has(self.agent) || self.agent.planner != 'model' || !has(self.steps) "
                    "|| size(self.steps) == 0",
                    "a run driven by the model planner has no steps: the model proposes them",
                    fieldPath=".steps",
                ),
                cel(
                    "!has(oldSelf.region) || has(self.region)",
                    "region cannot be removed once set",
                    fieldPath=".region",
                ),
            ]
        }
    )

    task_type: str = Field(max_length=63, pattern=NAME_PATTERN, json_schema_extra=immutable("taskType"))
    objective: str = Field(max_length=4096, json_schema_extra=immutable("objective"))
    owner: str | None = Field(default=None, max_length=253, json_schema_extra=immutable("owner"))
    tenant: str | None = Field(default=None, max_length=63, json_schema_extra=immutable("tenant"))
    region: str | None = Field(
        default=None,
        max_length=63,
        pattern=NAME_PATTERN,
        description=(
            "The run's home region: only the operator deployment serving that region advances it. "
            "Immutable once set; defaulted by the admission webhook from the AgentPolicy's "
            "defaultRegion, else the operator's configured region."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self == oldSelf",
                    "region is immutable: a run changes region only by an authorised failover",
                )
            ]
        },
    )
    service_account_name: str = Field(
        default="default",
        max_length=253,
        pattern=NAME_PATTERN,
        json_schema_extra=immutable("serviceAccountName"),
    )
    policy_ref: LocalReference | None = Field(default=None, json_schema_extra=immutable("policyRef"))
    agent: AgentConfig | None = Field(default=None, json_schema_extra=immutable("agent"))
    deadline: datetime | None = Field(default=None, json_schema_extra=immutable("deadline"))
    steps: list[Step] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self == oldSelf", "steps is immutable"),
                # Step names are request IDs and idempotency-key parts: they must be unique.
                cel("self.all(s, self.exists_one(t, t.name == s.name))", "step names must be unique"),
            ]
        },
    )
    answers: dict[str, Answer] = Field(
        default_factory=dict,
        max_length=64,
        description="Answers to questions, keyed by the request ID shown in status.",
        json_schema_extra=append_only("an answer cannot be changed or withdrawn once given"),
    )
    approvals: dict[str, ApprovalDecision] = Field(
        default_factory=dict,
        max_length=32,
        description="Approval decisions, keyed by the request ID in status.approvalRequest.",
        json_schema_extra=append_only("an approval decision cannot be changed or withdrawn once given"),
    )
    created_by: Creator | None = Field(
        default=None,
        description=(
            "The run's creator, stamped by the admission webhook (four-eyes approvals), with the "
            "operator's proof that the creator may use the run's ServiceAccount."
        ),
        json_schema_extra=immutable("createdBy"),
    )
    events: dict[str, Answer] = Field(
        default_factory=dict,
        max_length=64,
        description="External events delivered to the run, keyed by event name.",
        json_schema_extra=append_only("an event cannot be changed or withdrawn once delivered"),
    )
    cancellations: dict[str, CancelRequest] = Field(
        default_factory=dict,
        max_length=16,
        description="Cancellation requests, keyed by request ID; handled in request-ID order.",
        json_schema_extra=append_only("a cancellation request cannot be changed or withdrawn once made"),
    )
    reconciliations: dict[str, Reconciliation] = Field(
        default_factory=dict,
        max_length=32,
        description=(
            "People's answers for actions whose outcome is unknown, keyed by ActionRecord name: "
            "applied or not (kubectl agentrun reconcile)."
        ),
        json_schema_extra=append_only("a reconciliation cannot be changed or withdrawn once given"),
    )
    retry_quarantine: str | None = Field(
        default=None,
        max_length=63,
        description="Set to a new token to retry a quarantined run (for example after an upgrade).",
    )
    retry_quarantine_request: ControlRequest | None = Field(
        default=None,
        description="Who set retryQuarantine to its current token: stamped by the admission webhook.",
    )
    reconcile_now: ReconcileNowRequest | None = Field(
        default=None, description="Ask the authoritative system now (kubectl agentrun reconcile RUN)."
    )
    escalation: EscalationRequest | None = Field(
        default=None, description="Mark the run for a person (kubectl agentrun escalate RUN --reason)."
    )
    parent_ref: RunReference | None = Field(
        default=None,
        description="The parent run, for a child run (set by the parent's operator).",
        json_schema_extra=immutable("parentRef"),
    )


class Outcome(ApiModel):
    reason: str = Field(max_length=128)
    message: str = Field(default="", max_length=4096)
    result: str | None = Field(default=None, max_length=4096)


class HistoryEntry(ApiModel):
    """One committed transition; a bounded timeline for people (Events carry the full trail)."""

    state_version: int = Field(ge=0)
    event: str = Field(max_length=63)
    from_state: RunState = Field(alias="from")
    to_state: RunState = Field(alias="to")
    at: datetime
    holder: str | None = Field(default=None, max_length=253)
    epoch: int | None = Field(default=None, ge=0, description="Lease transitions of the holder (fencing)")
    detail: str | None = Field(default=None, max_length=512)


HISTORY_LIMIT = 64


class AgentRunStatus(ApiModel):
    """The operator's authoritative record. Written only by the operator, one write per transition."""

    state: RunState = RunState.PENDING
    state_version: int = Field(default=0, ge=0)
    state_since: datetime | None = None
    run_id: str | None = Field(
        default=None,
        max_length=128,
        description=(
            "The run's identity for idempotency keys and approval digests: its metadata.uid when "
            "first committed, kept from then on, so a run restored from a backup (a new uid) keeps "
            "its keys and the authoritative system recognises what it already applied."
        ),
    )
    trace_id: str | None = Field(
        default=None,
        min_length=32,
        max_length=32,
        pattern="^[0-9a-f]{32}$",
        description=(
            "The run's OpenTelemetry trace ID (32 lowercase hex), set with its first commit and kept: "
            "every process that works on the run puts its spans in this one trace."
        ),
        json_schema_extra={"x-kubernetes-validations": [cel("self == oldSelf", "traceId never changes")]},
    )
    waiting_for: str | None = Field(default=None, max_length=253)
    observed_generation: int | None = Field(default=None, ge=0)
    outcome: Outcome | None = None
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, json_schema_extra=CONDITIONS_SCHEMA_EXTRA
    )
    history: list[HistoryEntry] = Field(
        default_factory=list,
        max_length=HISTORY_LIMIT,
        description=(
            "The committed transitions, oldest first (the newest 64): stateVersion, event, from, "
            "to, at, holder, epoch, detail. Written only by the operator, which validates each "
            "entry itself; the API server stores them without validating each field, which "
            "bench/status_shapes.py measured as a large share of a status write's cost."
        ),
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )
    position_stamp: str | None = Field(
        default=None,
        max_length=512,
        description=(
            "The operator's stamp over the run ID, state, stateVersion and the outcome's reason, "
            "written with every commit. A status whose stamp does not verify was written by someone "
            "other than the operator: the run is quarantined (IntegrityFailed), never acted on, and "
            "no one (a parent run, retention) takes its state for a fact."
        ),
    )
    approval_request: ApprovalRequest | None = None
    cancellation: CancellationStatus | None = None
    retry_at: datetime | None = Field(default=None, description="When a run in waiting_retry tries again.")
    quarantine_retried: str | None = Field(
        default=None, max_length=63, description="The spec.retryQuarantine token last acted on."
    )
    refused_requests: list[RefusedRequest] = Field(
        default_factory=list,
        max_length=REFUSED_LIMIT,
        description="Requests the operator refused to act on (the newest, each once), and why.",
    )
    ownership: OwningRegion | None = Field(
        default=None, description="The owning region and its epoch at the last commit (region fencing)."
    )
    reconcile_now: ReconcileNowStatus | None = Field(
        default=None, description="The last spec.reconcileNow acted on: what was asked, the answers."
    )
    escalation: EscalationStatus | None = Field(
        default=None, description="The last spec.escalation acted on: who escalated, why, when."
    )
    checkpoint: dict[str, Any] | None = Field(
        default=None,
        description="The typed checkpoint contract; validated by the operator, never by the API server.",
        json_schema_extra={
            "x-kubernetes-preserve-unknown-fields": True,
            "required": ["schemaVersion"],
            "properties": {"schemaVersion": {"type": "integer", "minimum": 1}},
        },
    )


class AgentRun(ApiModel):
    api_version: Literal["durable-agents.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["AgentRun"] = "AgentRun"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: AgentRunSpec
    status: AgentRunStatus | None = None
