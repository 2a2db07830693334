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


_WAIT_EXITS: dict[RunState, RunEvent] = {
    RunState.WAITING_INPUT: RunEvent.INPUT_RECEIVED,
    RunState.WAITING_APPROVAL: RunEvent.APPROVAL_DECIDED,
    RunState.WAITING_EXTERNAL: RunEvent.EXTERNAL_RECEIVED,
    RunState.WAITING_RETRY: RunEvent.RETRY_DUE,
}


def _table() -> dict[tuple[RunState, RunEvent], RunState]:
    table: dict[tuple[RunState, RunEvent], RunState] = {
        (RunState.PENDING, RunEvent.ACCEPTED): RunState.READY,
        (RunState.PENDING, RunEvent.REJECTED): RunState.FAILED,
        (RunState.READY, RunEvent.STEP_COMPLETED): RunState.READY,
        (RunState.READY, RunEvent.INPUT_REQUESTED): RunState.WAITING_INPUT,
        # An action's system asks a person for input before it completes the call (nothing applied).
        (RunState.WAITING_EXTERNAL, RunEvent.INPUT_REQUESTED): RunState.WAITING_INPUT,
        (RunState.READY, RunEvent.APPROVAL_REQUESTED): RunState.WAITING_APPROVAL,
        (RunState.READY, RunEvent.EXTERNAL_AWAITED): RunState.WAITING_EXTERNAL,
        (RunState.READY, RunEvent.RETRY_SCHEDULED): RunState.WAITING_RETRY,
        (RunState.READY, RunEvent.SUCCEEDED): RunState.COMPLETED,
        (RunState.READY, RunEvent.ATTEMPT_FAILED): RunState.FAILED,
        (RunState.READY, RunEvent.REVALIDATION_REQUIRED): RunState.RESUME_VALIDATION,
        (RunState.RESUME_VALIDATION, RunEvent.REVALIDATED): RunState.READY,
        (RunState.RESUME_VALIDATION, RunEvent.REFRESH_REQUIRED): RunState.READY,
        (RunState.RESUME_VALIDATION, RunEvent.REAPPROVAL_REQUIRED): RunState.WAITING_APPROVAL,
        (RunState.RESUME_VALIDATION, RunEvent.ATTEMPT_FAILED): RunState.FAILED,
        (RunState.RESUME_VALIDATION, RunEvent.RETRY_SCHEDULED): RunState.WAITING_RETRY,
        # Released from quarantine with a wait recorded in the checkpoint: back into that wait.
        (RunState.RESUME_VALIDATION, RunEvent.INPUT_REQUESTED): RunState.WAITING_INPUT,
        (RunState.RESUME_VALIDATION, RunEvent.EXTERNAL_AWAITED): RunState.WAITING_EXTERNAL,
        (RunState.CANCEL_REQUESTED, RunEvent.CANCEL_FINISHED): RunState.CANCELED,
        (RunState.QUARANTINED, RunEvent.RELEASE_QUARANTINE): RunState.RESUME_VALIDATION,
    }
    for waiting, leave in _WAIT_EXITS.items():
        # Leaving any wait goes through resume validation: facts may have changed meanwhile.
        table[(waiting, leave)] = RunState.RESUME_VALIDATION
        table[(waiting, RunEvent.WAIT_EXPIRED)] = RunState.EXPIRED
        table[(waiting, RunEvent.REVALIDATION_REQUIRED)] = RunState.RESUME_VALIDATION
        table[(waiting, RunEvent.STEP_CANCELED)] = RunState.RESUME_VALIDATION
    table[(RunState.READY, RunEvent.STEP_CANCELED)] = RunState.READY
    for state in (RunState.READY, RunState.RESUME_VALIDATION, *WAITING_STATES):
        table[(state, RunEvent.CANCEL_RECORDED)] = state
    for state in NON_TERMINAL_STATES:
        table[(state, RunEvent.DEADLINE_EXCEEDED)] = RunState.EXPIRED
        table[(state, RunEvent.QUARANTINE)] = RunState.QUARANTINED
        if state is not RunState.CANCEL_REQUESTED:
            table[(state, RunEvent.CANCEL_REQUESTED)] = RunState.CANCEL_REQUESTED
    # A quarantined checkpoint is untouched until someone acts: only release or cancel leave it.
    del table[(RunState.QUARANTINED, RunEvent.DEADLINE_EXCEEDED)]
    del table[(RunState.QUARANTINED, RunEvent.QUARANTINE)]
    return table


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
    return frozenset(event for (source, event) in TRANSITIONS if source is state)
