"""Bounds on a model-planned run: each limit stops the next model call, with a reason naming it."""

from __future__ import annotations

import os
from typing import Any

import pytest

from durable_agents.core.agent.limits import AgentLimits, exceeded, facts_bytes, tool_calls
from durable_agents.core.agent_facts import (
    MAX_TURNS,
    AgentFacts,
    SettledOutcome,
    TokenUsage,
    new_facts,
    new_turn,
    settle_last,
    with_model_call,
    with_turn,
)
from durable_agents.core.digest import canonical_digest
from durable_agents.core.sealed_values import DataKey

pytestmark = pytest.mark.unit

KEY = DataKey(bytes(range(32)))


def _start() -> AgentFacts:
    return new_facts(model="m", prompt_digest=canonical_digest("p"), tool_set_digest=canonical_digest("t"))


def _add(
    facts: AgentFacts,
    outcome: SettledOutcome | None = "succeeded",
    *,
    bad: bool = False,
    usage: TokenUsage | None = None,
    result: Any = None,
) -> AgentFacts:
    index = len(facts.turns)
    turn = new_turn(
        KEY,
        index=index,
        call_id=f"c{index}",
        tool="notify",
        arguments={"i": index},
        reason=None,
        step_index=index,
        usage=usage,
        refusal="invalid arguments" if bad else None,
        entropy=os.urandom,
    )
    facts = with_turn(facts, turn)
    if not bad and outcome is not None:
        facts = settle_last(
            facts,
            KEY,
            outcome=outcome,
            result=result if result is not None else {"ok": True},
            entropy=os.urandom,
        )
    return facts


def test_fresh_facts_and_no_facts_are_within_the_defaults() -> None:
    assert exceeded(_start(), AgentLimits(), calls_since_boundary=0) is None
    assert exceeded(None, AgentLimits(), calls_since_boundary=0) is None


def test_model_calls_per_run() -> None:
    limits = AgentLimits(max_model_calls=3)
    facts = _add(_add(_start()))
    assert exceeded(facts, limits, calls_since_boundary=0) is None
    facts = with_model_call(facts, TokenUsage())  # a call that recorded no turn counts too
    reason = exceeded(facts, limits, calls_since_boundary=0)
    assert reason is not None
    assert "3 model calls" in reason


def test_model_calls_between_two_checkpoints() -> None:
    limits = AgentLimits(max_model_calls_per_boundary=2)
    assert exceeded(_start(), limits, calls_since_boundary=1) is None
    reason = exceeded(_start(), limits, calls_since_boundary=2)
    assert reason is not None
    assert "since the last checkpoint" in reason
    assert exceeded(None, limits, calls_since_boundary=2) == reason


def test_tokens_in_and_out() -> None:
    limits = AgentLimits(max_tokens=1000)
    facts = _add(_start(), usage=TokenUsage(input_tokens=900, output_tokens=99))
    assert exceeded(facts, limits, calls_since_boundary=0) is None
    facts = with_model_call(facts, TokenUsage(output_tokens=1))
    reason = exceeded(facts, limits, calls_since_boundary=0)
    assert reason is not None
    assert "1000 tokens" in reason
    assert facts.usage_total == TokenUsage(input_tokens=900, output_tokens=100)


def test_tool_calls_count_made_calls_not_refused_ones() -> None:
    limits = AgentLimits(max_tool_calls=2)
    facts = _add(_add(_start(), bad=True), "failed")
    assert tool_calls(facts) == 1
    assert exceeded(facts, limits, calls_since_boundary=0) is None
    facts = _add(facts, None)  # pending: being made
    assert tool_calls(facts) == 2
    reason = exceeded(facts, limits, calls_since_boundary=0)
    assert reason is not None
    assert "2 tool calls" in reason


def test_consecutive_tool_errors_and_their_reset() -> None:
    limits = AgentLimits(max_consecutive_tool_errors=2)
    facts = _add(_start(), bad=True)
    assert facts.tool_errors == 1
    assert exceeded(facts, limits, calls_since_boundary=0) is None
    facts = _add(facts)  # a good call resets the count
    assert facts.tool_errors == 0
    facts = _add(_add(facts, bad=True), bad=True)
    assert facts.tool_errors == 2
    reason = exceeded(facts, limits, calls_since_boundary=0)
    assert reason is not None
    assert "in a row" in reason


def test_a_refusal_by_the_policy_is_no_tool_error() -> None:
    facts = _add(_start(), None)
    facts = settle_last(
        facts, KEY, outcome="refused", result={"status": "refused", "reason": "rejected"}, entropy=os.urandom
    )
    assert facts.tool_errors == 0


def test_the_facts_size() -> None:
    facts = _add(_start(), result={"blob": "x" * 20_000})
    size = facts_bytes(facts)
    assert exceeded(facts, AgentLimits(max_facts_bytes=size), calls_since_boundary=0) is None
    reason = exceeded(facts, AgentLimits(max_facts_bytes=size - 1), calls_since_boundary=0)
    assert reason is not None
    assert f"{size} bytes" in reason
    # A truncated result keeps one turn well under the default bound.
    assert size < 32 * 1024


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"max_model_calls": 0}, "at least 1"),
        ({"max_tokens": -1}, "at least 1"),
        ({"max_consecutive_tool_errors": 0}, "at least 1"),
        ({"max_model_calls": MAX_TURNS + 1}, f"at most {MAX_TURNS}"),
    ],
)
def test_limits_must_be_positive_and_keep_turns_within_the_type(
    fields: dict[str, int], complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint):
        AgentLimits(**fields)


def test_more_turns_than_a_checkpoint_holds_do_not_validate() -> None:
    facts = _start()
    turn = new_turn(
        KEY, index=0, call_id="c", tool="t", arguments={}, reason=None, step_index=0, entropy=os.urandom
    )
    raw = facts.model_dump(mode="json", by_alias=True)
    dumped = turn.model_dump(mode="json", by_alias=True)
    turns = [{**dumped, "index": i, "outcome": "failed"} for i in range(MAX_TURNS + 1)]
    with pytest.raises(ValueError, match=str(MAX_TURNS)):
        AgentFacts.model_validate({**raw, "turns": turns, "modelCallsTotal": MAX_TURNS + 1})


def test_a_pending_turn_must_settle_before_the_next() -> None:
    facts = _add(_start(), None)
    with pytest.raises(ValueError, match="pending"):
        _add(facts)
