"""AgentPolicy: approvals, tiers, expiries, retries and runtime configuration, versioned."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from durable_agents.api.v1alpha1.mcp_policy import (  # noqa: F401  (spec.mcp's types, exported here too)
    HOLD_OPEN_DEFAULT,
    HOLD_OPEN_MAX,
    IdempotentMcpTools,
    McpPolicy,
    McpSamplingGrant,
    TrustedMcpServer,
)
from durable_agents.api.v1alpha1.meta import (
    API_VERSION,
    DURATION_PATTERN,
    NAME_PATTERN,
    ActionTier,
    ApiModel,
    cel,
)
from durable_agents.api.v1alpha1.notifications import NotificationTarget
from durable_agents.api.v1alpha1.policystatus import AgentPolicyStatus

# --- AgentPolicy ---------------------------------------------------------------------------


class ChangeResponse(StrEnum):
    """What a material change during a wait means for a pending approval."""

    REAPPROVE = "reapprove"
    REFRESH = "refresh"
    IMMATERIAL = "immaterial"


class DefinitionChangeResponse(StrEnum):
    """What a change of a run's Agent or ModelConfig after it pinned them means for the run."""

    KEEP = "keep"
    REAPPROVE = "reapprove"
    FAIL = "fail"


class ExpiryAction(StrEnum):
    """What an expired approval request does to the run."""

    EXPIRE = "expire"
    REAPPROVE = "reapprove"


class Decision(StrEnum):
    """A decision on an approval request."""

    APPROVE = "approve"
    REJECT = "reject"


class WaitExpiries(ApiModel):
    """How long a run waits when its step names no expiry of its own."""

    input: str = Field(default="24h", max_length=32, pattern=DURATION_PATTERN)
    """For an answer (an ask step or askHuman tool without expiresIn); then the run expires."""
    approval: str = Field(default="72h", max_length=32, pattern=DURATION_PATTERN)
    """Not read by this release: an approval request expires after approvalExpiry."""
    external: str = Field(default="24h", max_length=32, pattern=DURATION_PATTERN)
    """For an event (an await step or awaitEvent tool without expiresIn); then the run expires."""
    retry: str = Field(default="1h", max_length=32, pattern=DURATION_PATTERN)
    """Not read by this release: a retry waits as retry.initialBackoff and retry.maxBackoff say."""


class ApproverRule(ApiModel):
    """Who may approve: a Kubernetes RBAC question (SubjectAccessReview on this verb/resource)."""

    verb: str = Field(default="approve", max_length=63)
    """The RBAC verb an approver needs (also to reconcile an unknown outcome)."""
    resource: str = Field(default="agentruns", max_length=63)
    """The resource of group durable-agents.io the verb is asked on, for the run's name."""
    four_eyes: bool = Field(default=False, description="The run's creator may not approve it.")
    quorum: int = Field(
        default=1,
        ge=1,
        le=10,
        description=(
            "How many distinct people must approve a request (each holding the verb; the creator "
            "never counts under fourEyes). One rejection decides."
        ),
    )
    quorum_by_tier: dict[str, Annotated[int, Field(ge=1, le=10)]] = Field(
        default_factory=dict,
        max_length=3,
        description="A quorum for a tier, overriding quorum (e.g. consequential: 2).",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.all(t, t in ['read-only', 'reversible', 'consequential'])",
                    "quorumByTier keys are tiers: read-only, reversible, consequential",
                )
            ]
        },
    )


class RejectionResponse(StrEnum):
    """What an approver's rejection does to the run."""

    END = "end"
    REPLAN = "replan"


class RejectionRule(ApiModel):
    """What a rejection does: end the run, or (for a call the model proposed) tell the model the
    approver's reason and let it propose again, at most ``maxRejections`` times in a run."""

    response: RejectionResponse = RejectionResponse.END
    """end: the run ends (ApprovalRejected); replan: the model is told the reason and asked again
    (a scripted step still fails)."""
    max_rejections: int = Field(default=3, ge=1, le=32)
    """Rejections a run may take under replan; the next one ends it. At most 32: each leaves a
    step and its approval record in the run's status, which must fit its room (test_limits)."""


