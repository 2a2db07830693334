"""A policy's integrity and its deletion: pure rules, no I/O.

A policy's identity is (name, version, content digest, :func:`content_digest`). One version
names one content, for ever: a change of rules under an unchanged ``spec.version``, or an old
version brought back with other rules, would make every run that recorded the version record
something that no longer says what governed it. The history a policy carries is its
``status.versions`` (``{version, contentDigest}``, newest last, at most :data:`MAX_HISTORY`,
written by the operator); the admission webhook refuses such a change (first line) and the
operator's policy cache refuses to use such a policy (second line: its runs wait).

A policy that non-terminal runs use cannot be deleted (:func:`deletion_refusal`) unless an
on-call person with the custom verb ``force-delete`` marked it first with the annotation
:data:`FORCE_DELETE` (its value: the reason); its runs are then quarantined ``PolicyDeleted``,
never acted on without a policy. Like the on-call controls on runs, the mark is stamped by the
admission webhook (who, when, ``Purpose.CONTROL`` over the policy's UID and the reason,
:func:`force_stamps`); the operator quarantines runs only for a mark whose stamp verifies
(:func:`force_unproven`): a mark written with the webhook off leaves the runs waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.authority import Unproven, unproven
from durable_agents.core.policy_identity import content_digest
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp

MAX_HISTORY: Final = 32
"""Entries of ``status.versions`` a policy keeps (the newest)."""
FORCE_DELETE: Final = "durable-agents.io/force-delete"
"""The annotation that lets a policy in use be deleted; its value is the on-call's reason."""
FORCE_DELETE_BY: Final = "durable-agents.io/force-delete-by"
FORCE_DELETE_AT: Final = "durable-agents.io/force-delete-at"
FORCE_DELETE_STAMP: Final = "durable-agents.io/force-delete-stamp"
STAMPED_MARKS: Final = (FORCE_DELETE_BY, FORCE_DELETE_AT, FORCE_DELETE_STAMP)
"""Written by the admission webhook beside :data:`FORCE_DELETE`: who marked it, when, the stamp."""
FORCE_DELETE_VERB: Final = "force-delete"
"""The custom verb on ``agentpolicies`` needed to set (or change) :data:`FORCE_DELETE`."""
POLICY_DELETED: Final = "PolicyDeleted"
"""The quarantine reason of a run whose policy was force-deleted."""
VERSION_CONFLICT: Final = "PolicyVersionConflict"
"""The Event reason of a run waiting because its policy reuses a version with other content."""
NAMED_RUNS: Final = 10
"""Runs a refused deletion names (and the total)."""


@dataclass(frozen=True)
class Identity:
    """What a policy object says it is: its version label and the digest of its rules."""

    version: str
    digest: str


def identity_of(policy: Mapping[str, Any] | None) -> Identity | None:
    """The identity of an AgentPolicy object (wire form), or None without a spec."""
    spec = (policy or {}).get("spec")
    if not isinstance(spec, Mapping):
        return None
    return Identity(version=str(spec.get("version") or ""), digest=content_digest(spec))


def history_of(policy: Mapping[str, Any] | None) -> dict[str, str]:
    """The versions a policy object has carried (version -> content digest): its
    ``status.versions``, or, when it has none (no operator wrote it yet), its own identity."""
    status = (policy or {}).get("status")
    entries = status.get("versions") if isinstance(status, Mapping) else None
    history: dict[str, str] = {}
    if isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, Mapping) and entry.get("version") and entry.get("contentDigest"):
                history[str(entry["version"])] = str(entry["contentDigest"])
    if not history:
        own = identity_of(policy)
        if own is not None:
            history[own.version] = own.digest
    return history


def version_conflict(name: str, new: Identity, *histories: Mapping[str, str]) -> str | None:
    """Why ``new`` may not be (used as) the policy ``name``: its version was seen with another
    content digest in one of ``histories``; None when it may."""
    for history in histories:
        seen = history.get(new.version)
        if seen is not None and seen != new.digest:
            return (
                f"spec.version: AgentPolicy {name!r} version {new.version!r} already names other "
                f"content (digest {seen[:19]}, this one {new.digest[:19]}): a change of rules needs "
                "a new spec.version, and an old version is never reused with other rules"
            )
    return None


def with_version(history: list[dict[str, str]], new: Identity) -> list[dict[str, str]]:
    """``status.versions`` after ``new`` is seen (newest last, at most :data:`MAX_HISTORY`, one
    entry per version). A version listed with another digest stays as first recorded: a conflict
    is never written over (the policy is not used; its history keeps the evidence)."""
    if any(e.get("version") == new.version and e.get("contentDigest") != new.digest for e in history):
        return history
    entry = {"version": new.version, "contentDigest": new.digest}
    return [*(e for e in history if e.get("version") != new.version), entry][-MAX_HISTORY:]


