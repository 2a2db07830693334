"""AgentPolicy status: what the operator says about a policy, written by its policy status writer
(:mod:`durable_agents.shell.runs.policy_status`), read by GitOps tools (kstatus: Flux, kpt; the
Argo CD health check) and by admission (the version history)."""

from __future__ import annotations

from pydantic import Field

from durable_agents.api.v1alpha1.meta import CONDITIONS_SCHEMA_EXTRA, ApiModel, Condition

POLICY_VERSIONS_LIMIT = 32
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"


class PolicyVersionRecord(ApiModel):
    """One version this policy has had, with the digest of its content under that version."""

    version: str = Field(max_length=63)
    """The policy's spec.version."""
    content_digest: str = Field(max_length=71, pattern=DIGEST_PATTERN)
    """The digest of its spec under that version, without the version (sha256:...)."""


class PolicyRunCounts(ApiModel):
    """The runs this policy governs now (those whose spec.policyRef names it), as last counted."""

    running: int = Field(default=0, ge=0)
    """Not ended and not waiting for an approval (working, or waiting for input, an event, a retry)."""
    waiting_for_approval: int = Field(default=0, ge=0)
    """Waiting for an approval under this policy."""
    stuck: int = Field(default=0, ge=0)
    """Stuck because of this policy: they cannot go on while it is unusable (it is invalid)."""


class AgentPolicyStatus(ApiModel):
    """What the operator last observed of this policy: its health for GitOps tools (conditions
    Ready and Stalled, observedGeneration), its identity (content digest, version history) and
    the runs it governs."""

    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation this status was written from."""
    content_digest: str | None = Field(default=None, max_length=71, pattern=DIGEST_PATTERN)
    """The digest of the spec without its version (core/policy_identity.content_digest)."""
    versions: list[PolicyVersionRecord] = Field(default_factory=list, max_length=POLICY_VERSIONS_LIMIT)
    """The versions this policy has had, with their content digests, newest last (at most 32)."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=8, json_schema_extra=CONDITIONS_SCHEMA_EXTRA
    )
    """Ready (usable: runs are decided under it) and Stalled (it cannot be used, with the reason)."""
    runs: PolicyRunCounts = Field(default_factory=PolicyRunCounts)
    """Counts of the runs it governs now."""


__all__ = ["POLICY_VERSIONS_LIMIT", "AgentPolicyStatus", "PolicyRunCounts", "PolicyVersionRecord"]
