"""People's answers for actions whose outcome is unknown: what their stamps cover, and which answer
the operator may act on.

Some authoritative systems cannot be asked by idempotency key (an MCP tool has no standard
query): an action they were sent whose answer was lost stays ``outcome_unknown`` until a person
who can look (in the ticket system, the bank statement) says whether it happened, with
``kubectl agentrun reconcile RUN --action NAME --applied|--not-applied``: an entry of
``spec.reconciliations`` keyed by the ActionRecord's name (``NAME.ATTEMPT`` when that key is
taken, ``NAME.ATTEMPT.N`` when both are: the map is append-only, so a key once written stays).

Authority is as for an approval decision (:mod:`durable_agents.core.authority`): the admission
webhook overwrites ``reconciler`` and ``reconciledAt`` with the authenticated user and the time,
refuses the entry unless a SubjectAccessReview gives that user the run's policy approver verb,
and stamps it (``Purpose.CONTROL``, over run ID, key, record, attempt, answer, reason, who and
when). The dispatcher acts only on an entry whose stamp verifies and whose ``attempt`` is the
record's ``status.attempts`` now: so an answer is used once (a "not applied" sends the action
again, which makes a new attempt) and an entry written with the webhook off, or copied from
another run, counts for nothing: the run's worker refuses it once (``status.refusedRequests``,
:func:`reconciliation_to_refuse`), and it blocks nobody. As for an approval decision refused
(which makes the run ask again under a new request ID), only an entry whose stamp verifies has
answered for an attempt: a person with the verb answers under the next free key. Pure: no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import ActionState, Identity, Reconciliation
from durable_agents.core.authority import NO_KEYRING, Unproven, instant, unproven
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp

FIELD = "reconciliations"
KIND = "Reconciliation"  # in the proof: the purpose is shared with cancellations and retries


def record_of(key: str) -> str:
    """The ActionRecord a ``spec.reconciliations`` key names (``NAME`` or ``NAME.ATTEMPT``)."""
    return key.split(".", 1)[0]


def keys_of(record: str, attempt: int) -> Iterator[str]:
    """The keys an answer for ``record`` at ``attempt`` may be written under, in the order they
    are used: ``NAME``, ``NAME.ATTEMPT``, then ``NAME.ATTEMPT.2``, ``.3``, ... (an entry written
    by hand, which answers for nothing, must not take the last key a person could use)."""
    yield record
    yield f"{record}.{attempt}"
    yield from (f"{record}.{attempt}.{n}" for n in itertools.count(2))


def is_key_of(key: str, record: str, attempt: int) -> bool:
    """Whether ``key`` is one of :func:`keys_of` ``record`` at ``attempt``."""
    if key in (record, f"{record}.{attempt}"):
        return True
    prefix = f"{record}.{attempt}."
    n = key[len(prefix) :] if key.startswith(prefix) else ""
    return n.isascii() and n.isdigit() and not n.startswith("0") and int(n) >= 2


def key_for(record: str, attempt: int, taken: Mapping[str, Any]) -> str:
    """The key a new reconciliation of ``record`` at ``attempt`` is written under: the first of
    :func:`keys_of` not taken (the map holds at most a few dozen entries)."""
    return next(key for key in keys_of(record, attempt) if key not in taken)


def run_id_of(run: Mapping[str, Any] | None) -> str:
    """The run ID stamps are bound to: ``status.runId``, else the uid (as the webhook reads it)."""
    status = (run or {}).get("status")
    run_id = status.get("runId") if isinstance(status, Mapping) else None
    meta = (run or {}).get("metadata")
    return str(run_id or (meta.get("uid") if isinstance(meta, Mapping) else None) or "")


def reconciliation_proof(run_id: str, key: str, entry: Reconciliation) -> dict[str, Any] | None:
    """What a reconciliation's stamp covers; None while it names nobody, or no time."""
    if entry.reconciler is None or entry.reconciled_at is None:
        return None
    return {
        "kind": KIND,
        "runId": run_id,
        "key": key,
        "actionRecord": record_of(key),
        "attempt": entry.attempt,
        "applied": entry.applied,
        "reason": entry.reason,
        "reconciler": entry.reconciler.who().wire(),
        "reconciledAt": instant(entry.reconciled_at),
    }