def policy_refs(run: Mapping[str, Any]) -> set[str]:
    """The AgentPolicies (by name, in the run's namespace) a run uses: its ``spec.policyRef``.
    (The policy resolved at acceptance, once recorded in the checkpoint, belongs here too.)"""
    spec = run.get("spec")
    ref = spec.get("policyRef") if isinstance(spec, Mapping) else None
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return {str(name)} if name else set()


def live(run: Mapping[str, Any]) -> bool:
    """Whether a run (wire form) has not ended: a run without a state yet has not; one being
    deleted has (it is going: without its policy it waits, it never acts)."""
    if (run.get("metadata") or {}).get("deletionTimestamp"):
        return False
    status = run.get("status")
    state = status.get("state") if isinstance(status, Mapping) else None
    try:
        return not RunState(str(state)).terminal if state else True
    except ValueError:
        return True  # a state this operator does not know: assume it may still act


def runs_using(
    runs: Iterable[Mapping[str, Any]],
    policy: str,
    governed: Callable[[Mapping[str, Any]], bool] | None = None,
) -> list[str]:
    """The names of the non-terminal runs that use ``policy`` (sorted): those naming it, and those
    ``governed`` says it governs (by default, or as recorded at acceptance)."""
    return sorted(
        str((run.get("metadata") or {}).get("name") or "")
        for run in runs
        if live(run) and (policy in policy_refs(run) or (governed is not None and governed(run)))
    )


def deletion_refusal(
    namespace: str,
    policy: str,
    users: list[str],
    *,
    kind: str = "AgentPolicy",
    plural: str = "agentpolicies",
    then: str = "quarantine them",
) -> str | None:
    """Why the policy (or another object runs depend on: ``kind``, ``plural``) may not be deleted
    while ``users`` (non-terminal runs) use it, or None; ``then``: what a forced deletion does."""
    if not users:
        return None
    named = ", ".join(users[:NAMED_RUNS])
    more = f" and {len(users) - NAMED_RUNS} more" if len(users) > NAMED_RUNS else ""
    return (
        f"{kind} {namespace}/{policy} is used by {len(users)} run(s) that have not ended: "
        f"{named}{more}; delete it once they end, or (on call) annotate it {FORCE_DELETE}=<reason> "
        f"(verb {FORCE_DELETE_VERB!r} on {plural}) to delete it and {then}"
    )


def annotation(policy: Mapping[str, Any] | None, key: str) -> str | None:
    notes = ((policy or {}).get("metadata") or {}).get("annotations") or {}
    value = notes.get(key) if isinstance(notes, Mapping) else None
    return str(value) if value else None


def force_reason(policy: Mapping[str, Any] | None) -> str | None:
    """The reason of a policy's force-delete mark, or None when it carries none."""
    return annotation(policy, FORCE_DELETE)


def force_proof(policy: Mapping[str, Any], by: str | None, at: str | None) -> dict[str, Any] | None:
    """What the stamp of a policy's force-delete mark covers; None without a reason, who or when."""
    meta = policy.get("metadata") or {}
    reason = force_reason(policy)
    if reason is None or not by or not at:
        return None
    return {
        "control": "forceDeletePolicy",  # the purpose is shared with other controls: never one of theirs
        "namespace": str(meta.get("namespace") or ""),
        "policy": str(meta.get("name") or ""),
        "uid": str(meta.get("uid") or ""),
        "reason": reason,
        "requestedBy": by,
        "requestedAt": at,
    }


def force_stamps(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, username: str, at: str, keyring: Keyring
) -> dict[str, str | None]:
    """The annotations the mutating webhook writes: who marked the policy, when, and the stamp,
    for a new (or changed) mark; their removal with the mark; nothing otherwise."""
    reason = force_reason(new)
    if reason is None:
        return {key: None for key in STAMPED_MARKS if annotation(new, key) is not None}
    if reason == force_reason(old):
        return {}
    covered = force_proof(new, username, at)
    assert covered is not None  # a reason, who and when
    return {
        FORCE_DELETE_BY: username,
        FORCE_DELETE_AT: at,
        FORCE_DELETE_STAMP: stamp(keyring, Purpose.CONTROL, covered),
    }


def force_unproven(keyring: Keyring | None, policy: Mapping[str, Any]) -> Unproven | None:
    """None if the policy's force-delete mark carries the webhook's stamp; else why not."""
    proof = force_proof(policy, annotation(policy, FORCE_DELETE_BY), annotation(policy, FORCE_DELETE_AT))
    name = ((policy.get("metadata") or {}).get("name")) or ""
    what = f"the force-delete mark of AgentPolicy {name!r}"
    return unproven(keyring, Purpose.CONTROL, proof, annotation(policy, FORCE_DELETE_STAMP), what)


def deleted_message(policy: str, reason: str) -> str:
    """The quarantine message of a run whose policy was force-deleted."""
    return (
        f"its AgentPolicy {policy!r} was force-deleted ({reason}): nothing runs without it; "
        "cancel the run, or re-create the policy and retry it (spec.retryQuarantine)"
    )
