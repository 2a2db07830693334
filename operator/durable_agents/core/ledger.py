"""The action ledger's pure rules: idempotency keys, record names, and the dispatch state machine.

An effect is an ActionRecord whose name derives from a stable idempotency key, so a second
intent for the same step is refused by the API server (``AlreadyExists``): the ledger
deduplicates by construction. The dispatch states move only along :data:`ACTION_TRANSITIONS`;
:func:`next_dispatch_step` says what a dispatcher may do with a record now. No I/O here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from durable_agents.api.v1alpha1 import (
    ActionInput,
    ActionRecordStatus,
    ActionState,
    FirstClaim,
    ResolvedReference,
)

ACTION_TRANSITIONS: dict[ActionState, frozenset[ActionState]] = {
    # From intent straight to an answer only under a first claim (its holder sends without a
    # claim write), or to outcome_unknown once that first claim expired unanswered.
    ActionState.INTENT: frozenset(
        {
            ActionState.DISPATCHING,
            ActionState.CANCELED,
            ActionState.SUCCEEDED,
            ActionState.FAILED,
            ActionState.OUTCOME_UNKNOWN,
            ActionState.INPUT_REQUIRED,
        }
    ),
    # A dispatch ends in a definite answer, in not knowing (a timeout is never a failure), or in
    # the system asking for a person's input first (nothing applied).
    ActionState.DISPATCHING: frozenset(
        {ActionState.SUCCEEDED, ActionState.FAILED, ActionState.OUTCOME_UNKNOWN, ActionState.INPUT_REQUIRED}
    ),
    # Answered: sent again with the answers (same key); unanswered (its run ended), or past the
    # rounds allowed: failed, nothing applied; canceled with its run.
    # Asked while the call was held open (2025-11-25): answered, it is dispatching again; lost
    # (the sender restarted), its outcome is unknown.
    ActionState.INPUT_REQUIRED: frozenset(
        {ActionState.DISPATCHING, ActionState.FAILED, ActionState.CANCELED, ActionState.OUTCOME_UNKNOWN}
    ),
    # Only the authoritative system's "it did not happen" allows another dispatch (same key).
    ActionState.OUTCOME_UNKNOWN: frozenset({ActionState.SUCCEEDED, ActionState.DISPATCHING}),
    ActionState.SUCCEEDED: frozenset(),
    ActionState.FAILED: frozenset(),
    ActionState.CANCELED: frozenset(),
}
TERMINAL_ACTION_STATES = frozenset(state for state, targets in ACTION_TRANSITIONS.items() if not targets)


class IllegalActionTransition(Exception):
    def __init__(self, state: ActionState, target: ActionState) -> None:
        super().__init__(f"an action cannot go from {state.value!r} to {target.value!r}")


def check_action_transition(state: ActionState, target: ActionState) -> None:
    if target not in ACTION_TRANSITIONS[state]:
        raise IllegalActionTransition(state, target)


def idempotency_key(run_uid: str, step_index: int, step_name: str, attempt: int = 0) -> str:
    """Stable across crashes and operator versions: the run, the step it serves, and the attempt.

    Attempt 0 keeps the original form, so keys of runs started before retries existed are unchanged.
    """
    key = f"{run_uid}/{step_index}/{step_name}"
    return key if attempt == 0 else f"{key}/attempt-{attempt}"


def action_record_name(key: str) -> str:
    return "act-" + hashlib.sha256(key.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Claim:
    """Take the record for dispatching (a compare-and-swap on its status)."""


@dataclass(frozen=True)
class SendFirst:
    """This process holds the record's first claim, still valid: send without a claim write."""


@dataclass(frozen=True)
class GiveUpClaim:
    """A claim expired mid-dispatch: whether the effect happened is unknown now."""


@dataclass(frozen=True)
class Query:
    """Ask the authoritative system by idempotency key before anything is retried."""


@dataclass(frozen=True)
class PollTask:
    """The server answered the call with a task (``status.task``): ask the server about the
    task (never send the call again) once ``at`` has come."""

    at: datetime


@dataclass(frozen=True)
class AwaitInput:
    """The system asked for input (``status.input``): send again once its run holds every answer."""


@dataclass(frozen=True)
class WaitUntil:
    at: datetime | None


DispatchStep = Claim | SendFirst | GiveUpClaim | Query | PollTask | AwaitInput | WaitUntil

TASK_POLL_MIN = 1.0
TASK_POLL_MAX = 30.0


