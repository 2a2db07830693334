"""AgentRunRecord: the compact record that outlives a deleted run (retention).

Written once by the operator right before it lets a run go (its retention time passed, or a user
deleted it), never owned by the run, so garbage collection never takes it along. It keeps what
an audit needs and nothing sealed: the outcome and timeline, digests of the evidence and of the
approvals, and the action ledger's keys and outcome states. Never arguments, answers, questions,
effect responses or any other value the admission webhook seals.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from durable_agents.api.v1alpha1.agentrun import HistoryEntry, Outcome
from durable_agents.api.v1alpha1.meta import API_VERSION, ApiModel, cel
from durable_agents.api.v1alpha1.runstatus import CancellationStatus

# --- AgentRunRecord ------------------------------------------------------------------------

RECORD_LEDGER_LIMIT = 256
RECORD_EVIDENCE_LIMIT = 256


class RecordedRun(ApiModel):
    """Which run this is the record of."""

    name: str = Field(max_length=253)
    """The run's name."""
    uid: str = Field(max_length=64)
    """The run's metadata.uid."""
    run_id: str | None = Field(default=None, max_length=128, description="status.runId (idempotency keys)")
    task_type: str = Field(max_length=63)
    """The run's spec.taskType."""
    policy: str | None = Field(default=None, max_length=253)
    """The AgentPolicy it named (spec.policyRef)."""
    policy_version: str | None = Field(default=None, max_length=63)
    """The policy version its checkpoint recorded last."""
    parent: str | None = Field(default=None, max_length=253, description="The parent run, for a child")
    created_at: datetime | None = None
    """The run's metadata.creationTimestamp."""
    created_by: str | None = Field(default=None, max_length=253)
    """The username in the run's spec.createdBy."""


class EvidenceDigest(ApiModel):
    """One evidence reference of the checkpoint, by ID and content digest (never its content)."""

    id: str = Field(max_length=253)
    """The evidence reference's ID in the checkpoint."""
    source: str = Field(max_length=32)
    """kubernetes (an object read) or external (an action's result)."""
    step_index: int | None = Field(default=None, ge=0)
    """The step that gathered it."""
    content_digest: str | None = Field(default=None, max_length=128)
    """A digest of the content."""


class ApprovalSummary(ApiModel):
    """An approval request and its decision: the digest binds it to the exact action approved."""

    request_id: str = Field(max_length=128)
    """The approval request's ID."""
    digest: str = Field(max_length=71)
    """The request's digest (what exactly was to be approved)."""
    step_index: int | None = Field(default=None, ge=0)
    """The step whose action it was for."""
    policy_version: str | None = Field(default=None, max_length=63)
    """The policy version it was asked under."""
    decision: str | None = Field(default=None, max_length=16)
    """approve or reject; unset: undecided."""
    approver: str | None = Field(default=None, max_length=253)
    """The username of who decided."""
    decided_at: datetime | None = None
    """When it was decided."""


class LedgerEntry(ApiModel):
    """One ActionRecord: its key and how it ended (never its arguments or the response)."""

    idempotency_key: str = Field(max_length=253)
    """The action's idempotency key."""
    action_record: str = Field(max_length=253)
    """The ActionRecord's name."""
    effect: str = Field(max_length=128)
    """The effect (or tool) it performed."""
    tier: str = Field(max_length=32)
    """Its tier."""
    step_index: int = Field(ge=0)
    """The step it served."""
    state: str = Field(max_length=32)
    """Its last state (succeeded, failed, canceled, outcome_unknown, ...)."""
    attempts: int = Field(default=0, ge=0)
    """Sends made."""
    finished_at: datetime | None = None
    """When it settled."""
    reason: str | None = Field(default=None, max_length=128)
    """Why it is in its state."""
    approval_request_id: str | None = Field(default=None, max_length=128)
    """The approval request that allowed it."""
    compensates: str | None = Field(default=None, max_length=253)
    """The ActionRecord it compensated."""


class ChildSummary(ApiModel):
    """A child run the run started, and how it ended."""

    name: str = Field(max_length=253)
    """The child run's name."""
    step_index: int | None = Field(default=None, ge=0)
    """The step that started it."""
    outcome: str | None = Field(default=None, max_length=32)
    """The child's terminal state; unset: it had not ended."""
    reason: str | None = Field(default=None, max_length=128)
    """The reason of the child's outcome."""


class AgentRunRecordSpec(ApiModel):
    """The compact record; immutable once written."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [cel("self == oldSelf", "a run record is immutable")]}
    )

    run: RecordedRun
    """Which run this is the record of."""
    state: str = Field(max_length=32, description="The run's state when it was let go")
    outcome: Outcome | None = None
    """The run's status.outcome."""
    finished_at: datetime | None = Field(default=None, description="When the run reached its terminal state")
    recorded_at: datetime
    """When the record was written."""
    why: Literal["retention", "deleted"] = Field(
        description="retention: its time after finishing passed; deleted: a user deleted it"
    )
    history: list[HistoryEntry] = Field(default_factory=list, max_length=64)
    """The run's status.history: its committed transitions, oldest first."""
    cancellation: CancellationStatus | None = None
    """The run's status.cancellation: what a cancellation left behind."""
    evidence: list[EvidenceDigest] = Field(default_factory=list, max_length=RECORD_EVIDENCE_LIMIT)
    """The run's evidence references, by ID and digest."""
    approvals: list[ApprovalSummary] = Field(default_factory=list, max_length=64)
    """The run's approval requests and their decisions."""
    ledger: list[LedgerEntry] = Field(default_factory=list, max_length=RECORD_LEDGER_LIMIT)
    """The run's ActionRecords: keys and how each ended."""
    children: list[ChildSummary] = Field(default_factory=list, max_length=64)
    """The run's child runs and their outcomes."""
    truncated: bool = Field(default=False, description="Some ledger or evidence entries did not fit")


class AgentRunRecord(ApiModel):
    """The compact record of a run that was deleted (retention or a user), for audit."""

    api_version: Literal["durable-agents.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["AgentRunRecord"] = "AgentRunRecord"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: AgentRunRecordSpec