def stamp_reconciliation(keyring: Keyring, run_id: str, key: str, entry: Reconciliation) -> str:
    proof = reconciliation_proof(run_id, key, entry)
    if proof is None:
        raise ValueError("a reconciliation names nobody to stamp")
    return stamp(keyring, Purpose.CONTROL, proof)


def reconciliation_unproven(
    keyring: Keyring | None, run_id: str, key: str, entry: Reconciliation
) -> Unproven | None:
    """Why this entry is not proven to be what the admission webhook admitted, or None. Never
    taken on trust without a keyring: it would mark an effect done, or send it again."""
    if keyring is None:
        return Unproven(NO_KEYRING, "this operator has no keyring: it cannot verify a reconciliation")
    proof = reconciliation_proof(run_id, key, entry)
    return unproven(keyring, Purpose.CONTROL, proof, entry.stamp, f"reconciliation {key!r}")


def stamped_entries(
    added: list[str], entries: Mapping[str, Any], user: Identity, at: str, run_id: str, keyring: Keyring
) -> dict[str, Any]:
    """The mutating webhook's overwrite of each new entry: the authenticated user, the time, the
    stamp (whatever the client wrote there is discarded; a client's ``uid`` never survives).
    An entry the schema will refuse anyway is left as it is."""
    out: dict[str, Any] = {}
    for key in added:
        entry = entries[key]
        if not isinstance(entry, Mapping):
            continue
        given = {**entry, "reconciler": {**user.wire(), "uid": user.uid}, "reconciledAt": at}
        try:
            parsed = Reconciliation.model_validate(given)
        except ValidationError:
            continue
        out[key] = {**given, "stamp": stamp_reconciliation(keyring, run_id, key, parsed)}
    return out


@dataclass(frozen=True)
class PersonAnswer:
    """A verified answer for a record: it was applied, or not, says ``by``."""

    key: str
    applied: bool
    by: str
    reason: str

    def said(self) -> str:
        answer = "applied" if self.applied else "not applied"
        why = f": {self.reason}" if self.reason else ""
        return f"reconciled as {answer} by {self.by!r} (spec.reconciliations[{self.key!r}]){why}"


@dataclass(frozen=True)
class Ignored:
    """An entry for this record and attempt that the operator does not act on, and why."""

    key: str
    problem: Unproven


def person_answer(
    run: Mapping[str, Any], record: str, attempt: int, keyring: Keyring | None
) -> tuple[PersonAnswer | None, list[Ignored]]:
    """The first entry (in key order) of ``run``'s ``spec.reconciliations`` for ``record`` at
    ``attempt`` whose stamp verifies, and the entries for it that do not verify.

    Entries for another record, or for an earlier attempt (already acted on, or overtaken by a
    send since), are not looked at.
    """
    spec = run.get("spec")
    entries = spec.get(FIELD) if isinstance(spec, Mapping) else None
    if not isinstance(entries, Mapping):
        return None, []
    run_id, ignored = run_id_of(run), []
    for key in sorted(str(k) for k in entries if record_of(str(k)) == record):
        try:
            entry = Reconciliation.model_validate(entries[key])
        except ValidationError as err:
            problem = Unproven("Invalid", f"reconciliation {key!r} cannot be read: {err}"[:512])
            ignored.append(Ignored(key, problem))
            continue
        if entry.attempt != attempt:
            continue
        found = reconciliation_unproven(keyring, run_id, key, entry)
        if found is not None:
            ignored.append(Ignored(key, found))
            continue
        by = entry.reconciler.username if entry.reconciler is not None else ""
        return PersonAnswer(key, entry.applied, by, entry.reason), ignored
    return None, ignored


