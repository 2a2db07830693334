"""The outcome stamp: proof that the operator wrote an ActionRecord's status, not someone with
``actionrecords/status``.

The ledger's status decides what a run does: ``succeeded`` with its outcome is taken in as the
effect's authoritative answer, ``failed`` fails the step, a ``dispatching`` claim keeps every
dispatcher waiting until it expires, a settled state lets retention delete the run. Every status
write of the operator (one chokepoint: the ActionStore's commit) therefore stamps, in
``status.stamp`` (purpose ``OUTCOME``), the record's name and idempotency key, its state, attempts,
claim expiry, the digest of its outcome and its reason.

What is believed (:func:`believed`), for every reader:

- an ``intent`` (or no status: the record as created) needs no stamp: nothing was decided yet, and
  the dispatcher asks the authoritative system by key before its first send anyway;
- a settled state (``succeeded``, ``failed``, ``canceled``) or ``outcome_unknown`` whose stamp does
  not verify is believed as ``outcome_unknown`` (reason ``IntegrityFailed``): the dispatcher asks
  the authoritative system by key (applied: ``succeeded``; not applied: sent again with the same
  key; no query: a person reconciles) and writes a stamped status; the run waits meanwhile;
- an unverified ``dispatching`` is believed while its claim ends within one claim TTL (a
  dispatcher of an earlier release in a rolling upgrade may be sending: it expires soon and is
  reconciled as any expired claim); a claim reaching further is believed ``outcome_unknown``.

Records created before outcome stamps existed carry no ``spec.statusStamped`` (the spec is
immutable, and a status write cannot change it): their unstamped statuses are believed as written,
as before, so an upgrade neither asks every settled action again nor turns the settled call of an
MCP tool without a query tool into one a person must reconcile. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import ActionRecordSpec, ActionRecordStatus, ActionState
from durable_agents.core.digest import canonical_digest
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp, verify

INTEGRITY_FAILED = "IntegrityFailed"
DEFAULT_CLAIM_TTL = timedelta(seconds=11)
"""A claim's TTL with the default dispatch timeout (5 s: twice that, plus one), for readers that
are not a dispatcher (the dispatcher uses its own configured TTL)."""
_STAMPED = (
    ActionState.SUCCEEDED,
    ActionState.FAILED,
    ActionState.CANCELED,
    ActionState.OUTCOME_UNKNOWN,
    ActionState.INPUT_REQUIRED,
)


def _time(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


def outcome_payload(name: str, key: str, status: ActionRecordStatus) -> dict[str, Any]:
    """What an outcome stamp covers."""
    payload: dict[str, Any] = {
        "kind": "ActionOutcome",
        "record": name,
        "idempotencyKey": key,
        "state": status.state.value,
        "attempts": status.attempts,
        "claimExpiresAt": _time(status.claim_expires_at),
        "outcome": canonical_digest(status.outcome) if status.outcome is not None else None,
        "reason": status.reason,
    }
    if status.task is not None:  # only then: the stamps of records without a task are unchanged
        payload["task"] = {"id": status.task.id, "server": status.task.server}
        if status.task.protocol is not None:  # only then: the stamps of earlier tasks are unchanged
            payload["task"] |= {"protocol": status.task.protocol, "session": status.task.session}
    if status.input is not None:  # only then, likewise: what is asked and echoed is the operator's
        payload["input"] = canonical_digest(status.input.model_dump(mode="json", by_alias=True))
    return payload


def stamp_outcome(keyring: Keyring, name: str, key: str, status: ActionRecordStatus) -> str:
    return stamp(keyring, Purpose.OUTCOME, outcome_payload(name, key, status))


def outcome_verifies(keyring: Keyring | None, name: str, key: str, status: ActionRecordStatus) -> bool:
    return verify(keyring, Purpose.OUTCOME, outcome_payload(name, key, status), status.stamp)


@dataclass(frozen=True)
class Belief:
    """The status to act on, and why it is not the one written (None: it is)."""

    status: ActionRecordStatus
    forged: str | None = None


def _unknown(status: ActionRecordStatus, why: str) -> Belief:
    message = f"{why}: not written by the operator, so not believed; the authoritative system is asked by key"
    believed = ActionRecordStatus(
        state=ActionState.OUTCOME_UNKNOWN,
        attempts=status.attempts,
        queries=status.queries,
        claimed_by=status.claimed_by,
        first_dispatched_at=status.first_dispatched_at,
        last_attempt_at=status.last_attempt_at,
        outcome_unknown_since=status.outcome_unknown_since,
        reason=INTEGRITY_FAILED,
        message=message[:4096],
    )
    return Belief(believed, message)


def believed(
    record: Mapping[str, Any],
    keyring: Keyring | None,
    now: datetime,
    claim_ttl: timedelta = DEFAULT_CLAIM_TTL,
) -> Belief:
    """What to believe of ``record``'s status (an ActionRecord as the API returns it): see the
    module docstring. Without a keyring (tests only) everything is believed."""
    name = str((record.get("metadata") or {}).get("name") or "")
    raw_spec = record.get("spec") or {}
    try:
        status = ActionRecordStatus.model_validate(record.get("status") or {})
    except ValidationError as err:
        return _unknown(ActionRecordStatus(), f"its status does not parse ({err.error_count()} errors)")
    try:
        spec = ActionRecordSpec.model_validate(raw_spec)
    except ValidationError:
        return Belief(status)  # not an intent of this operator's: the dispatcher refuses it
    # An intent needs no stamp, unless it carries a task: the task ID decides what is polled and
    # whose result is taken, so one written by someone else is not believed.
    unstamped_ok = status.state is ActionState.INTENT and status.task is None
    if keyring is None or not spec.status_stamped or unstamped_ok:
        return Belief(status)
    if outcome_verifies(keyring, name, spec.idempotency_key, status):
        return Belief(status)
    claim = f"status {status.state.value!r}" + (f" ({status.reason})" if status.reason else "")
    if status.state in _STAMPED or status.task is not None:
        return _unknown(status, f"{claim} carries no outcome stamp that verifies")
    # dispatching: bounded by one claim TTL, it is at worst a wait of that long.
    expires = status.claim_expires_at
    if expires is not None and expires > now + claim_ttl:
        return _unknown(
            status, f"{claim} claimed until {_time(expires)} without an outcome stamp that verifies"
        )
    return Belief(status)


def believed_status(
    record: Mapping[str, Any],
    keyring: Keyring | None,
    now: datetime,
    claim_ttl: timedelta = DEFAULT_CLAIM_TTL,
) -> ActionRecordStatus:
    return believed(record, keyring, now, claim_ttl).status
