"""The run state machine: states, events and the one transition table.

Everything that moves an AgentRun goes through :func:`transition`. An event the table does not
allow raises :class:`IllegalTransition`; it is never a silent no-op. This module is pure: no
Kubernetes, no I/O, no clock. Whether a worker is active is the Lease's business, not a state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from durable_agents.api.v1alpha1.states import NON_TERMINAL_STATES, WAITING_STATES, RunState


class RunEvent(StrEnum):
    """What happened. Timeout, cancellation and failure are distinct events on purpose."""

    ACCEPTED = "accepted"  # spec validated
    REJECTED = "rejected"  # spec invalid: nothing can run
    STEP_COMPLETED = "step_completed"  # bounded work done, still eligible for more
    INPUT_REQUESTED = "input_requested"
    APPROVAL_REQUESTED = "approval_requested"
    EXTERNAL_AWAITED = "external_awaited"  # external event, child run, or an action's outcome
    RETRY_SCHEDULED = "retry_scheduled"
    INPUT_RECEIVED = "input_received"
    APPROVAL_DECIDED = "approval_decided"
    EXTERNAL_RECEIVED = "external_received"
    RETRY_DUE = "retry_due"
    WAIT_EXPIRED = "wait_expired"  # a waiting state's expiry passed
    REVALIDATION_REQUIRED = "revalidation_required"  # upgrade, policy or configuration change
    REVALIDATED = "revalidated"  # material facts still hold
    REFRESH_REQUIRED = "refresh_required"  # evidence changed: gather it again
    REAPPROVAL_REQUIRED = "reapproval_required"  # approval no longer binds the action
    SUCCEEDED = "succeeded"
    ATTEMPT_FAILED = "attempt_failed"  # a defined attempt cannot continue
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCEL_REQUESTED = "cancel_requested"
    CANCEL_FINISHED = "cancel_finished"  # in-flight effects reconciled
    CANCEL_RECORDED = "cancel_recorded"  # narrower scope noted; in-flight work reconciles first
    STEP_CANCELED = "step_canceled"  # the current step abandoned (turn/tool-call scope)
    QUARANTINE = "quarantine"  # checkpoint unreadable, unknown schema, undecryptable
    RELEASE_QUARANTINE = "release_quarantine"  # operator retries after an upgrade


S = RunState
E = RunEvent


_WAIT_EXITS: dict[RunState, RunEvent] = {
    S.WAITING_INPUT: E.INPUT_RECEIVED,
    S.WAITING_APPROVAL: E.APPROVAL_DECIDED,
    S.WAITING_EXTERNAL: E.EXTERNAL_RECEIVED,
    S.WAITING_RETRY: E.RETRY_DUE,
}


def _table() -> dict[tuple[RunState, RunEvent], RunState]:
    t: dict[tuple[RunState, RunEvent], RunState] = {
        (S.PENDING, E.ACCEPTED): S.READY,
        (S.PENDING, E.REJECTED): S.FAILED,
        (S.READY, E.STEP_COMPLETED): S.READY,
        (S.READY, E.INPUT_REQUESTED): S.WAITING_INPUT,
        (S.READY, E.APPROVAL_REQUESTED): S.WAITING_APPROVAL,
        (S.READY, E.EXTERNAL_AWAITED): S.WAITING_EXTERNAL,
        (S.READY, E.RETRY_SCHEDULED): S.WAITING_RETRY,
        (S.READY, E.SUCCEEDED): S.COMPLETED,
        (S.READY, E.ATTEMPT_FAILED): S.FAILED,
        (S.READY, E.REVALIDATION_REQUIRED): S.RESUME_VALIDATION,
        (S.RESUME_VALIDATION, E.REVALIDATED): S.READY,
        (S.RESUME_VALIDATION, E.REFRESH_REQUIRED): S.READY,
        (S.RESUME_VALIDATION, E.REAPPROVAL_REQUIRED): S.WAITING_APPROVAL,
        (S.RESUME_VALIDATION, E.ATTEMPT_FAILED): S.FAILED,
        (S.RESUME_VALIDATION, E.RETRY_SCHEDULED): S.WAITING_RETRY,
        # Released from quarantine with a wait recorded in the checkpoint: back into that wait.
        (S.RESUME_VALIDATION, E.INPUT_REQUESTED): S.WAITING_INPUT,
        (S.RESUME_VALIDATION, E.EXTERNAL_AWAITED): S.WAITING_EXTERNAL,
        (S.CANCEL_REQUESTED, E.CANCEL_FINISHED): S.CANCELED,
        (S.QUARANTINED, E.RELEASE_QUARANTINE): S.RESUME_VALIDATION,
    }
    for waiting, leave in _WAIT_EXITS.items():
        # Leaving any wait goes through resume validation: facts may have changed meanwhile.
        t[(waiting, leave)] = S.RESUME_VALIDATION
        t[(waiting, E.WAIT_EXPIRED)] = S.EXPIRED
        t[(waiting, E.REVALIDATION_REQUIRED)] = S.RESUME_VALIDATION
        t[(waiting, E.STEP_CANCELED)] = S.RESUME_VALIDATION
    t[(S.READY, E.STEP_CANCELED)] = S.READY
    for state in (S.READY, S.RESUME_VALIDATION, *WAITING_STATES):
        t[(state, E.CANCEL_RECORDED)] = state
    for state in NON_TERMINAL_STATES:
        t[(state, E.DEADLINE_EXCEEDED)] = S.EXPIRED
        t[(state, E.QUARANTINE)] = S.QUARANTINED
        if state is not S.CANCEL_REQUESTED:
            t[(state, E.CANCEL_REQUESTED)] = S.CANCEL_REQUESTED
    # A quarantined checkpoint is untouched until someone acts: only release or cancel leave it.
    del t[(S.QUARANTINED, E.DEADLINE_EXCEEDED)]
    del t[(S.QUARANTINED, E.QUARANTINE)]
    return t


TRANSITIONS: dict[tuple[RunState, RunEvent], RunState] = _table()


class IllegalTransition(Exception):
    """The table has no row for (state, event)."""

    def __init__(self, state: RunState, event: RunEvent) -> None:
        super().__init__(f"event {event.value!r} is not allowed in state {state.value!r}")
        self.state = state
        self.event = event


@dataclass(frozen=True, slots=True)
class Position:
    """Where a run stands: its state and the version that every commit increments by one."""

    state: RunState
    state_version: int = 0


def next_state(state: RunState, event: RunEvent) -> RunState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(state, event) from None


def transition(position: Position, event: RunEvent) -> Position:
    """The next position (state version + 1), or :class:`IllegalTransition`."""
    return Position(next_state(position.state, event), position.state_version + 1)


def allowed_events(state: RunState) -> frozenset[RunEvent]:
    return frozenset(e for (s, e) in TRANSITIONS if s is state)
