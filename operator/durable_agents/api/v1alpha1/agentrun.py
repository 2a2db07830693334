"""AgentRun: the run a user applies (spec) and the operator's record of it (status)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field

from durable_agents.api.v1alpha1.agent import AgentConfig
from durable_agents.api.v1alpha1.controls import (
    EscalationRequest,
    EscalationStatus,
    ReconcileNowRequest,
    ReconcileNowStatus,
)
from durable_agents.api.v1alpha1.meta import (
    API_VERSION,
    CONDITIONS_SCHEMA_EXTRA,
    NAME_PATTERN,
    Answer,
    ApiModel,
    Condition,
    RunReference,
    append_only,
    cel,
    immutable,
)
from durable_agents.api.v1alpha1.requests import (
    ApprovalDecision,
    CancelRequest,
    ControlRequest,
    Creator,
    Reconciliation,
)
from durable_agents.api.v1alpha1.runstatus import (
    REFUSED_LIMIT,
    ApprovalRequest,
    CancellationStatus,
    OwningRegion,
    RefusedRequest,
)
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.api.v1alpha1.steps import Step

# --- AgentRun ------------------------------------------------------------------------------


IMMUTABLE_ONCE_SET = (
    "tenant",
    "owner",
    "policyRef",
    "deadline",
    "agent",
    "agentRef",
    "steps",
    "createdBy",
    "parentRef",
)
# Requests to a live run. A map's own rule (append_only) is skipped when the whole field goes (a
# merge patch with null, a JSON patch remove): these rules refuse that too, webhook or not.
REQUEST_FIELDS = ("answers", "events", "approvals", "cancellations", "reconciliations")


def _not_withdrawn(field: str) -> dict[str, Any]:
    return cel(
        f"!has(oldSelf.{field}) || size(oldSelf.{field}) == 0 || has(self.{field})",
        f"{field} cannot be withdrawn once given",
        fieldPath=f".{field}",
    )


class PolicyKind(StrEnum):
    """The kinds of policy a run can name."""

    AGENT_POLICY = "AgentPolicy"
    CLUSTER_AGENT_POLICY = "ClusterAgentPolicy"


class PolicyReference(ApiModel):
    """A policy by kind and name: an AgentPolicy of the run's namespace or a ClusterAgentPolicy."""

    kind: PolicyKind | None = None
    """AgentPolicy (of the run's namespace; unset: this) or ClusterAgentPolicy."""
    name: str = Field(max_length=253, pattern=NAME_PATTERN)
    """The policy's name."""

    @property
    def policy_kind(self) -> PolicyKind:
        """The kind named, AgentPolicy when unset."""
        return self.kind or PolicyKind.AGENT_POLICY


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
                    "!(has(self.agent) && has(self.agentRef))",
                    "name an Agent (agentRef) or give the agent inline (agent), not both",
                    fieldPath=".agentRef",
                ),
                cel(
                    "!has(self.agentRef) || !has(self.steps) || size(self.steps) == 0",
                    "a run of an Agent has no steps: its model proposes them",
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
    """The kind of task, for people: shown in the Task column, kept in the AgentRunRecord.
    Immutable."""
    objective: str = Field(max_length=4096, json_schema_extra=immutable("objective"))
    """What the run is to achieve, in words; the model planner gets it as the task. Immutable."""
    owner: str | None = Field(default=None, max_length=253, json_schema_extra=immutable("owner"))
    """Who answers for the run, for people. Immutable once set."""
    tenant: str | None = Field(default=None, max_length=63, json_schema_extra=immutable("tenant"))
    """The tenant the run belongs to, for people; given on to child runs. Immutable once set."""
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
    """The ServiceAccount the run acts as (reads, effects, child runs). Its creator must be allowed
    verb use on it (checked and stamped by the admission webhook). Immutable."""
    policy_ref: PolicyReference | None = Field(default=None, json_schema_extra=immutable("policyRef"))
    """The policy that governs the run: an AgentPolicy in the run's namespace or a
    ClusterAgentPolicy; the run waits until it exists. Naming one needs verb use on it (checked
    and stamped by the admission webhook). Unset: the namespace's default AgentPolicy, else the
    cluster's default ClusterAgentPolicy, else none: the run may only read (PolicyRequired).
    Immutable once set."""
    agent: AgentConfig | None = Field(default=None, json_schema_extra=immutable("agent"))
    """Which planner drives the run and, for the model planner, its model and tools. Unset: the
    scripted planner runs spec.steps. Immutable once set."""
    agent_ref: str | None = Field(
        default=None, max_length=253, pattern=NAME_PATTERN, json_schema_extra=immutable("agentRef")
    )
    """The Agent (in the run's namespace) the run is a run of; the run pins its definition (the
    Agent, its ModelConfig, its prompt) at acceptance and uses that for its whole life. Not with
    spec.agent. Immutable once set."""
    deadline: datetime | None = Field(default=None, json_schema_extra=immutable("deadline"))
    """When the run expires if not finished (state expired); child runs inherit it. Immutable once
    set."""
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
    """The scripted planner's steps, run in order (at most 64; none with the model planner).
    Immutable."""
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
    """How a run ended."""

    reason: str = Field(max_length=128)
    """Why, as a CamelCase word (Completed, Canceled, RetriesExhausted, IntegrityFailed, ...)."""
    message: str = Field(default="", max_length=4096)
    """Why, for people."""
    result: str | None = Field(default=None, max_length=4096)
    """The run's result, for a completed run."""


class HistoryEntry(ApiModel):
    """One committed transition; a bounded timeline for people (Events carry the full trail)."""

    state_version: int = Field(ge=0)
    """The run's stateVersion after this transition."""
    event: str = Field(max_length=63)
    """The state machine event (for example approval_decided, wait_expired)."""
    from_state: RunState = Field(alias="from")
    """The state before."""
    to_state: RunState = Field(alias="to")
    """The state after."""
    at: datetime
    """When it was committed."""
    holder: str | None = Field(default=None, max_length=253)
    """The operator process that committed it."""
    epoch: int | None = Field(default=None, ge=0, description="Lease transitions of the holder (fencing)")
    detail: str | None = Field(default=None, max_length=512)
    """What happened, for people."""


HISTORY_LIMIT = 64


class AgentRunStatus(ApiModel):
    """The operator's authoritative record. Written only by the operator, one write per transition,
    always whole: to the API server's managedFields it is one field, not one per leaf."""

    # Tracking every leaf of the status (checkpoint, history, approval request) in managedFields
    # costs each status write about a fifth of the API server's CPU (bench/status_shapes.py, 9d),
    # for field ownership nobody else may claim: only the operator writes status (the admission
    # policy in charts/durable-agents/files/admission-policy.yaml, and its second line).
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-map-type": "atomic"})

    state: RunState = RunState.PENDING
    """The run's position in its state machine."""
    state_version: int = Field(default=0, ge=0)
    """Committed transitions so far: one more with each commit."""
    state_since: datetime | None = None
    """When the run entered its current state."""
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
    """What a waiting run needs: input:<key>, approval:<request ID>, event:<key>, retry:<time>,
    action:<ActionRecord> or child:<run>."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation of the spec the last commit saw."""
    outcome: Outcome | None = None
    """How the run ended: set with its terminal state (and on quarantine)."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, json_schema_extra=CONDITIONS_SCHEMA_EXTRA
    )
    """Conditions for kubectl wait and people (for example RequestRefused, Escalated)."""
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
    """The pending approval request, while the run is in waiting_approval."""
    cancellation: CancellationStatus | None = None
    """The cancellation being handled, and what a finished task cancellation left behind."""
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
            "properties": {
                "schemaVersion": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "The checkpoint's schema version: a newer one than the operator "
                    "knows quarantines the run, the checkpoint left as stored.",
                }
            },
        },
    )


class AgentRun(ApiModel):
    """A durable agent run: what a user asked for (spec) and the operator's record (status)."""

    api_version: Literal["durable-agents.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["AgentRun"] = "AgentRun"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: AgentRunSpec
    status: AgentRunStatus | None = None
