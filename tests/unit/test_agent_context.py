"""The model planner's context: rebuilt from the checkpoint's facts, deterministic, sealed at rest."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_agents.core.agent.context import (
    NOT_EXECUTED,
    TRUNCATION_NOTE,
    ContextMismatch,
    build_request,
    start_facts,
)
from durable_agents.core.agent.tools import (
    ToolDeclaration,
    ask_human_tool,
    effect_tool,
    read_tool,
)
from durable_agents.core.agent_facts import (
    RESULT_MAX_BYTES,
    SEALED_TOKEN_MAX,
    AgentFacts,
    ModelTurn,
    SettledOutcome,
    TokenUsage,
    bound_result,
    new_turn,
    settle_last,
    with_turn,
)
from durable_agents.core.checkpoint import (
    Checkpoint,
    Loaded,
    Position,
    Timestamps,
    dump_checkpoint,
    load_checkpoint,
    stamp_checkpoint,
    verify_integrity,
)
from durable_agents.core.digest import canonical_json
from durable_agents.core.sealed_values import DataKey, ValueSealingError
from durable_agents.core.sealing import Keyring
from durable_agents_testkit.modelserver import _conversation_problem

pytestmark = pytest.mark.unit

KEY = DataKey(bytes(range(32)))
OTHER_KEY = DataKey(bytes(range(1, 33)))
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
MODEL = "model-2030-01"
PROMPT = "You fix ConfigMaps. Ask before you change anything."
OBJECTIVE = "Make settings say hello."
TOOLS: tuple[ToolDeclaration, ...] = (
    read_tool("read_configmap", "Read a ConfigMap", api_version="v1", kind="ConfigMap"),
    effect_tool(
        "notify",
        "Post a message",
        effect="http.post",
        target={"url": "https://hooks.example/notify"},
        parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    ),
    ask_human_tool("ask_operator", "Ask the operator a question"),
)
# Relaxed: sealing is fast, but the CI machine running these is often busy.
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _request(facts: AgentFacts | None, *, tools: Any = TOOLS, key: DataKey = KEY) -> bytes:
    request = build_request(
        model=MODEL, system_prompt=PROMPT, objective=OBJECTIVE, tools=tools, facts=facts, data_key=key
    )
    return request.canonical_bytes()


def _checkpoint(facts: AgentFacts | None) -> Checkpoint:
    return Checkpoint(
        position=Position(state="ready", step=len(facts.turns) if facts else 0, state_version=1),
        timestamps=Timestamps(created_at=T0, updated_at=T0, entered_state_at=T0),
        agent=facts,
    )


def _round_trip(checkpoint: Checkpoint) -> Checkpoint:
    loaded = load_checkpoint(json.loads(json.dumps(dump_checkpoint(checkpoint))))
    assert isinstance(loaded, Loaded), loaded
    return loaded.checkpoint


# --- facts, from simple turn descriptions -------------------------------------------------------

Turn = tuple[str, dict[str, Any], str | None, SettledOutcome | None, Any]
"""(tool, arguments, reason, outcome (None: pending), result)."""


def _facts(turns: list[Turn]) -> AgentFacts:
    facts = start_facts(model=MODEL, system_prompt=PROMPT, tools=TOOLS)
    for index, (tool, arguments, reason, outcome, result) in enumerate(turns):
        turn = new_turn(
            KEY,
            index=index,
            call_id=f"call_{index}",
            tool=tool,
            arguments=arguments,
            reason=reason,
            step_index=index,
            usage=TokenUsage(input_tokens=100 * (index + 1), output_tokens=7),
            entropy=os.urandom,
        )
        facts = with_turn(facts, turn)
        if outcome is not None:
            facts = settle_last(facts, KEY, outcome=outcome, result=result, entropy=os.urandom)
    return facts


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**53) + 1, 2**53 - 1), st.text(max_size=20))
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_turn = st.tuples(
    st.sampled_from([tool.name for tool in TOOLS]),
    st.dictionaries(st.text(max_size=8), _json, max_size=3),
    st.one_of(st.none(), st.text(min_size=1, max_size=40)),
    st.sampled_from(["succeeded", "failed", "refused"]),
    _json,
)
# A pending turn may only be the last one.
_turns = st.tuples(st.lists(_turn, max_size=4), st.booleans()).map(
    lambda pair: [*pair[0][:-1], (*pair[0][-1][:3], None, None)] if pair[0] and pair[1] else pair[0]
)


# --- determinism ---------------------------------------------------------------------------------


@SETTINGS
@given(_turns)
def test_the_same_facts_give_the_same_bytes_also_after_the_checkpoint_round_trip(turns: list[Turn]) -> None:
    facts = _facts(turns)
    first = _request(facts)
    assert _request(facts) == first
    stored = _round_trip(_checkpoint(facts))
    assert stored.agent == facts
    assert _request(stored.agent) == first
    # Sealing again (fresh nonces) changes the checkpoint's bytes but not the request's.
    assert dump_checkpoint(_checkpoint(_facts(turns))) != dump_checkpoint(_checkpoint(facts)) or not turns
    assert _request(_facts(turns)) == first


@SETTINGS
@given(_turns, st.data())
def test_a_changed_result_changes_the_bytes(turns: list[Turn], data: st.DataObject) -> None:
    settled = [index for index, turn in enumerate(turns) if turn[3] is not None]
    if not settled:
        return
    index = data.draw(st.sampled_from(settled))
    tool, arguments, reason, outcome, result = turns[index]
    changed = data.draw(_json.filter(lambda value: canonical_json(value) != canonical_json(result)))
    altered = [*turns[:index], (tool, arguments, reason, outcome, changed), *turns[index + 1 :]]
    assert _request(_facts(altered)) != _request(_facts(turns))


@SETTINGS
@given(_turns, st.data())
def test_a_changed_argument_reason_or_outcome_changes_the_bytes(
    turns: list[Turn], data: st.DataObject
) -> None:
    if not turns:
        return
    index = data.draw(st.integers(0, len(turns) - 1))
    tool, arguments, reason, outcome, result = turns[index]
    what = data.draw(st.sampled_from(["arguments", "reason", "outcome"]))
    if what == "arguments":
        changed: Turn = (tool, {**arguments, "extra-key": 1}, reason, outcome, result)
    elif what == "reason":
        changed = (tool, arguments, (reason or "") + "!", outcome, result)
    else:
        if outcome is None:
            return
        # Turn the result into a pending turn's (only the last turn may be pending).
        if index != len(turns) - 1:
            return
        changed = (tool, arguments, reason, None, None)
    altered = [*turns[:index], changed, *turns[index + 1 :]]
    assert _request(_facts(altered)) != _request(_facts(turns))


@SETTINGS
@given(_turns, st.permutations(TOOLS))
def test_the_order_of_the_declarations_changes_no_byte(
    turns: list[Turn], tools: list[ToolDeclaration]
) -> None:
    facts = _facts(turns)
    assert _request(facts, tools=tools) == _request(facts, tools=TOOLS)


def test_the_request_has_no_clock_and_no_random_id() -> None:
    facts = _facts([("read_configmap", {"name": "settings"}, "look first", "succeeded", {"data": {}})])
    body = json.loads(_request(facts))
    assert [message["role"] for message in body["messages"]] == ["system", "user", "assistant", "tool"]
    assert body["messages"][0]["content"] == PROMPT
    assert body["messages"][1]["content"] == OBJECTIVE
    assert body["parallel_tool_calls"] is False
    assert [tool["function"]["name"] for tool in body["tools"]] == sorted(tool.name for tool in TOOLS)
    # Everything in it comes from the inputs: no field but these.
    assert set(body) == {"model", "messages", "tools", "tool_choice", "parallel_tool_calls"}


# --- what each turn shows the model ----------------------------------------------------------------


def test_a_turn_is_the_models_call_and_its_result() -> None:
    facts = _facts([("notify", {"text": "hi"}, "tell them", "succeeded", {"status": 200})])
    _, _, call, result = json.loads(_request(facts))["messages"]
    assert call == {
        "role": "assistant",
        "content": "tell them",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "notify", "arguments": '{"text":"hi"}'}}
        ],
    }
    assert result == {"role": "tool", "tool_call_id": "call_0", "content": '{"status":200}'}


def test_a_pending_turn_shows_a_fixed_text_and_no_reason_is_null() -> None:
    facts = _facts([("ask_operator", {"question": "May I?"}, None, None, None)])
    _, _, call, result = json.loads(_request(facts))["messages"]
    assert call["content"] is None
    assert result["content"] == '{"status":"pending"}'


def test_a_refused_call_shows_why_and_replays_no_invalid_json() -> None:
    facts = start_facts(model=MODEL, system_prompt=PROMPT, tools=TOOLS)
    turn = new_turn(
        KEY,
        index=0,
        call_id="c1",
        tool="notify",
        arguments="{not json",
        reason=None,
        step_index=0,
        refusal="the arguments are not valid JSON",
        entropy=os.urandom,
    )
    facts = with_turn(facts, turn)
    _, _, call, result = json.loads(_request(facts))["messages"]
    assert call["tool_calls"][0]["function"]["arguments"] == "{}"
    assert json.loads(result["content"]) == {
        "status": "refused",
        "reason": "the arguments are not valid JSON",
    }
    assert facts.tool_errors == 1


def test_further_calls_of_a_reply_are_replayed_each_answered_not_executed() -> None:
    """Issue 30 (6): a reply with several calls had all but the first dropped silently; the model
    believed they ran. Each is now replayed with a result that says it was not executed, in a
    conversation a chat-completions server accepts (each call answered, IDs unique)."""
    facts = start_facts(model=MODEL, system_prompt=PROMPT, tools=TOOLS)
    turn = new_turn(
        KEY,
        index=0,
        call_id="call_0",
        tool="read_configmap",
        arguments={"name": "settings"},
        reason="look first",
        step_index=0,
        dropped_tools=("notify", "notify"),
        entropy=os.urandom,
    )
    facts = settle_last(
        with_turn(facts, turn), KEY, outcome="succeeded", result={"data": {}}, entropy=os.urandom
    )
    messages = json.loads(_request(facts))["messages"]
    _, _, call, result, *told = messages
    ids = [c["id"] for c in call["tool_calls"]]
    assert [c["function"]["name"] for c in call["tool_calls"]] == ["read_configmap", "notify", "notify"]
    assert ids == ["call_0", "drop00000", "drop00001"]
    assert [c["function"]["arguments"] for c in call["tool_calls"][1:]] == ["{}", "{}"]
    assert result == {"role": "tool", "tool_call_id": "call_0", "content": '{"data":{}}'}
    assert told == [{"role": "tool", "tool_call_id": i, "content": NOT_EXECUTED} for i in ids[1:]]
    assert json.loads(NOT_EXECUTED)["status"] == "not executed"
    assert _conversation_problem(messages) is None, "the reference server (as the real API) accepts it"


def test_a_turn_with_one_call_records_no_dropped_tools_so_older_digests_hold() -> None:
    facts = _facts([("notify", {"text": "hi"}, "tell them", "succeeded", {"status": 200})])
    assert "droppedTools" not in json.dumps(dump_checkpoint(_checkpoint(facts)))


def test_a_large_result_is_truncated_bounded_and_marked() -> None:
    big = {"items": ['"quoted" \\ text ' * 50 for _ in range(100)]}
    facts = _facts([("read_configmap", {"name": "big"}, None, "succeeded", big)])
    turn = facts.turns[0]
    assert turn.result_truncated
    assert isinstance(turn.result, dict)
    assert len(next(iter(turn.result.values()))) <= SEALED_TOKEN_MAX
    content = json.loads(_request(facts))["messages"][-1]["content"]
    assert content.endswith(TRUNCATION_NOTE)
    assert canonical_json(big).decode().startswith(content.removesuffix(TRUNCATION_NOTE))
    small = _facts([("read_configmap", {"name": "small"}, None, "succeeded", {"a": 1})])
    assert not small.turns[0].result_truncated


@SETTINGS
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40_000))
def test_a_bounded_result_fits_its_limit_and_is_a_prefix(text: str) -> None:
    plain, truncated = bound_result(text)
    assert len(canonical_json(plain)) <= RESULT_MAX_BYTES
    whole = canonical_json(text).decode()
    if truncated:
        assert whole.startswith(plain["truncated"])
    else:
        assert plain == {"value": text}


# --- sealed at rest, open only in the request ------------------------------------------------------


@SETTINGS
@given(st.lists(st.sampled_from(["succeeded", "failed", "refused"]), min_size=1, max_size=4), st.uuids())
def test_sealed_values_never_appear_in_the_checkpoint_but_do_in_the_request(
    outcomes: list[SettledOutcome], nonce: Any
) -> None:
    secret = f"SECRET{nonce.hex}"
    turns: list[Turn] = [
        ("notify", {"text": f"{secret}-arg-{i}"}, f"{secret}-why-{i}", outcome, {"echo": f"{secret}-out-{i}"})
        for i, outcome in enumerate(outcomes)
    ]
    checkpoint = _checkpoint(_facts(turns))
    stored = json.dumps(dump_checkpoint(checkpoint))
    assert secret not in stored
    assert "sealed:v1:" in stored
    request = _request(_round_trip(checkpoint).agent).decode()
    for i in range(len(turns)):
        for part in ("arg", "why", "out"):
            assert f"{secret}-{part}-{i}" in request


@pytest.mark.parametrize("plaintext", [{"text": "hi"}, "hi", {"durable-agents.io/sealed": "hi"}])
def test_plaintext_in_a_sealed_field_does_not_validate(plaintext: Any) -> None:
    facts = _facts([("notify", {"text": "hi"}, "why", "succeeded", {"ok": True})])
    raw = facts.model_dump(mode="json", by_alias=True)
    raw["turns"][0]["arguments"] = plaintext
    with pytest.raises(ValueError, match="never plaintext"):
        AgentFacts.model_validate(raw)


def test_another_runs_key_cannot_rebuild_the_context() -> None:
    facts = _facts([("notify", {"text": "hi"}, "why", "succeeded", {"ok": True})])
    with pytest.raises(ValueSealingError):
        _request(facts, key=OTHER_KEY)


def test_a_sealed_value_moved_to_another_turn_does_not_open() -> None:
    facts = _facts(
        [
            ("notify", {"text": "one"}, None, "succeeded", {"n": 1}),
            ("notify", {"text": "two"}, None, "succeeded", {"n": 2}),
        ]
    )
    first, second = facts.turns
    swapped = second.model_copy(update={"arguments": first.arguments})
    forged = facts.model_copy(update={"turns": [first, swapped]})
    with pytest.raises(ValueSealingError):
        _request(forged)


# --- the configuration the facts were recorded under ---------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"model": "model-2031-01"},
        {"system_prompt": PROMPT + " Be brief."},
        {"tools": TOOLS[:2]},
        {
            "tools": (
                *TOOLS[:1],
                effect_tool(
                    "notify",
                    "Post a message",
                    effect="http.post",
                    target={"url": "https://elsewhere.example/"},
                    parameters=TOOLS[1].parameters,
                ),
                TOOLS[2],
            )
        },
    ],
    ids=["model", "prompt", "tool-removed", "target-changed"],
)
def test_facts_of_another_configuration_are_not_fed_to_the_model(change: dict[str, Any]) -> None:
    facts = _facts([("notify", {"text": "hi"}, None, "succeeded", {"ok": True})])
    arguments: dict[str, Any] = {"model": MODEL, "system_prompt": PROMPT, "tools": TOOLS, **change}
    with pytest.raises(ContextMismatch):
        build_request(objective=OBJECTIVE, facts=facts, data_key=KEY, **arguments)


def test_a_first_request_has_no_turns() -> None:
    body = json.loads(_request(None))
    assert [message["role"] for message in body["messages"]] == ["system", "user"]


# --- the checkpoint field ------------------------------------------------------------------------


def test_a_checkpoint_without_agent_facts_stores_no_agent_key() -> None:
    stored = dump_checkpoint(_checkpoint(None))
    assert "agent" not in stored
    assert _round_trip(_checkpoint(None)).agent is None


def test_the_integrity_stamp_covers_the_agent_facts() -> None:
    keyring = Keyring(keys={"k": bytes(range(32))}, active_key_id="k")
    facts = _facts([("notify", {"text": "hi"}, None, "succeeded", {"ok": True})])
    stamped = dump_checkpoint(stamp_checkpoint(_checkpoint(facts), keyring=keyring, run_id="run-1"))
    assert verify_integrity(stamped, keyring=keyring, run_id="run-1") is None
    stamped["agent"]["toolErrors"] = 0 if facts.tool_errors else 1
    assert verify_integrity(stamped, keyring=keyring, run_id="run-1") is not None


def test_turns_are_numbered_in_order_and_only_the_last_may_be_pending() -> None:
    facts = _facts(
        [
            ("notify", {"text": "one"}, None, "succeeded", {"n": 1}),
            ("notify", {"text": "two"}, None, None, None),
        ]
    )
    raw = facts.model_dump(mode="json", by_alias=True)
    with pytest.raises(ValueError, match="numbered"):
        AgentFacts.model_validate({**raw, "turns": raw["turns"][::-1]})
    pending_first = [ModelTurn.model_validate(raw["turns"][1]).model_dump(mode="json", by_alias=True)]
    pending_first[0]["index"] = 0
    with pytest.raises(ValueError, match="pending"):
        AgentFacts.model_validate({**raw, "turns": [*pending_first, {**raw["turns"][0], "index": 1}]})
