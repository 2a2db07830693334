"""A pending action whose MCP server asks for input (``input_required``): the run asks each
question in ``waiting_input`` without moving its step, goes back to waiting on the action once
answered, and expires like any question (issue 36, item 1)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from tests.unit.builders import (
    DONE,
    EFFECTS,
    T0,
    at,
    checkpoint_of,
    decide_on,
    effect,
    expect,
    patch_spec,
    waiting_on_action,
)

from durable_agents.api.v1alpha1 import ActionInput, ActionState
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import ActionObservation, Idle, NeedActions
from durable_agents.core.ledger import action_record_name
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit
ANSWER = json.dumps({"action": "accept", "content": {"nights": 2}})


def asking(name: str, *keys: str, round_: int = 1) -> dict[str, ActionObservation]:
    questions = {key: f"question {key}" for key in keys}
    asked = ActionInput(round=round_, keys=list(keys), questions=questions, asked_at=T0)
    return {name: ActionObservation(ActionState.INPUT_REQUIRED, input=asked)}


def test_each_question_is_asked_then_the_run_waits_on_the_action_again_at_the_same_step() -> None:
    obj, spec = waiting_on_action(EFFECTS, [effect("pay"), DONE])
    name = action_record_name(spec.idempotency_key)
    seen = asking(name, "stay", "room")
    for n, key in enumerate(("stay", "room")):  # in the order of status.input.keys
        obj, asked = expect(
            obj, at(2 + n), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT, settings=EFFECTS, actions=seen
        )
        question = f"mcp-0-1-{key}"
        assert asked.status.waiting_for == f"input:{question}"
        cp = checkpoint_of(asked)
        assert cp.pending_input is not None
        assert (cp.pending_input.request_id, cp.pending_input.question) == (question, f"question {key}")
        assert [p.action_record_name for p in cp.pending_actions] == [name], "still waiting on it"
        obj = patch_spec(obj, answers={**obj["spec"].get("answers", {}), question: ANSWER})
        # in waiting_input the run looks at its action first (does it still ask?): it does
        assert isinstance(decide_on(obj, at(2 + n), settings=EFFECTS), NeedActions)
        obj, taken = expect(
            obj,
            at(2 + n),
            RunEvent.INPUT_RECEIVED,
            RunState.RESUME_VALIDATION,
            settings=EFFECTS,
            actions=seen,
        )
        assert checkpoint_of(taken).position.step == 0, "a server's question does not move the step"
        obj, _ = expect(
            obj, at(2 + n), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL, settings=EFFECTS
        )
    refs = {ref.id for ref in checkpoint_of(obj["status"]["checkpoint"]).input_refs}
    assert {"answer-mcp-0-1-room", "answer-mcp-0-1-stay"} <= refs
    idle = decide_on(obj, at(5), settings=EFFECTS, actions=seen)
    assert isinstance(idle, Idle), "every question answered: the dispatcher sends it again"
    obj, again = expect(
        obj,
        at(6),
        RunEvent.INPUT_REQUESTED,
        RunState.WAITING_INPUT,
        settings=EFFECTS,
        actions=asking(name, "stay", round_=2),
    )
    assert again.status.waiting_for == "input:mcp-0-2-stay", "a new round is a new question"


def test_an_unanswered_server_question_expires_with_the_policy_input_expiry() -> None:
    obj, spec = waiting_on_action(EFFECTS, [effect("pay"), DONE])
    seen = asking(action_record_name(spec.idempotency_key), "stay")
    obj, asked = expect(
        obj, at(2), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT, settings=EFFECTS, actions=seen
    )
    pending = checkpoint_of(asked).pending_input
    assert pending is not None
    assert pending.expires_at - at(2) > timedelta(0)
    obj, expired = expect(
        obj, pending.expires_at, RunEvent.WAIT_EXPIRED, RunState.EXPIRED, settings=EFFECTS, actions=seen
    )
    assert expired.status.outcome is not None
    assert expired.status.outcome.reason == "InputExpired"


def test_a_question_of_a_call_held_open_closes_unanswered_once_its_record_no_longer_asks() -> None:
    """2025-11-25: the call held open went on (past the policy's bound) or was lost with its
    operator: the run's question closes with the record's reason, at the same step, and the run
    waits on the action again."""
    obj, spec = waiting_on_action(EFFECTS, [effect("pay"), DONE])
    name = action_record_name(spec.idempotency_key)
    obj, _ = expect(
        obj,
        at(2),
        RunEvent.INPUT_REQUESTED,
        RunState.WAITING_INPUT,
        settings=EFFECTS,
        actions=asking(name, "7"),
    )
    held = asking(name, "7")[name].input
    for state, reason in (
        (ActionState.OUTCOME_UNKNOWN, "HeldCallLost"),
        (ActionState.DISPATCHING, "HeldPastBound"),
    ):
        gone = {name: ActionObservation(state, reason=reason, message="the call is gone", input=held)}
        _, closed = expect(
            obj, at(3), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION, settings=EFFECTS, actions=gone
        )
        assert closed.detail == f"question mcp-0-1-7 closed unanswered: {reason}: the call is gone"
        cp = checkpoint_of(closed)
        assert cp.pending_input is None
        assert cp.position.step == 0, "its step goes on once the action settles"
        assert not any(ref.id == "answer-mcp-0-1-7" for ref in cp.input_refs), "no answer is recorded"
