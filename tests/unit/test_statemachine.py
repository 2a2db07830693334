"""The transition table: every allowed row, a sample of forbidden ones, and random walks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from durable_agents.api.v1alpha1.states import NON_TERMINAL_STATES, TERMINAL_STATES, WAITING_STATES, RunState
from durable_agents.core.statemachine import (
    TRANSITIONS,
    IllegalTransition,
    Position,
    RunEvent,
    allowed_events,
    next_state,
    transition,
)

pytestmark = pytest.mark.unit

S, E = RunState, RunEvent


# The expected table, written out longhand so a change to the generated table is noticed.
EXPECTED_ROWS: list[tuple[RunState, RunEvent, RunState]] = [
    (S.PENDING, E.ACCEPTED, S.READY),
    (S.PENDING, E.REJECTED, S.FAILED),
    (S.READY, E.STEP_COMPLETED, S.READY),
    (S.READY, E.INPUT_REQUESTED, S.WAITING_INPUT),
    (S.READY, E.APPROVAL_REQUESTED, S.WAITING_APPROVAL),
    (S.READY, E.EXTERNAL_AWAITED, S.WAITING_EXTERNAL),
    (S.READY, E.RETRY_SCHEDULED, S.WAITING_RETRY),
    (S.READY, E.SUCCEEDED, S.COMPLETED),
    (S.READY, E.ATTEMPT_FAILED, S.FAILED),
    (S.READY, E.REVALIDATION_REQUIRED, S.RESUME_VALIDATION),
    (S.WAITING_INPUT, E.INPUT_RECEIVED, S.RESUME_VALIDATION),
    (S.WAITING_APPROVAL, E.APPROVAL_DECIDED, S.RESUME_VALIDATION),
    (S.WAITING_EXTERNAL, E.EXTERNAL_RECEIVED, S.RESUME_VALIDATION),
    (S.WAITING_RETRY, E.RETRY_DUE, S.RESUME_VALIDATION),
    *[(w, E.WAIT_EXPIRED, S.EXPIRED) for w in sorted(WAITING_STATES)],
    *[(w, E.REVALIDATION_REQUIRED, S.RESUME_VALIDATION) for w in sorted(WAITING_STATES)],
    (S.RESUME_VALIDATION, E.REVALIDATED, S.READY),
    (S.RESUME_VALIDATION, E.REFRESH_REQUIRED, S.READY),
    (S.RESUME_VALIDATION, E.REAPPROVAL_REQUIRED, S.WAITING_APPROVAL),
    (S.RESUME_VALIDATION, E.ATTEMPT_FAILED, S.FAILED),
    (S.RESUME_VALIDATION, E.RETRY_SCHEDULED, S.WAITING_RETRY),
    (S.CANCEL_REQUESTED, E.CANCEL_FINISHED, S.CANCELED),
    (S.QUARANTINED, E.RELEASE_QUARANTINE, S.RESUME_VALIDATION),
    *[(s, E.DEADLINE_EXCEEDED, S.EXPIRED) for s in sorted(NON_TERMINAL_STATES - {S.QUARANTINED})],
    *[(s, E.QUARANTINE, S.QUARANTINED) for s in sorted(NON_TERMINAL_STATES - {S.QUARANTINED})],
    *[
        (s, E.CANCEL_REQUESTED, S.CANCEL_REQUESTED)
        for s in sorted(NON_TERMINAL_STATES - {S.CANCEL_REQUESTED})
    ],
    # Narrower cancellation scopes: noted in place, or the current step abandoned.
    *[(s, E.CANCEL_RECORDED, s) for s in sorted({S.READY, S.RESUME_VALIDATION, *WAITING_STATES})],
    *[(s, E.STEP_CANCELED, S.RESUME_VALIDATION) for s in sorted(WAITING_STATES)],
    (S.READY, E.STEP_CANCELED, S.READY),
    (S.RESUME_VALIDATION, E.INPUT_REQUESTED, S.WAITING_INPUT),
    (S.RESUME_VALIDATION, E.EXTERNAL_AWAITED, S.WAITING_EXTERNAL),
    # An action's MCP server asks a person for input before it completes the call.
    (S.WAITING_EXTERNAL, E.INPUT_REQUESTED, S.WAITING_INPUT),
]


def test_table_is_exactly_the_expected_rows() -> None:
    expected = {(s, e): t for s, e, t in EXPECTED_ROWS}
    assert len(expected) == len(EXPECTED_ROWS), "duplicate row in the expectation"
    assert expected == TRANSITIONS


@pytest.mark.parametrize(("state", "event", "target"), EXPECTED_ROWS)
def test_allowed_transition(state: RunState, event: RunEvent, target: RunState) -> None:
    after = transition(Position(state, 7), event)
    assert after == Position(target, 8)


FORBIDDEN = [
    (S.PENDING, E.SUCCEEDED),  # nothing was validated yet
    (S.READY, E.INPUT_RECEIVED),  # no question was asked
    (S.WAITING_INPUT, E.APPROVAL_DECIDED),  # an answer to a different wait
    (S.WAITING_APPROVAL, E.SUCCEEDED),  # approval never completes a run by itself
    (S.WAITING_EXTERNAL, E.STEP_COMPLETED),  # no work while waiting
    (S.WAITING_APPROVAL, E.INPUT_REQUESTED),  # only an action in flight asks mid-wait
    (S.CANCEL_REQUESTED, E.STEP_COMPLETED),  # cancellation starts no new work
    (S.CANCEL_REQUESTED, E.CANCEL_REQUESTED),
    (S.QUARANTINED, E.STEP_COMPLETED),  # quarantine is untouched until released
    (S.QUARANTINED, E.DEADLINE_EXCEEDED),
    (S.RESUME_VALIDATION, E.SUCCEEDED),
    *[(t, e) for t in sorted(TERMINAL_STATES) for e in RunEvent],
]


@pytest.mark.parametrize(("state", "event"), FORBIDDEN)
def test_forbidden_transition_raises(state: RunState, event: RunEvent) -> None:
    with pytest.raises(IllegalTransition) as err:
        transition(Position(state, 3), event)
    assert err.value.state is state
    assert err.value.event is event
    assert state.value in str(err.value)
    assert event.value in str(err.value)


def test_terminal_states_have_no_exits() -> None:
    for state in TERMINAL_STATES:
        assert allowed_events(state) == frozenset()
        assert state.terminal


def test_every_waiting_state_can_expire_and_be_canceled() -> None:
    for state in WAITING_STATES:
        assert state.waiting
        assert {E.WAIT_EXPIRED, E.CANCEL_REQUESTED, E.DEADLINE_EXCEEDED} <= allowed_events(state)


def test_every_non_terminal_state_reaches_a_terminal_state() -> None:
    reachable = set(TERMINAL_STATES)
    changed = True
    while changed:
        changed = False
        for (s, _), t in TRANSITIONS.items():
            if t in reachable and s not in reachable:
                reachable.add(s)
                changed = True
    assert reachable == set(RunState)


@given(st.sampled_from(list(RunState)), st.sampled_from(list(RunEvent)))
def test_next_state_is_the_table_or_an_error(state: RunState, event: RunEvent) -> None:
    if (state, event) in TRANSITIONS:
        assert next_state(state, event) is TRANSITIONS[(state, event)]
    else:
        with pytest.raises(IllegalTransition):
            next_state(state, event)


class RandomEvents(RuleBasedStateMachine):
    """Random event sequences never leave the table; the version grows by one per transition."""

    def __init__(self) -> None:
        super().__init__()
        self.position = Position(S.PENDING, 0)
        self.transitions = 0
        self.absorbed_at: RunState | None = None

    @rule(event=st.sampled_from(list(RunEvent)))
    def send(self, event: RunEvent) -> None:
        before = self.position
        try:
            after = transition(before, event)
        except IllegalTransition:
            assert (before.state, event) not in TRANSITIONS
            return
        assert (before.state, event) in TRANSITIONS
        assert after.state_version == before.state_version + 1
        self.position = after
        self.transitions += 1
        if after.state.terminal:
            self.absorbed_at = after.state

    @rule(data=st.data())
    def send_allowed(self, data: st.DataObject) -> None:
        # Biased walk: most random events are illegal, so also take legal ones to go deep.
        events = sorted(allowed_events(self.position.state))
        if events:
            self.send(data.draw(st.sampled_from(events)))

    @invariant()
    def version_counts_transitions(self) -> None:
        assert self.position.state_version == self.transitions

    @invariant()
    def terminal_states_absorb(self) -> None:
        if self.absorbed_at is not None:
            assert self.position.state is self.absorbed_at


TestRandomEvents = RandomEvents.TestCase
