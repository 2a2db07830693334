"""The parts of an AgentRun's status that the operator writes beside its state: the approval
request, a cancellation's report, refused requests and the owning region."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field

from durable_agents.api.v1alpha1.meta import NAME_PATTERN, ActionTier, ApiModel


class CancelScope(StrEnum):
    """What a cancellation covers: turn, toolCall, children or task."""

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
    """The ID the model gave the call."""
    turn: int = Field(ge=0, description="The turn in status.checkpoint.agent.turns.")
    reason: dict[str, Any] | None = Field(
        default=None,
        description="Sealed: {writtenBy: model, text}: what the model said alongside the call.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class ApprovalVote(ApiModel):
    """One verified approval of a request that needs more than one (a policy's quorum)."""

    approver: str = Field(max_length=253)
    """Who approved (the stamped, verified username)."""
    key: str = Field(max_length=160)
    """The spec.approvals key the decision was written under."""
    decided_at: datetime | None = None
    """When (stamped by the admission webhook)."""


class ApprovalRequest(ApiModel):
    """The pending approval request: what exactly is to be approved, by whom, until when."""

    request_id: str = Field(max_length=128)
    """The key a decision goes under in spec.approvals (<step>-<n>: a new one each time it asks)."""
    digest: str = Field(max_length=71)
    """sha256 over the canonical JSON of effect (and tool), arguments, target, ServiceAccount, policy
    version, run ID and request ID: a decision must carry it, binding it to this exact action."""
    step: str = Field(max_length=63)
    """The step whose action waits for approval."""
    effect: str = Field(max_length=128)
    """The effect (or tool) to be performed."""
    tier: ActionTier
    """The action's tier, which the policy's approvalRequiredTiers lists."""
    target: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """Where the effect lands (the effect's own fields)."""
    arguments: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """What the effect is sent (sealed values stay sealed: kubectl agentrun status --reveal)."""
    evidence: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=list, max_length=64)
    """IDs of the evidence references the run had gathered (revalidated before acting)."""
    policy_version: str | None = Field(default=None, max_length=63)
    """The AgentPolicy version the request was made under (covered by the digest)."""
    policy_reason: str = Field(max_length=1024)
    """Why the policy asks for approval (policy, version, tier)."""
    approver_role: str = Field(max_length=253)
    """Who may decide: the RBAC verb and resource (and four-eyes) the admission webhook checks."""
    service_account: str | None = Field(
        default=None,
        max_length=253,
        description="The ServiceAccount the action runs as (covered by the digest).",
    )
    expires_at: datetime
    """When the request expires (then the policy's freshness.approvalExpired applies)."""
    allowed_decisions: list[Literal["approve", "reject"]] = Field(max_length=2)
    """The decisions the policy allows (allowedDecisions)."""
    approver_verb: str | None = Field(default=None, max_length=63)
    """The RBAC verb a decision needs (the policy's approvers.verb), asked by SubjectAccessReview."""
    approver_resource: str | None = Field(default=None, max_length=63)
    """The resource of group durable-agents.io the verb is asked on, for the run's name."""
    four_eyes: bool = Field(default=False, description="The run's creator may not decide it.")
    quorum: int = Field(default=1, ge=1, le=10, description="Distinct approvals needed.")
    approved_by: list[ApprovalVote] = Field(
        default_factory=list,
        max_length=10,
        description="The verified approvals so far (a quorum above 1): quorum minus these are missing.",
    )
    proposal: ModelProposal | None = Field(
        default=None, description="For a call the model planner proposed: the model's tool and words."
    )


class UnreversedEffect(ApiModel):
    """An effect that happened and that cancellation did not (and cannot) undo."""

    step: str = Field(max_length=63)
    """The step that performed it."""
    effect: str = Field(max_length=128)
    """The effect (or tool) performed."""
    action_record: str = Field(max_length=253)
    """The ActionRecord of the action."""
    state: str = Field(max_length=32)
    """The action's state when the cancellation finished (succeeded)."""


class CancellationStatus(ApiModel):
    """What a task-scope cancellation did: in-flight work reconciled, effects that remain."""

    request_id: str = Field(max_length=128)
    """The key of the spec.cancellations request acted on."""
    scope: CancelScope
    """The request's scope (task, for the report of a finished cancellation)."""
    reason: str = Field(default="", max_length=1024)
    """The reason given with the request."""
    requested_at: datetime | None = None
    """When the request was made (stamped by the admission webhook)."""
    unreversed_effects: list[UnreversedEffect] = Field(default_factory=list, max_length=64)
    """Effects that happened and that the cancellation did not undo (at most 64)."""
    canceled_actions: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=list, max_length=64)
    """ActionRecords canceled before they were dispatched (never sent)."""
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
    """The spec field the request was written in."""
    key: str = Field(
        max_length=128,
        description=(
            "The request ID (for retryQuarantine: the token; for reconciliations, answers and "
            "events: the key)."
        ),
    )
    reason: str = Field(max_length=64, pattern=r"^[A-Za-z]+$")
    """Why, as a word: Unstamped, StampInvalid, DigestMismatch, Unsealed, SealInvalid and the like."""
    message: str = Field(default="", max_length=512)
    """Why, for people."""
    at: datetime
    """When the operator refused it."""


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
    """The owning region."""
    region_epoch: int = Field(
        default=0, ge=0, description="The region Lease's leaseTransitions at the commit"
    )
    adopted_from: str | None = Field(default=None, max_length=63)
    """The region the run was adopted from, after a failover."""
    failover: str | None = Field(
        default=None, max_length=253, description="The RegionFailover that adopted it"
    )
    adopted_at: datetime | None = None
    """When the adopting operator took the run on."""
    stamp: str | None = Field(default=None, max_length=512)
    """The adopting operator's stamp over the adoption: ownership whose stamp does not verify is
    ignored."""