class FreshnessRules(ApiModel):
    """What an approval is worth when what it was given under has changed."""

    evidence_changed: ChangeResponse = ChangeResponse.REAPPROVE
    """A Kubernetes evidence reference changed before acting: reapprove (ask again under a new
    request ID), refresh (record the fresh evidence and go on) or immaterial (ignore)."""
    policy_changed: ChangeResponse = ChangeResponse.REAPPROVE
    """The policy changed version since the approval: reapprove or refresh (ask again under the
    new version) or immaterial (the approval still binds)."""
    approval_expired: ExpiryAction = ExpiryAction.EXPIRE
    """An approval request expired undecided: expire (the run ends expired) or reapprove (ask
    again)."""
    definition_changed: DefinitionChangeResponse = DefinitionChangeResponse.KEEP
    """The Agent or ModelConfig a run pinned (spec.agentRef) changed or was deleted: keep (the
    run goes on with the pinned definition), reapprove (a pending approval is superseded by one
    bound to the new definition, which the run then uses) or fail (the run fails, saying so)."""


class RetryPolicy(ApiModel):
    """Retry of a failed attempt (a failed read, an effect that definitely failed): waiting_retry.

    The default is one attempt (no retry): retrying a consequential effect is opted into by policy.
    """

    max_attempts: int = Field(default=1, ge=1, le=100)
    """Attempts of a step, the first included (1: no retry); when all failed, the run fails."""
    initial_backoff: str = Field(default="1s", max_length=32, pattern=DURATION_PATTERN)
    """The wait before the first retry; it doubles with each attempt."""
    max_backoff: str = Field(default="5m", max_length=32, pattern=DURATION_PATTERN)
    """The longest wait between attempts."""
    jitter: float = Field(default=0.2, ge=0, le=1)
    """Up to this fraction of a wait is taken off it, deterministically per run and attempt."""


class UnavailableResponse(StrEnum):
    """What a run does when its recorded runtime configuration is no longer allowed."""

    FAIL = "fail"
    CONTINUE = "continue"


class RuntimeAvailability(ApiModel):
    """The runtime configurations (model, prompt, tool set IDs) a run may resume with.

    An empty list allows any. A run whose recorded configuration is no longer listed goes to
    resume_validation and then, per ``onUnavailable``, fails or continues.
    """

    models: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=list, max_length=64)
    """The spec.agent.model values a run may resume with (empty: any)."""
    prompts: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=list, max_length=64)
    """The spec.agent.prompt values a run may resume with (empty: any)."""
    tool_sets: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=list, max_length=64)
    """The spec.agent.toolSet values a run may resume with (empty: any)."""
    on_unavailable: UnavailableResponse = UnavailableResponse.FAIL
    """A run whose recorded configuration is not listed: fail, or continue."""


RETENTION_MAX = "8760h"  # one year: the longest a finished run may be kept before it is deleted


class Retention(ApiModel):
    """How long a finished run is kept, and whether a compact record outlives it.

    Without ``ttlAfterFinished`` a finished run is kept forever. With it, the operator deletes a
    run once ``ttlAfterFinished`` has passed since it reached its terminal state (its children and
    ActionRecords go with it), after writing an AgentRunRecord unless ``keepRecord`` is false. A
    run whose ledger still has an unsettled action, or with a child still running, is never deleted.
    """

    ttl_after_finished: str | None = Field(
        default=None,
        max_length=32,
        pattern=DURATION_PATTERN,
        description=f"Time after finishing before the run is deleted (at most {RETENTION_MAX}); unset: kept",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(f"duration(self) <= duration('{RETENTION_MAX}')", f"must be at most {RETENTION_MAX}")
            ]
        },
    )
    keep_record: bool = Field(
        default=True, description="Write an AgentRunRecord (outcome, history, digests, ledger) first."
    )


