"""An AgentPolicy's status, decided: health for GitOps tools (``Ready``, ``Stalled``,
``observedGeneration``, as kstatus and the Argo CD health check read them), its identity (content
digest, the history of its versions) and the counts of the runs it governs. Pure: the shell's
policy status writer (:mod:`durable_agents.shell.runs.policy_status`) gathers the facts and
writes what this decides, only when it differs from what is there.

A policy is Stalled (it cannot be used: runs under it wait, nothing is sent under it) when its
spec does not parse as an AgentPolicySpec, or when its version was seen before with other content
(the version history says so): the version no longer says what governs the runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import (
    POLICY_VERSIONS_LIMIT,
    AgentPolicySpec,
    Condition,
    ConditionStatus,
    PolicyRunCounts,
    PolicyVersionRecord,
)
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.health import READY, STALLED
from durable_agents.core.policy_identity import content_digest
from durable_agents.core.stuck import NO_APPROVER, POLICY_MISSING, STUCK

VALID = "Valid"
INVALID_SPEC = "InvalidSpec"
VERSION_REUSED = "VersionReused"
# A run's Stuck reasons that are the policy's doing (a missing policy, nobody holding its approver verb).
POLICY_STUCK_REASONS = frozenset({POLICY_MISSING, NO_APPROVER})
POLICY_WAIT_PREFIX = "agentpolicy:"

PolicyKey = tuple[str, str]  # (namespace, name)


def governing_policy(namespace: str, spec: Mapping[str, Any]) -> PolicyKey | None:
    """Which AgentPolicy governs this run (its ``spec`` as stored): the one its spec.policyRef
    names; None: no policy. The one place the policy status asks it (resolution by default, a
    namespace's or the cluster's, answers here too)."""
    ref = spec.get("policyRef")
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return (namespace, name) if isinstance(name, str) and name else None


# --- the runs a policy governs -------------------------------------------------------------

RUNNING, WAITING, STUCK_BUCKET = "running", "waitingForApproval", "stuck"
_ENDED = frozenset(s.value for s in RunState if s.terminal) | {RunState.QUARANTINED.value}


def run_bucket(status: Mapping[str, Any]) -> str | None:
    """Where a governed run (its ``status`` as stored) counts: running, waiting for approval, stuck
    because of its policy, or nowhere (it ended, or is quarantined: its own Stalled says so).
    Read from the wire, not parsed: every run event of the process comes through here."""
    state = status.get("state") or RunState.PENDING.value
    if state in _ENDED:
        return None
    for condition in status.get("conditions") or []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == STUCK
            and condition.get("status") == ConditionStatus.TRUE.value
            and condition.get("reason") in POLICY_STUCK_REASONS
        ):
            return STUCK_BUCKET
    waiting_for = status.get("waitingFor")
    if (
        status.get("checkpoint") is None
        and isinstance(waiting_for, str)
        and waiting_for.startswith(POLICY_WAIT_PREFIX)
    ):
        return STUCK_BUCKET  # it cannot start until its policy is known and usable
    if state == RunState.WAITING_APPROVAL.value:
        return WAITING
    return RUNNING


def counts_of(buckets: Sequence[str]) -> PolicyRunCounts:
    return PolicyRunCounts(
        running=sum(1 for b in buckets if b == RUNNING),
        waiting_for_approval=sum(1 for b in buckets if b == WAITING),
        stuck=sum(1 for b in buckets if b == STUCK_BUCKET),
    )


# --- the status ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Usability:
    ready: bool
    reason: str
    message: str


def usability(spec: Mapping[str, Any], versions: Sequence[PolicyVersionRecord]) -> Usability:
    """Whether runs can be decided under this policy, and why not."""
    try:
        parsed = AgentPolicySpec.model_validate(spec)
    except ValidationError as err:
        first = err.errors()[0] if err.errors() else {"loc": (), "msg": str(err)}
        field = ".".join(str(part) for part in first.get("loc", ())) or "spec"
        return Usability(False, INVALID_SPEC, f"spec.{field}: {first.get('msg')}; runs under it wait")
    digest = content_digest(spec)
    other = next((v for v in versions if v.version == parsed.version and v.content_digest != digest), None)
    if other is not None:
        return Usability(
            False,
            VERSION_REUSED,
            f"version {parsed.version!r} was seen with other content ({other.content_digest}); "
            "runs under it wait: give this content a new spec.version",
        )
    return Usability(True, VALID, f"version {parsed.version!r} ({digest}) governs its runs")


def versions_with(
    versions: Sequence[PolicyVersionRecord], version: str, digest: str
) -> list[PolicyVersionRecord]:
    """The history with (version, digest) newest: moved to the end if seen before, at most 32."""
    entry = PolicyVersionRecord(version=version, content_digest=digest)
    kept = [v for v in versions if (v.version, v.content_digest) != (version, digest)]
    return [*kept, entry][-POLICY_VERSIONS_LIMIT:]


def policy_status(policy: Mapping[str, Any], counts: PolicyRunCounts, now: datetime) -> dict[str, Any] | None:
    """The status the policy should have (wire form), or None when it already has it."""
    meta: Mapping[str, Any] = policy.get("metadata") or {}
    spec: Mapping[str, Any] = policy.get("spec") or {}
    prior: Mapping[str, Any] = policy.get("status") or {}
    generation = int(meta.get("generation") or 0)
    versions = _records(prior.get("versions"))
    verdict = usability(spec, versions)
    digest = content_digest(spec)
    version = spec.get("version")
    # A version seen with other content is not recorded again: the history keeps the first.
    if verdict.ready and isinstance(version, str):
        versions = versions_with(versions, version, digest)
    if not verdict.ready:  # nothing under it can go on: every run it governs is stuck because of it
        counts = PolicyRunCounts(stuck=counts.running + counts.waiting_for_approval + counts.stuck)
    true, false = ConditionStatus.TRUE, ConditionStatus.FALSE
    wanted = {
        READY: (true if verdict.ready else false, verdict.reason, verdict.message),
        STALLED: (false if verdict.ready else true, verdict.reason, "" if verdict.ready else verdict.message),
    }
    before = {c.get("type"): c for c in prior.get("conditions") or [] if isinstance(c, Mapping)}
    conditions = []
    for ctype, (status, reason, message) in wanted.items():
        old = before.get(ctype) or {}
        same = old.get("status") == status.value
        since = old.get("lastTransitionTime") if same and old.get("lastTransitionTime") else None
        condition = Condition(
            type=ctype,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=since or now,
            observed_generation=generation,
        ).wire()
        conditions.append(condition)
    status_out: dict[str, Any] = {
        "observedGeneration": generation,
        "contentDigest": digest,
        "versions": [v.wire() for v in versions],
        "conditions": conditions,
        "runs": counts.wire(),
    }
    return None if _same(prior, status_out) else status_out


def _records(raw: Any) -> list[PolicyVersionRecord]:
    out = []
    for item in raw if isinstance(raw, list) else []:
        try:
            out.append(PolicyVersionRecord.model_validate(item))
        except ValidationError:
            continue  # a hand-written entry that does not parse is not history
    return out


def _same(prior: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Equal but for the conditions' lastTransitionTime spelling (the server's, second precision)."""

    def strip(status: Mapping[str, Any]) -> dict[str, Any]:
        conditions = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}
            for c in status.get("conditions") or []
            if isinstance(c, Mapping)
        ]
        return {**{k: v for k, v in status.items() if k != "conditions"}, "conditions": conditions}

    return strip(prior) == strip(wanted)