def record_refusal(
    key: str,
    entry: Reconciliation,
    record: Mapping[str, Any] | None,
    run_name: str,
    taken: Mapping[str, Any],
    verified: Callable[[str, Any], bool],
) -> str | None:
    """Why a new entry cannot reconcile the ActionRecord it names (``record`` as read, None when
    there is none), or None: it must be this run's, its outcome unknown, at the attempt given,
    under one of its keys, and that attempt not answered for yet. ``verified(key, value)``: whether
    an entry already in ``taken`` carries a stamp that verifies; one that does not (written with
    the webhook off, or by hand) answered for nothing, and blocks nobody."""
    name = record_of(key)
    where = f"spec.reconciliations[{key!r}]"
    if record is None:
        return f"{where}: there is no ActionRecord {name!r} in this namespace"
    spec, status = record.get("spec") or {}, record.get("status") or {}
    owner = (spec.get("runRef") or {}).get("name")
    if owner != run_name:
        return f"{where}: ActionRecord {name!r} is an action of run {owner!r}, not of {run_name!r}"
    state, attempts = status.get("state") or ActionState.INTENT.value, int(status.get("attempts") or 0)
    if state != ActionState.OUTCOME_UNKNOWN.value:
        return (
            f"{where}: ActionRecord {name!r} is {state!r}: only an action whose outcome is unknown "
            "(outcome_unknown) is reconciled by a person"
        )
    if entry.attempt != attempts:
        return (
            f"{where}: it answers for attempt {entry.attempt}, but ActionRecord {name!r} is at attempt "
            f"{attempts} (it was sent again since): look again and answer for attempt {attempts}"
        )
    if not is_key_of(key, name, attempts):
        return (
            f"{where}: the key must be the ActionRecord's name {name!r} (or {name}.{attempts}, or "
            f"{name}.{attempts}.N when both are taken)"
        )
    for other, given in taken.items():
        if (
            record_of(str(other)) == name
            and isinstance(given, Mapping)
            and given.get("attempt") == attempts
            and verified(str(other), given)
        ):
            by = (given.get("reconciler") or {}).get("username")
            return f"{where}: attempt {attempts} of ActionRecord {name!r} was already reconciled by {by!r}"
    return None


def verifies(keyring: Keyring | None, run_id: str) -> Callable[[str, Any], bool]:
    """``verified`` for :func:`record_refusal`: an entry of this run whose stamp verifies."""

    def verified(key: str, value: Any) -> bool:
        try:
            entry = Reconciliation.model_validate(value)
        except ValidationError:
            return False
        return reconciliation_unproven(keyring, run_id, key, entry) is None

    return verified


def reconciliation_to_refuse(
    run_id: str,
    entries: Mapping[str, Reconciliation],
    refused: Callable[[str], bool],
    keyring: Keyring | None,
) -> tuple[str, Unproven] | None:
    """The first entry (in key order) whose stamp does not verify and that is not refused yet
    (``refused(key)``), and why: the run's worker records it in ``status.refusedRequests`` once."""
    for key in sorted(entries):
        if refused(key):
            continue
        problem = reconciliation_unproven(keyring, run_id, key, entries[key])
        if problem is not None:
            return key, problem
    return None


def reconciliation_entries(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = (obj or {}).get("spec")
    value = spec.get(FIELD) if isinstance(spec, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def added_reconciliations(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[str]:
    before = reconciliation_entries(old)
    return sorted(str(key) for key in reconciliation_entries(new) if key not in before)


def reconciliation_stamps(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, user: Identity, at: str, keyring: Keyring
) -> dict[str, Any]:
    """The merge into ``spec`` that stamps each new entry (empty when there is none)."""
    keys = added_reconciliations(new, old)
    if not keys:
        return {}
    stamped = stamped_entries(keys, reconciliation_entries(new), user, at, run_id_of(old), keyring)
    return {FIELD: stamped} if stamped else {}