class AgentLimitsSpec(ApiModel):
    """Bounds on a run driven by the model planner; unset fields keep the operator's defaults
    (64 model calls, 4 per boundary, 500k tokens, 32 tool calls, 3 bad calls in a row)."""

    max_model_calls: int | None = Field(default=None, ge=1, le=256, description="Model calls per run.")
    max_model_calls_per_boundary: int | None = Field(
        default=None, ge=1, le=64, description="Model calls between two checkpoint commits."
    )
    max_tokens: int | None = Field(
        default=None, ge=1, le=1_000_000_000, description="Input plus output tokens per run."
    )
    max_tool_calls: int | None = Field(
        default=None,
        ge=1,
        le=63,
        description="Tool calls (so steps) per run: at most 63, a status holds 64 steps.",
    )
    max_consecutive_tool_errors: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Bad calls in a row (unknown tool, invalid arguments) before the run fails.",
    )
    max_sub_agent_depth: int | None = Field(
        default=None,
        ge=1,
        le=8,
        description="How deep sub-agent runs may nest below a top-level run (default 3).",
    )
    max_sub_agents: int | None = Field(
        default=None,
        ge=1,
        le=32,
        description="Sub-agent runs one run may start (its fan-out; default 8).",
    )


DESTINATION_PATTERN = r"^[hH][tT][tT][pP][sS]?://[^\s@?#]+$"  # no userinfo, query or fragment
DestinationEntry = Annotated[str, Field(max_length=2048, pattern=DESTINATION_PATTERN)]


class Destinations(ApiModel):
    """Where the runs this policy governs may send (core/destinations.py): URL prefixes (scheme,
    host, optional port, path prefix matched on segment boundaries), compared after normalisation
    (case, default port, IDN, trailing dot). A category left out is not restricted by this policy;
    an empty list allows nothing. A cluster baseline may narrow: a URL must be allowed by every
    policy that applies."""

    effects: dict[str, list[DestinationEntry]] | None = Field(
        default=None,
        max_length=32,
        description=(
            "Per effect kind (http.post, an installed one), the prefixes its target.url and "
            "target.queryUrl may name; an effect kind not listed may name no URL. Unset: any."
        ),
    )
    mcp_servers: list[DestinationEntry] | None = Field(
        default=None,
        max_length=64,
        description=(
            "Prefixes spec.agent.mcpServers[].url may name (listing, read and consequential calls). "
            "Unset: any."
        ),
    )
    model_endpoints: list[DestinationEntry] | None = Field(
        default=None,
        max_length=64,
        description="Prefixes spec.agent.endpoint.baseUrl may name. Unset: any.",
    )
    notifications: list[DestinationEntry] | None = Field(
        default=None,
        max_length=64,
        description=(
            "Prefixes spec.notifications[].url may name (refused at admission, never sent). Unset: any."
        ),
    )