def task_poll_delay(polls: int, suggested_ms: int | None) -> timedelta:
    """How long after the last poll of a task to poll it again: the server's suggested interval
    (never under a second), doubled every few polls up to :data:`TASK_POLL_MAX` seconds."""
    base = min(TASK_POLL_MAX, max(TASK_POLL_MIN, (suggested_ms or 0) / 1000.0))
    return timedelta(seconds=min(TASK_POLL_MAX, base * 2 ** min(polls // 5, 10)))


def task_poll_at(status: ActionRecordStatus) -> datetime | None:
    """When the task of ``status`` is to be polled next (None: it has no task to poll)."""
    task = status.task
    if task is None or status.state not in (ActionState.INTENT, ActionState.DISPATCHING):
        return None
    if task.polled_at is None:
        return task.created_at
    return task.polled_at + task_poll_delay(task.polls, task.poll_interval_ms)


def next_dispatch_step(
    status: ActionRecordStatus, now: datetime, first_claim: FirstClaim | None = None, me: str | None = None
) -> DispatchStep:
    """What the dispatcher ``me`` may do with a record now. An intent under a first claim is its
    holder's to send until the claim expires; after that a send may have happened, so it is
    given up to ``outcome_unknown`` and the authoritative system is asked before any send."""
    state = status.state
    poll_at = task_poll_at(status)
    if poll_at is not None:  # the call was answered with a task: polled, whoever's claim it was
        return PollTask(poll_at)
    if state is ActionState.INTENT:
        if first_claim is None:
            return Claim()
        if now >= first_claim.expires_at:
            return GiveUpClaim()
        return (
            SendFirst() if me is not None and first_claim.holder == me else WaitUntil(first_claim.expires_at)
        )
    if state is ActionState.DISPATCHING:
        expires = status.claim_expires_at
        if expires is None or now >= expires:
            return GiveUpClaim()
        return WaitUntil(expires)
    if state is ActionState.OUTCOME_UNKNOWN:
        return Query()
    if state is ActionState.INPUT_REQUIRED:
        if status.input is not None and status.input.held_open:  # its sender holds the call open
            expires = status.claim_expires_at
            return GiveUpClaim() if expires is None or now >= expires else WaitUntil(expires)
        return AwaitInput()
    return WaitUntil(None)


def query_backoff(queries: int, base: float = 1.0, cap: float = 60.0) -> timedelta:
    """How long to wait before asking again after an answer that was itself unknown."""
    return timedelta(seconds=min(cap, base * 2 ** min(queries, 10)))


def next_status(
    status: ActionRecordStatus,
    state: ActionState,
    now: datetime,
    identity: str,
    claim_ttl: timedelta,
    *,
    claim: bool = False,
    first: bool = False,
    queried: bool = False,
    outcome: dict[str, Any] | None = None,
    reason: str | None = None,
    message: str | None = None,
    references: list[ResolvedReference] | None = None,
    asked: ActionInput | None = None,
    claim_until: datetime | None = None,
) -> ActionRecordStatus:
    """The status a dispatcher ``identity`` writes over ``status`` (as believed) to move it to
    ``state``: ``claim`` takes it for a send, ``first`` records a send under a first claim with its
    answer, ``queried`` counts a question to the authoritative system, ``asked`` is the round of
    input an ``input_required`` records (kept through its retry, for the next round's number),
    ``claim_until`` the claim of a call held open while a person answers."""
    if state is not status.state:
        check_action_transition(status.state, state)
    update: dict[str, Any] = {"state": state, "reason": reason, "message": message}
    if claim:
        update |= {
            "task": None,  # a new attempt: an earlier attempt's task is no longer waited on
            "attempts": status.attempts + 1,
            "claimed_by": identity,
            "claim_expires_at": now + claim_ttl,
            "last_attempt_at": now,
            "first_dispatched_at": status.first_dispatched_at or now,
        }
    if first:  # sent under the first claim: the attempt is recorded with its answer
        update |= {
            "attempts": status.attempts + 1,
            "claimed_by": identity,
            "last_attempt_at": now,
            "first_dispatched_at": status.first_dispatched_at or now,
        }
    if queried:
        update["queries"] = status.queries + 1
    if references is not None:
        update["resolved_references"] = references
    if asked is not None:
        update["input"] = asked
    if state is ActionState.INPUT_REQUIRED:  # nobody is sending it: no claim holds it
        update["claim_expires_at"] = None
    if claim_until is not None:  # a call held open: its sender's claim lasts as long as the hold
        update["claim_expires_at"] = claim_until
    if state is ActionState.OUTCOME_UNKNOWN:
        update["outcome_unknown_since"] = status.outcome_unknown_since or now
        update["claim_expires_at"] = None
    if state in (ActionState.SUCCEEDED, ActionState.FAILED, ActionState.CANCELED):
        update |= {"finished_at": now, "claim_expires_at": None, "outcome": outcome}
    update["progress"] = None  # an attempt's progress ends with any write of its state
    return status.model_copy(update=update)
