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
    uid: str = Field(max_length=64)
    run_id: str | None = Field(default=None, max_length=128, description="status.runId (idempotency keys)")
    task_type: str = Field(max_length=63)
    policy: str | None = Field(default=None, max_length=253)
    policy_version: str | None = Field(default=None, max_length=63)
    parent: str | None = Field(default=None, max_length=253, description="The parent run, for a child")
    created_at: datetime | None = None
    created_by: str | None = Field(default=None, max_length=253)


class EvidenceDigest(ApiModel):
    """One evidence reference of the checkpoint, by ID and content digest (never its content)."""

    id: str = Field(max_length=253)
    source: str = Field(max_length=32)
    step_index: int | None = Field(default=None, ge=0)
    content_digest: str | None = Field(default=None, max_length=128)


class ApprovalSummary(ApiModel):
    """An approval request and its decision: the digest binds it to the exact action approved."""

    request_id: str = Field(max_length=128)
    digest: str = Field(max_length=71)
    step_index: int | None = Field(default=None, ge=0)
    policy_version: str | None = Field(default=None, max_length=63)
    decision: str | None = Field(default=None, max_length=16)
    approver: str | None = Field(default=None, max_length=253)
    decided_at: datetime | None = None


class LedgerEntry(ApiModel):
    """One ActionRecord: its key and how it ended (never its arguments or the response)."""

    idempotency_key: str = Field(max_length=253)
    action_record: str = Field(max_length=253)
    effect: str = Field(max_length=128)
    tier: str = Field(max_length=32)
    step_index: int = Field(ge=0)
    state: str = Field(max_length=32)
    attempts: int = Field(default=0, ge=0)
    finished_at: datetime | None = None
    reason: str | None = Field(default=None, max_length=128)
    approval_request_id: str | None = Field(default=None, max_length=128)
    compensates: str | None = Field(default=None, max_length=253)


class ChildSummary(ApiModel):
    name: str = Field(max_length=253)
    step_index: int | None = Field(default=None, ge=0)
    outcome: str | None = Field(default=None, max_length=32)
    reason: str | None = Field(default=None, max_length=128)


class AgentRunRecordSpec(ApiModel):
    """The compact record; immutable once written."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [cel("self == oldSelf", "a run record is immutable")]}
    )

    run: RecordedRun
    state: str = Field(max_length=32, description="The run's state when it was let go")
    outcome: Outcome | None = None
    finished_at: datetime | None = Field(default=None, description="When the run reached its terminal state")
    recorded_at: datetime
    why: Literal["retention", "deleted"] = Field(
        description="retention: its time after finishing passed; deleted: a user deleted it"
    )
    history: list[HistoryEntry] = Field(default_factory=list, max_length=64)
    cancellation: CancellationStatus | None = None
    evidence: list[EvidenceDigest] = Field(default_factory=list, max_length=RECORD_EVIDENCE_LIMIT)
    approvals: list[ApprovalSummary] = Field(default_factory=list, max_length=64)
    ledger: list[LedgerEntry] = Field(default_factory=list, max_length=RECORD_LEDGER_LIMIT)
    children: list[ChildSummary] = Field(default_factory=list, max_length=64)
    truncated: bool = Field(default=False, description="Some ledger or evidence entries did not fit")


class AgentRunRecord(ApiModel):
    api_version: Literal["durable-agents.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["AgentRunRecord"] = "AgentRunRecord"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: AgentRunRecordSpec
