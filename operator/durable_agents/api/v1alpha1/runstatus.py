"""The parts of an AgentRun's status that the operator writes beside its state: the approval
request, a cancellation's report, refused requests and the owning region."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field

from durable_agents.api.v1alpha1.meta import NAME_PATTERN, ActionTier, ApiModel


class CancelScope(StrEnum):
    """What a cancellation covers (seed: cancellation scopes)."""

    TURN = "turn"  # the current step (a model turn, for a model planner): abandon it and go on
    TOOL_CALL = "toolCall"  # the pending tool call: cancel it if undispatched, else reconcile; go on
    CHILDREN = "children"  # the run's child runs (their trees too); the parent goes on
    TASK = "task"  # the entire run and its children: it ends ``canceled``


class ModelProposal(ApiModel):
    """A call the model planner proposed: the tool the model called and what it said. The
    model's words are advisory, never authority; they are sealed (``kubectl agentrun status
    --reveal`` shows them to an approver, marked as written by the model)."""

    tool: str = Field(max_length=64, description="The tool the model called (covered by the digest).")
    call_id: str = Field(max_length=64)
    turn: int = Field(ge=0, description="The turn in status.checkpoint.agent.turns.")
    reason: dict[str, Any] | None = Field(
        default=None,
        description="Sealed: {writtenBy: model, text}: what the model said alongside the call.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class ApprovalRequest(ApiModel):
    """The pending approval request: what exactly is to be approved, by whom, until when."""

    request_id: str = Field(max_length=128)
    digest: str = Field(max_length=71)
    step: str = Field(max_length=63)
    effect: str = Field(max_length=128)
    tier: ActionTier
    target: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    arguments: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    evidence: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=list, max_length=64)
    policy_version: str | None = Field(default=None, max_length=63)
    policy_reason: str = Field(max_length=1024)
    approver_role: str = Field(max_length=253)
    service_account: str | None = Field(
        default=None,
        max_length=253,
        description="The ServiceAccount the action runs as (covered by the digest).",
    )
    expires_at: datetime
    allowed_decisions: list[Literal["approve", "reject"]] = Field(max_length=2)
    proposal: ModelProposal | None = Field(
        default=None, description="For a call the model planner proposed: the model's tool and words."
    )


class UnreversedEffect(ApiModel):
    """An effect that happened and that cancellation did not (and cannot) undo."""

    step: str = Field(max_length=63)
    effect: str = Field(max_length=128)
    action_record: str = Field(max_length=253)
    state: str = Field(max_length=32)


class CancellationStatus(ApiModel):
    """What a task-scope cancellation did: in-flight work reconciled, effects that remain."""

    request_id: str = Field(max_length=128)
    scope: CancelScope
    reason: str = Field(default="", max_length=1024)
    requested_at: datetime | None = None
    unreversed_effects: list[UnreversedEffect] = Field(default_factory=list, max_length=64)
    canceled_actions: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=list, max_length=64)
    proposed_compensations: list[Annotated[str, Field(max_length=63)]] = Field(
        default_factory=list,
        max_length=64,
        description="Steps that would compensate the unreversed effects (policy: proposeCompensations).",
    )


class RefusedRequest(ApiModel):
    """A request in the spec that the operator did not act on: nothing proves its authority (no
    stamp of the operator's admission webhook, or one that does not verify). Recorded once."""

    field: Literal[
        "approvals",
        "cancellations",
        "retryQuarantine",
        "reconcileNow",
        "escalation",
        "reconciliations",
        "answers",
        "events",
    ]
    key: str = Field(
        max_length=128,
        description=(
            "The request ID (for retryQuarantine: the token; for reconciliations, answers and "
            "events: the key)."
        ),
    )
    reason: str = Field(max_length=64, pattern=r"^[A-Za-z]+$")
    message: str = Field(default="", max_length=512)
    at: datetime


# Every request the engine looks at again fits (the pending decision, 16 cancellations, 32
# reconciliations, a retry token, the two control tokens), so none is dropped from the record
# while it still matters and refused twice.
REFUSED_LIMIT = 64


class OwningRegion(ApiModel):
    """Which region owns the run now, and the region epoch its last commit carried (fencing).

    A run is owned by its home region (``spec.region``) until an explicit failover adopts it into
    another: then ``region``, ``adoptedFrom``, ``failover`` and ``adoptedAt`` are stamped by the
    adopting operator (``stamp``); ownership without a stamp that verifies is ignored.
    """

    region: str = Field(max_length=63, pattern=NAME_PATTERN)
    region_epoch: int = Field(
        default=0, ge=0, description="The region Lease's leaseTransitions at the commit"
    )
    adopted_from: str | None = Field(default=None, max_length=63)
    failover: str | None = Field(
        default=None, max_length=253, description="The RegionFailover that adopted it"
    )
    adopted_at: datetime | None = None
    stamp: str | None = Field(default=None, max_length=512)
