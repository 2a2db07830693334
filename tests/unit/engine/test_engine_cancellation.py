"""Cancellation scopes: a task ends canceled (in-flight work reconciled, never assumed undone);
a turn, tool call or children scope abandons what it covers and the run goes on."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from tests.unit.builders import (
    CHILD,
    DONE,
    EFFECTS,
    SETTINGS,
    T0,
    ask,
    at,
    cancel,
    checkpoint_of,
    cp_of,
    decide_on,
    effect,
    expect,
    iso,
    new_run,
    patch_spec,
    reach,
    settings_with,
    wait_for_event,
    waiting_on_action,
    walk,
)

from durable_agents.api.v1alpha1 import ActionState, CancelScope, UnreversedEffect
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import CancellationRecord
from durable_agents.core.engine import ActionObservation, Idle, NeedActions, NeedChildren
from durable_agents.core.ledger import action_record_name
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit


# --- task scope: the run ends canceled -----------------------------------------------------------

TASK_CANCELABLE = [
    RunState.READY,
    RunState.WAITING_INPUT,
    RunState.WAITING_EXTERNAL,
    RunState.WAITING_APPROVAL,
    RunState.WAITING_RETRY,
    RunState.RESUME_VALIDATION,
]


@pytest.mark.parametrize("state", TASK_CANCELABLE, ids=str)
def test_a_task_cancellation_requests_then_finishes_cancel(state: RunState) -> None:
    obj, settings = reach(state)
    assert obj["status"]["state"] == state.value
    current_step = cp_of(obj).position.step
    obj = cancel(obj, {"stop-1": {"reason": "wrong ticket", "requestedAt": iso(at(5))}})

    # Even a due retry or a delivered answer does not beat the request: one commit, cancel_requested.
    obj, requested = expect(
        obj, at(10), RunEvent.CANCEL_REQUESTED, RunState.CANCEL_REQUESTED, settings=settings
    )
    cancellation = requested.status.cancellation
    assert cancellation is not None
    assert (cancellation.request_id, cancellation.scope, cancellation.reason, cancellation.requested_at) == (
        "stop-1",
        CancelScope.TASK,
        "wrong ticket",
        at(5),
    )
    assert checkpoint_of(requested).cancellations == [
        CancellationRecord(request_id="stop-1", scope="task", step_index=current_step, handled_at=at(10))
    ]
    assert requested.status.waiting_for is None
    assert requested.status.outcome is None
    assert "stop-1" in requested.detail

    # Nothing in flight: the next decision finishes the cancellation.
    obj, finished = expect(obj, at(11), RunEvent.CANCEL_FINISHED, RunState.CANCELED, settings=settings)
    assert finished.status.outcome is not None
    assert finished.status.outcome.reason == "Canceled"
    assert finished.status.outcome.message == "wrong ticket; no effect happened"
    done = finished.status.cancellation
    assert done is not None
    assert (done.request_id, done.reason, done.requested_at) == ("stop-1", "wrong ticket", at(5))
    assert (done.unreversed_effects, done.canceled_actions, done.proposed_compensations) == ([], [], [])
    succeeded = {c["type"]: c for c in obj["status"]["conditions"]}["Succeeded"]
    assert (succeeded["status"], succeeded["reason"]) == ("False", "Canceled")
    assert decide_on(obj, at(12), settings=settings) == Idle(reason="run is canceled")


def test_a_task_cancellation_is_acted_on_once() -> None:
    obj, settings = reach(RunState.WAITING_INPUT)
    obj = cancel(obj, {"stop-1": {}})
    obj, _ = expect(obj, at(10), RunEvent.CANCEL_REQUESTED, RunState.CANCEL_REQUESTED, settings=settings)
    # The request is still in the spec: in cancel_requested it is not requested again.
    obj, finished = expect(obj, at(11), RunEvent.CANCEL_FINISHED, RunState.CANCELED, settings=settings)
    assert [c.request_id for c in checkpoint_of(finished).cancellations] == ["stop-1"]
    assert finished.status.outcome is not None
    assert finished.status.outcome.message == "canceled; no effect happened"


# --- task scope with an action in flight: reconciled, never assumed undone -----------------------


@pytest.mark.parametrize(
    ("observed", "canceled", "unreversed"),
    [
        (ActionState.CANCELED, True, False),
        (ActionState.SUCCEEDED, False, True),
        (ActionState.FAILED, False, False),
    ],
    ids=["canceled", "succeeded", "failed"],
)
def test_a_task_cancellation_reconciles_the_pending_action(
    observed: ActionState, canceled: bool, unreversed: bool
) -> None:
    obj, spec = waiting_on_action(EFFECTS, [effect("pay"), DONE])
    name = action_record_name(spec.idempotency_key)
    # Without a cancellation the shell is asked to reconcile, not to cancel.
    assert decide_on(obj, at(2), settings=EFFECTS) == NeedActions({name: spec}, cancel=False)

    obj = cancel(obj, {"stop-1": {"reason": "abort"}})
    obj, requested = expect(
        obj, at(3), RunEvent.CANCEL_REQUESTED, RunState.CANCEL_REQUESTED, settings=EFFECTS
    )
    assert [p.action_record_name for p in checkpoint_of(requested).pending_actions] == [name]

    # The shell must cancel the intent if undispatched (cancel=True), and report its state.
    assert decide_on(obj, at(4), settings=EFFECTS) == NeedActions({name: spec}, cancel=True)

    seen = {name: ActionObservation(observed, outcome={"id": "pay-1"}, reason="Whatever")}
    obj, finished = expect(
        obj, at(5), RunEvent.CANCEL_FINISHED, RunState.CANCELED, settings=EFFECTS, actions=seen
    )
    status = finished.status.cancellation
    assert status is not None
    assert status.canceled_actions == ([name] if canceled else [])
    assert status.unreversed_effects == (
        [UnreversedEffect(step="pay", effect="http.post", action_record=name, state="succeeded")]
        if unreversed
        else []
    )
    assert finished.status.outcome is not None
    assert finished.status.outcome.reason == "Canceled"
    happened = "1 effect(s) happened and were not undone" if unreversed else "no effect happened"
    assert finished.status.outcome.message == f"abort; {happened}"
    assert checkpoint_of(finished).pending_actions == []


@pytest.mark.parametrize(
    "observed", [ActionState.DISPATCHING, ActionState.OUTCOME_UNKNOWN, ActionState.INTENT], ids=str
)
def test_a_task_cancellation_waits_for_a_dispatched_or_unknown_action(observed: ActionState) -> None:
    obj, spec = waiting_on_action(EFFECTS, [effect("pay"), DONE])
    name = action_record_name(spec.idempotency_key)
    obj = cancel(obj, {"stop-1": {}})
    obj, _ = expect(obj, at(3), RunEvent.CANCEL_REQUESTED, RunState.CANCEL_REQUESTED, settings=EFFECTS)
    idle = decide_on(obj, at(4), settings=EFFECTS, actions={name: ActionObservation(observed)})
    assert isinstance(idle, Idle), idle
    assert name in idle.reason
    # Not reported at all: the same.
    assert isinstance(decide_on(obj, at(4), settings=EFFECTS, actions={}), Idle)


# --- earlier effects stay: unreversed, and compensations proposed by policy ----------------------


@pytest.mark.parametrize("propose", [True, False])
def test_earlier_succeeded_effects_are_reported_unreversed_with_proposed_compensations(propose: bool) -> None:
    settings = settings_with(proposeCompensations=propose)
    steps = [effect("pay"), ask("confirm"), effect("refund", compensates="pay"), DONE]
    obj, spec = waiting_on_action(settings, steps)
    name = action_record_name(spec.idempotency_key)
    ok = {name: ActionObservation(ActionState.SUCCEEDED, outcome={"payment": "p-1"})}
    obj, received = expect(
        obj, at(2), RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION, settings=settings, actions=ok
    )
    assert checkpoint_of(received).position.step == 1
    obj, _ = expect(obj, at(3), RunEvent.REVALIDATED, RunState.READY, settings=settings)
    obj, _ = expect(obj, at(4), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT, settings=settings)

    obj = cancel(obj, {"stop-1": {"reason": "changed my mind"}})
    obj, _ = expect(obj, at(5), RunEvent.CANCEL_REQUESTED, RunState.CANCEL_REQUESTED, settings=settings)
    obj, finished = expect(obj, at(6), RunEvent.CANCEL_FINISHED, RunState.CANCELED, settings=settings)
    status = finished.status.cancellation
    assert status is not None
    assert status.unreversed_effects == [
        UnreversedEffect(step="pay", effect="http.post", action_record=name, state="succeeded")
    ]
    assert status.canceled_actions == []
    assert status.proposed_compensations == (["refund"] if propose else [])
    assert finished.status.outcome is not None
    assert "1 effect(s) happened and were not undone" in finished.status.outcome.message


def test_without_a_policy_no_compensation_is_proposed() -> None:
    steps = [effect("pay"), ask("confirm"), effect("refund", compensates="pay"), DONE]
    obj, spec = waiting_on_action(EFFECTS, steps)
    ok = {action_record_name(spec.idempotency_key): ActionObservation(ActionState.SUCCEEDED)}
    obj, _ = expect(
        obj, at(2), RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION, settings=EFFECTS, actions=ok
    )
    obj = walk(obj, RunState.WAITING_INPUT, settings=EFFECTS)
    obj = cancel(obj, {"stop-1": {}})
    obj, _ = expect(obj, at(5), RunEvent.CANCEL_REQUESTED, RunState.CANCEL_REQUESTED, settings=EFFECTS)
    obj, finished = expect(obj, at(6), RunEvent.CANCEL_FINISHED, RunState.CANCELED, settings=EFFECTS)
    assert finished.status.cancellation is not None
    assert len(finished.status.cancellation.unreversed_effects) == 1
    assert finished.status.cancellation.proposed_compensations == []


# --- turn and tool-call scope: the step is abandoned, the run goes on ----------------------------


@pytest.mark.parametrize("kind", ["ask", "await"])
def test_a_turn_cancellation_in_a_wait_abandons_the_step_after_resume_validation(kind: str) -> None:
    first = ask("confirm") if kind == "ask" else wait_for_event("window")
    waiting = RunState.WAITING_INPUT if kind == "ask" else RunState.WAITING_EXTERNAL
    obj = walk(new_run(steps=[first, ask("next"), DONE]), waiting, settings=SETTINGS)
    obj = cancel(obj, {"skip-1": {"scope": "turn", "reason": "not needed"}})

    obj, canceled = expect(obj, at(10), RunEvent.STEP_CANCELED, RunState.RESUME_VALIDATION)
    cp = checkpoint_of(canceled)
    assert cp.cancellations == [
        CancellationRecord(request_id="skip-1", scope="turn", step_index=0, handled_at=at(10))
    ]
    assert cp.position.step == 0, "the step is abandoned by resume validation, not before"
    assert canceled.status.cancellation is None, "only a task cancellation is reported in status"

    obj, revalidated = expect(obj, at(11), RunEvent.REVALIDATED, RunState.READY)
    cp = checkpoint_of(revalidated)
    assert cp.position.step == 1, "the canceled step is skipped"
    assert (cp.pending_input, cp.pending_external, cp.input_refs) == (None, None, [])
    assert "abandoned" in revalidated.detail
    assert "skip-1" in revalidated.detail

    # The run goes on with the next step, and the request is not acted on again.
    obj, asked = expect(obj, at(12), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT)
    assert asked.status.waiting_for == "input:next"
    assert isinstance(decide_on(obj, at(13)), Idle)


def test_a_turn_cancellation_in_ready_skips_the_step_at_once() -> None:
    obj = walk(new_run(steps=[ask("confirm"), ask("next"), DONE]), RunState.READY, settings=SETTINGS)
    obj = cancel(obj, {"skip-1": {"scope": "turn"}})
    obj, canceled = expect(obj, at(10), RunEvent.STEP_CANCELED, RunState.READY)
    cp = checkpoint_of(canceled)
    assert cp.position.step == 1
    assert [(c.request_id, c.scope, c.step_index) for c in cp.cancellations] == [("skip-1", "turn", 0)]
    # "confirm" is never asked: the next question is.
    obj, asked = expect(obj, at(11), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT)
    assert asked.status.waiting_for == "input:next"


def test_a_turn_cancellation_in_waiting_retry_abandons_the_failing_step() -> None:
    obj, settings = reach(RunState.WAITING_RETRY)
    obj = cancel(obj, {"skip-1": {"scope": "turn"}})
    obj, _ = expect(obj, at(0.5), RunEvent.STEP_CANCELED, RunState.RESUME_VALIDATION, settings=settings)
    obj, revalidated = expect(obj, at(0.6), RunEvent.REVALIDATED, RunState.READY, settings=settings)
    cp = checkpoint_of(revalidated)
    assert (cp.position.step, cp.retry.retry_at) == (1, None)
    expect(obj, at(0.7), RunEvent.SUCCEEDED, RunState.COMPLETED, settings=settings)


def test_a_tool_call_cancellation_with_nothing_pending_is_only_recorded() -> None:
    obj = walk(new_run(steps=[ask("confirm"), DONE]), RunState.WAITING_INPUT, settings=SETTINGS)
    before = cp_of(obj)
    obj = cancel(obj, {"tc-1": {"scope": "toolCall"}})
    obj, recorded = expect(obj, at(10), RunEvent.CANCEL_RECORDED, RunState.WAITING_INPUT)
    assert "no tool call to cancel" in recorded.detail
    assert recorded.status.waiting_for == "input:confirm", "what the run waits for stays visible"
    assert recorded.status.state_since == T0, "the state did not change"
    cp = checkpoint_of(recorded)
    assert [(c.request_id, c.scope, c.step_index) for c in cp.cancellations] == [("tc-1", "toolCall", 0)]
    assert (cp.position.step, cp.pending_input) == (0, before.pending_input)

    # Still waiting for the answer (not recorded again), which then moves the run on as usual.
    assert pending_input_expiry(obj) == T0 + timedelta(hours=1)
    assert decide_on(obj, at(20)) == Idle(wake_at=T0 + timedelta(hours=1), reason="waiting")
    obj = patch_spec(obj, answers={"confirm": "yes"})
    obj, received = expect(obj, at(30), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION)
    assert [r.id for r in checkpoint_of(received).input_refs] == ["answer-confirm"]
    obj, _ = expect(obj, at(31), RunEvent.REVALIDATED, RunState.READY)
    obj, _ = expect(obj, at(32), RunEvent.SUCCEEDED, RunState.COMPLETED)


def pending_input_expiry(obj: dict[str, Any]) -> datetime:
    pending = cp_of(obj).pending_input
    assert pending is not None
    expires: datetime = pending.expires_at
    return expires


def test_cancellation_requests_are_handled_once_each_in_request_id_order() -> None:
    obj = walk(new_run(steps=[ask("first"), ask("second"), DONE]), RunState.WAITING_INPUT, settings=SETTINGS)
    # Inserted out of order: handled by request ID, not by insertion.
    obj = cancel(obj, {"b-turn": {"scope": "turn"}, "a-tool-call": {"scope": "toolCall"}})
    obj, first = expect(obj, at(10), RunEvent.CANCEL_RECORDED, RunState.WAITING_INPUT)
    assert "a-tool-call" in first.detail
    obj, second = expect(obj, at(11), RunEvent.STEP_CANCELED, RunState.RESUME_VALIDATION)
    assert "b-turn" in second.detail
    obj, _ = expect(obj, at(12), RunEvent.REVALIDATED, RunState.READY)
    obj, asked = expect(obj, at(13), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT)
    assert asked.status.waiting_for == "input:second"
    assert [(c.request_id, c.step_index) for c in checkpoint_of(asked).cancellations] == [
        ("a-tool-call", 0),
        ("b-turn", 0),
    ]
    # Neither request touches the second question.
    assert decide_on(obj, at(14)) == Idle(wake_at=at(13) + timedelta(hours=1), reason="waiting")


@pytest.mark.parametrize("scope", ["turn", "toolCall"])
@pytest.mark.parametrize("observed", [ActionState.CANCELED, ActionState.SUCCEEDED], ids=str)
def test_a_step_cancellation_of_an_action_in_flight_reconciles_then_goes_on(
    scope: str, observed: ActionState
) -> None:
    obj, spec = waiting_on_action(EFFECTS, [effect("pay"), ask("after"), DONE])
    name = action_record_name(spec.idempotency_key)
    obj = cancel(obj, {"c-1": {"scope": scope}})
    obj, recorded = expect(obj, at(2), RunEvent.CANCEL_RECORDED, RunState.WAITING_EXTERNAL, settings=EFFECTS)
    assert recorded.status.waiting_for == f"action:{name}"
    assert "no tool call to cancel" not in recorded.detail
    assert decide_on(obj, at(3), settings=EFFECTS) == NeedActions({name: spec}, cancel=True)

    seen = {name: ActionObservation(observed)}
    obj, _ = expect(
        obj, at(4), RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION, settings=EFFECTS, actions=seen
    )
    # Canceled: the step is abandoned (not failed); succeeded: it is done. Either way, the next step.
    obj, revalidated = expect(obj, at(5), RunEvent.REVALIDATED, RunState.READY, settings=EFFECTS)
    assert checkpoint_of(revalidated).position.step == 1
    obj, asked = expect(obj, at(6), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT, settings=EFFECTS)
    assert asked.status.waiting_for == "input:after"


@pytest.mark.parametrize("scope", ["turn", "toolCall"])
def test_a_step_cancellation_in_waiting_approval_abandons_the_effect(scope: str) -> None:
    obj, settings = reach(RunState.WAITING_APPROVAL)
    obj = cancel(obj, {"c-1": {"scope": scope}})
    obj, canceled = expect(obj, at(10), RunEvent.STEP_CANCELED, RunState.RESUME_VALIDATION, settings=settings)
    assert canceled.status.approval_request is None
    obj, revalidated = expect(obj, at(11), RunEvent.REVALIDATED, RunState.READY, settings=settings)
    assert checkpoint_of(revalidated).position.step == 1
    obj, done = expect(obj, at(12), RunEvent.SUCCEEDED, RunState.COMPLETED, settings=settings)
    assert checkpoint_of(done).pending_actions == []


def test_a_step_cancellation_in_resume_validation_is_recorded_then_abandons_the_step() -> None:
    obj = walk(new_run(steps=[ask("confirm"), ask("next"), DONE]), RunState.READY, settings=SETTINGS)
    obj, _ = expect(obj, at(1), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT)
    # The answer arrives: leaving the wait advanced the step already. A turn cancellation now
    # names the step the run is about to take.
    obj = patch_spec(obj, answers={"confirm": "yes"})
    obj, _ = expect(obj, at(2), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION)
    obj = cancel(obj, {"skip-1": {"scope": "turn"}})
    obj, recorded = expect(obj, at(3), RunEvent.CANCEL_RECORDED, RunState.RESUME_VALIDATION)
    assert checkpoint_of(recorded).cancellations[0].step_index == 1
    obj, revalidated = expect(obj, at(4), RunEvent.REVALIDATED, RunState.READY)
    assert checkpoint_of(revalidated).position.step == 2
    obj, _ = expect(obj, at(5), RunEvent.SUCCEEDED, RunState.COMPLETED)


def test_a_tool_call_cancellation_with_nothing_pending_does_not_cancel_a_later_action() -> None:
    """Recorded as "no tool call to cancel" in ready: the effect that the step starts afterwards is
    a new tool call the request never named, so it must not be canceled."""
    obj = walk(new_run(steps=[effect("pay"), DONE]), RunState.READY, settings=EFFECTS)
    obj = cancel(obj, {"tc-1": {"scope": "toolCall"}})
    obj, recorded = expect(obj, at(1), RunEvent.CANCEL_RECORDED, RunState.READY, settings=EFFECTS)
    assert "no tool call to cancel" in recorded.detail
    obj, intent = expect(obj, at(2), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL, settings=EFFECTS)
    (spec,) = intent.intents
    need = decide_on(obj, at(3), settings=EFFECTS)
    assert need == NeedActions({action_record_name(spec.idempotency_key): spec}, cancel=False)


def test_a_tool_call_cancellation_with_nothing_pending_in_resume_validation_does_not_skip_the_step() -> None:
    """Recorded as "no tool call to cancel": resume validation must not then abandon the step."""
    obj = walk(new_run(steps=[ask("confirm"), ask("next"), DONE]), RunState.WAITING_INPUT, settings=SETTINGS)
    obj = patch_spec(obj, answers={"confirm": "yes"})
    obj, _ = expect(obj, at(1), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION)
    obj = cancel(obj, {"tc-1": {"scope": "toolCall"}})
    obj, recorded = expect(obj, at(2), RunEvent.CANCEL_RECORDED, RunState.RESUME_VALIDATION)
    assert "no tool call to cancel" in recorded.detail
    obj, revalidated = expect(obj, at(3), RunEvent.REVALIDATED, RunState.READY)
    assert checkpoint_of(revalidated).position.step == 1, "the question 'next' is still asked"


def test_a_children_cancellation_with_no_child_running_does_not_cancel_a_later_child() -> None:
    """A children-scope request covers the children running when it is handled, not later ones."""
    obj = walk(new_run(steps=[ask("confirm"), CHILD, DONE]), RunState.WAITING_INPUT, settings=SETTINGS)
    obj = cancel(obj, {"kids-1": {"scope": "children"}})
    obj, _ = expect(obj, at(1), RunEvent.CANCEL_RECORDED, RunState.WAITING_INPUT)
    obj = patch_spec(obj, answers={"confirm": "yes"})
    obj = walk(obj, RunState.WAITING_EXTERNAL, settings=SETTINGS, now=at(2))
    need = decide_on(obj, at(3))
    assert isinstance(need, NeedChildren), need
    assert need.cancel is None, "a child started after the request was handled is not canceled"
