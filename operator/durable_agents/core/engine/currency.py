"""Whether what was decided under the run's policy still holds under the policy as it is now.

An approval is revalidated against the policy when the run leaves the wait. With transitions
batched into one status write, that revalidation and the intent it allows are decided from the
policy as the worker knew it, and written later; the policy may change in between. So the
decision is checked again at the two points that make it binding: right before the status write
that carries it (:func:`batch_outdated`, the worker; with :func:`evidence_outdated` for the
evidence an approved intent was revalidated against) and right before the effect is sent
(:func:`intent_outdated`, the dispatcher, which reads the policy fresh).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from durable_agents.api.v1alpha1 import ActionRecordSpec, AgentPolicySpec, ChangeResponse
from durable_agents.core.checkpoint import (
    Checkpoint,
    KubernetesEvidenceRef,
    Loaded,
    PendingAction,
    load_checkpoint,
)
from durable_agents.core.engine.decisions import Commit
from durable_agents.core.engine.snapshot import Settings
from durable_agents.core.statemachine import RunEvent

# Transitions whose meaning depends on the policy they were decided under: an approval's
# revalidation, and a request that names the policy version the approver is asked under.
_DECIDED_BY_POLICY = frozenset(
    {RunEvent.REVALIDATED, RunEvent.APPROVAL_REQUESTED, RunEvent.REAPPROVAL_REQUIRED}
)


def policy_moved(approved_under: str | None, settings: Settings) -> str | None:
    """Why an approval given under policy version ``approved_under`` no longer binds under
    ``settings``' policy (its version changed and the policy does not call that immaterial), or
    None. An unversioned policy never moves by version."""
    policy, current = settings.policy, settings.policy_version
    if policy is None or current is None or current == approved_under:
        return None
    if policy.freshness.policy_changed is ChangeResponse.IMMATERIAL:
        return None
    return f"policy changed from {approved_under} to {current}"


def rides_on_policy(commit: Commit) -> bool:
    """Whether writing ``commit`` makes a decision taken from the policy binding: it carries an
    intent (dispatched once written) or a revalidation or approval request."""
    return bool(commit.intents) or commit.event in _DECIDED_BY_POLICY


def batch_outdated(
    commits: Sequence[Commit],
    decided_under: Sequence[AgentPolicySpec | None],
    current: AgentPolicySpec | None,
    policy_name: str | None,
) -> str | None:
    """Why a batch of transitions must not be written as decided, or None.

    ``decided_under[i]`` is the policy ``commits[i]`` was decided from, ``current`` the policy as
    known right before the write. A batch that carries an intent, a revalidation or an approval
    request is written only if every transition in it was decided under the current policy (by
    content, not only its version: a tier may change without a new version); else it is thrown
    away like a refused write, and decided again from what is stored.
    """
    if policy_name is None or not any(rides_on_policy(commit) for commit in commits):
        return None
    for commit, policy in zip(commits, decided_under, strict=True):
        if policy is current or policy == current:
            continue
        then = "no policy" if policy is None else f"version {policy.version}"
        now = "deleted" if current is None else f"version {current.version}"
        return (
            f"{commit.event.value} was decided under AgentPolicy {policy_name!r} {then}; "
            f"before its write the policy is {now}"
        )
    return None


def evidence_to_recheck(commits: Sequence[Commit]) -> tuple[KubernetesEvidenceRef, ...]:
    """The evidence an approved intent in the batch was revalidated against (the Kubernetes
    evidence of the intent's checkpoint), to be read again right before the write; () when the
    batch carries no approved intent (nothing to read: the normal write costs no read)."""
    for commit in commits:
        if not commit.intents or commit.checkpoint is None:
            continue
        loaded = load_checkpoint(commit.checkpoint)
        if not isinstance(loaded, Loaded):
            continue
        cp, keys = loaded.checkpoint, {intent.idempotency_key for intent in commit.intents}
        if any(p.approval_request_id for p in cp.pending_actions if p.idempotency_key in keys):
            return tuple(ref for ref in cp.evidence if isinstance(ref, KubernetesEvidenceRef))
    return ()


def evidence_outdated(
    refs: Sequence[KubernetesEvidenceRef],
    fresh: Mapping[str, KubernetesEvidenceRef | None],
    policy: AgentPolicySpec | None,
) -> str | None:
    """Why a batch whose approved intent relied on ``refs`` must not be written now that they read
    as ``fresh`` (one changed or is gone, and the policy does not call that immaterial), or None.
    Decided again, the revalidation does what ``freshness.evidenceChanged`` says."""
    if policy is None or policy.freshness.evidence_changed is ChangeResponse.IMMATERIAL:
        return None
    changed = [
        ref
        for ref in refs
        if (now := fresh.get(ref.id)) is None
        or (now.resource_version, now.content_digest) != (ref.resource_version, ref.content_digest)
    ]
    if not changed:
        return None
    names = ", ".join(f"{ref.kind}/{ref.name}@{ref.resource_version}" for ref in changed)
    return f"evidence the approval was revalidated against changed before its write: {names}"


def intent_outdated(
    cp: Checkpoint, pending: PendingAction, intent: ActionRecordSpec, settings: Settings
) -> str | None:
    """Why the run's committed ``pending`` intent may not be sent under the policy as it is now
    (``settings``, read fresh), or None: the policy requires an approval for the intent's tier and
    the intent names none that is approved, or the approval it names was given under a policy
    version that no longer binds it."""
    policy = settings.policy
    if policy is None or intent.tier not in policy.approval_required_tiers:
        return None
    label = f"AgentPolicy {settings.policy_name!r}"
    record = next((a for a in cp.approvals if a.request_id == pending.approval_request_id), None)
    if record is None or record.decision != "approved":
        tier = intent.tier.value
        return f"{label} (version {settings.policy_version}) requires an approval for a {tier} effect"
    moved = policy_moved(record.policy_version, settings)
    if moved is not None:
        return f"approval {record.request_id} no longer binds: {moved} since it was approved"
    return None