class AgentPolicySpec(ApiModel):
    """GitOps-owned: the operator reads it and records ``version`` in every run it governs."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.mandatory) || !self.mandatory || (has(self.default) && self.default)",
                    "mandatory: only a default policy (default: true) can be mandatory",
                    fieldPath=".mandatory",
                )
            ]
        }
    )

    version: str = Field(max_length=63)
    """The policy's version, set by its owner: recorded in every run it governs and in approval
    digests; a new version makes pending approvals answer to freshness.policyChanged."""
    tiers: dict[str, ActionTier] = Field(
        default_factory=dict,
        description="Tier of each effect or tool, by name.",
        max_length=128,
    )
    approval_required_tiers: list[ActionTier] = Field(
        default_factory=lambda: [ActionTier.CONSEQUENTIAL],
        max_length=3,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    """The tiers whose actions wait for a person's approval before they are sent."""
    approvers: ApproverRule = Field(default_factory=ApproverRule)
    """Who may approve: a SubjectAccessReview the admission webhook asks for each decision."""
    approval_expiry: str = Field(default="24h", max_length=32, pattern=DURATION_PATTERN)
    """How long an approval request stays open (then freshness.approvalExpired applies)."""
    allowed_decisions: list[Decision] = Field(
        default_factory=lambda: [Decision.APPROVE, Decision.REJECT],
        min_length=1,
        max_length=2,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    """The decisions an approver may give (approve, reject)."""
    rejection: RejectionRule = Field(default_factory=RejectionRule)
    """What an approver's rejection does (end the run, or replan with the reason)."""
    freshness: FreshnessRules = Field(default_factory=FreshnessRules)
    """What a change of evidence or policy, or an expiry, means for an approval."""
    wait_expiries: WaitExpiries = Field(default_factory=WaitExpiries)
    """Default expiries of waits whose step names none."""
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    """Retry of a failed attempt (a failed read, an effect that definitely failed)."""
    deadline: str | None = Field(default=None, max_length=32, pattern=DURATION_PATTERN)
    """Not read by this release: a run's deadline is its own spec.deadline."""
    retention: Retention = Field(default_factory=lambda: Retention())
    """How long a finished run is kept, and whether an AgentRunRecord outlives it."""
    runtime: RuntimeAvailability = Field(default_factory=lambda: RuntimeAvailability())
    """The runtime configurations a run may resume with, checked in resume_validation."""
    propose_compensations: bool = Field(
        default=False, description="On cancellation, list the steps that would compensate unreversed effects."
    )
    agent_limits: AgentLimitsSpec = Field(
        default_factory=lambda: AgentLimitsSpec(),
        description="Bounds on runs driven by the model planner (model calls, tokens, tool calls).",
    )
    mcp: McpPolicy = Field(
        default_factory=lambda: McpPolicy(),
        description="MCP servers whose tool annotations are trusted (none by default).",
    )
    destinations: Destinations | None = Field(
        default=None,
        description=(
            "Where effects, MCP calls and model calls of the runs it governs may go (refused at "
            "admission, checked again before every send). Unset: anywhere."
        ),
    )
    notifications: list[NotificationTarget] | None = Field(
        default=None,
        max_length=8,
        description=(
            "Where to tell people that a run this policy governs waits for an approval or an "
            "answer, ended or is stuck (docs/policies/notifications.md): at least once, with an ID "
            "to deduplicate by, never delaying the run, never with a sealed value."
        ),
    )
    default: bool = Field(
        default=False,
        description=(
            "This policy governs the runs of its scope that name none (an AgentPolicy: its "
            "namespace; a ClusterAgentPolicy: every namespace without a default of its own). At "
            "most one default per scope (refused at admission; two defaults govern nothing: runs "
            "wait). Naming a default needs no verb."
        ),
    )
    mandatory: bool = Field(
        default=False,
        description=(
            "On a namespace's default AgentPolicy: runs of the namespace may not name another "
            "policy (refused at admission; the operator does not act on one that does)."
        ),
    )
    default_region: str | None = Field(
        default=None,
        max_length=63,
        pattern=NAME_PATTERN,
        description=(
            "Home region given by the admission webhook to a new run governed by this policy that "
            "names none; unset: the operator's configured region."
        ),
    )


class AgentPolicy(ApiModel):
    """The rules that govern the runs naming it in spec.policyRef: tiers, approvals, expiries,
    retries, retention and runtime configuration, versioned."""

    api_version: Literal["durable-agents.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["AgentPolicy"] = "AgentPolicy"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: AgentPolicySpec
    status: AgentPolicyStatus | None = None


class ClusterAgentPolicy(ApiModel):
    """An AgentPolicy for every namespace (cluster-scoped, as cert-manager's ClusterIssuer beside
    Issuer): the baseline with ``default: true`` governs the runs of namespaces without a default
    of their own; a run names one with ``policyRef.kind: ClusterAgentPolicy`` (verb ``use`` on
    clusteragentpolicies)."""

    api_version: Literal["durable-agents.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["ClusterAgentPolicy"] = "ClusterAgentPolicy"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: AgentPolicySpec
