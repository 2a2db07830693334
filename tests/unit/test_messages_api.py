"""The Anthropic Messages API translation (core/agent/messages_api.py): the core's request as a
Messages API body the API accepts, read back by the reference model server's independent
translation into exactly the request the core built; a reply's blocks as the core's plain values."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st

from durable_agents.core.agent.exchange import ModelRequest
from durable_agents.core.agent.messages_api import NotAMessage, messages_body, reply_of_message
from durable_agents_testkit.modelserver_messages import _problem, neutral

pytestmark = pytest.mark.unit

_names = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)
_ids = st.from_regex(r"[A-Za-z0-9_-]{1,24}", fullmatch=True)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_arguments = st.dictionaries(st.text(max_size=8), _json, max_size=4)


@st.composite
def _turn(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One turn as the core writes it: the model's call (maybe with dropped further calls), and a
    ``tool`` message per call, in order."""
    ids = draw(st.lists(_ids, min_size=1, max_size=3, unique=True))
    calls = [
        {
            "id": call_id,
            "type": "function",
            "function": {"name": draw(_names), "arguments": rfc8785.dumps(draw(_arguments)).decode()},
        }
        for call_id in ids
    ]
    reason = draw(st.none() | st.text(min_size=1, max_size=30).filter(str.strip))
    results = [{"role": "tool", "tool_call_id": i, "content": draw(st.text(max_size=30))} for i in ids]
    return [{"role": "assistant", "content": reason, "tool_calls": calls}, *results]


@st.composite
def _requests(draw: st.DrawFn) -> ModelRequest:
    turns = draw(st.lists(_turn(), max_size=4))
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": draw(st.text(max_size=20)),
                "parameters": {"type": "object"},
            },
        }
        for name in draw(st.lists(_names, max_size=3, unique=True))
    ]
    messages = [
        {"role": "system", "content": draw(st.text(min_size=1, max_size=40))},
        {"role": "user", "content": draw(st.text(min_size=1, max_size=40))},
        *(m for turn in turns for m in turn),
    ]
    return ModelRequest(model=draw(_names), messages=tuple(messages), tools=tuple(tools))


@given(_requests())
def test_a_request_goes_over_and_comes_back_as_the_core_built_it(request: ModelRequest) -> None:
    body = messages_body(request)
    assert _problem(body["messages"]) is None, "the API's rules: alternating roles, results next"
    assert body["tool_choice" if request.tools else "model"] is not None
    assert json.loads(json.dumps(body)) == body, "plain JSON"
    # The server's translation back is the core's request (its chat-completions body, without the
    # choice options that shape has no Messages API twin for).
    sent = request.body()
    sent.pop("tool_choice", None)
    sent.pop("parallel_tool_calls", None)
    assert neutral(body) == sent


def test_the_shape_of_one_turn() -> None:
    request = ModelRequest(
        model="claude-x",
        messages=(
            {"role": "system", "content": "You refund."},
            {"role": "user", "content": "Refund A-1."},
            {
                "role": "assistant",
                "content": "The order first.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "read", "arguments": '{"n":1}'},
                    },
                    {"id": "drop00010", "type": "function", "function": {"name": "read", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "shipped"},
            {"role": "tool", "tool_call_id": "drop00010", "content": "not executed"},
        ),
        tools=(
            {
                "type": "function",
                "function": {"name": "read", "description": "R", "parameters": {"type": "object"}},
            },
        ),
    )
    assert messages_body(request) == {
        "model": "claude-x",
        "max_tokens": 4096,
        "system": "You refund.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Refund A-1."}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "The order first."},
                    {"type": "tool_use", "id": "call_1", "name": "read", "input": {"n": 1}},
                    {"type": "tool_use", "id": "drop00010", "name": "read", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "shipped"},
                    {"type": "tool_result", "tool_use_id": "drop00010", "content": "not executed"},
                ],
            },
        ],
        "tools": [{"name": "read", "description": "R", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    }


def test_a_call_id_the_api_would_refuse_maps_alike_in_use_and_result() -> None:
    call = {"id": "fc.1:a", "type": "function", "function": {"name": "t", "arguments": "not json"}}
    request = ModelRequest(
        model="m",
        messages=(
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "fc.1:a", "content": "refused"},
        ),
    )
    body = messages_body(request)
    use, result = body["messages"][1]["content"][0], body["messages"][2]["content"][0]
    assert use == {"type": "tool_use", "id": "fc_1_a", "name": "t", "input": {}}
    assert result["tool_use_id"] == "fc_1_a"
    assert "system" not in body
    assert "tools" not in body


def test_a_reply_with_text_and_a_tool_use() -> None:
    reply = reply_of_message(
        {
            "type": "message",
            "model": "claude-x",
            "content": [
                {"type": "thinking", "thinking": "…"},
                {"type": "text", "text": "Reading "},
                {"type": "text", "text": "the order."},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"name": "é", "n": [1]}},
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 12, "output_tokens": 7},
        }
    )
    assert reply.model == "claude-x"
    assert reply.content == "Reading the order."
    assert reply.finish_reason == "tool_use"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (12, 7)
    [call] = reply.tool_calls
    assert (call.id, call.name, json.loads(call.arguments_text)) == (
        "toolu_1",
        "read",
        {"name": "é", "n": [1]},
    )


def test_an_empty_reply_is_empty_and_not_a_final_answer() -> None:
    assert reply_of_message({"type": "message", "content": [], "stop_reason": "end_turn"}).is_empty


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ([], "the reply is list"),
        ({"type": "error", "error": {}}, "its type is 'error'"),
        ({"type": "message"}, "content is NoneType"),
        ({"content": ["text"]}, "content[0] is str"),
        ({"content": [{"type": "text", "text": 3}]}, "content[0].text is int"),
        ({"content": [{"type": "tool_use", "id": 1, "name": "t"}]}, "content[0].id is int"),
        ({"content": [], "usage": {"input_tokens": -1}}, "usage.input_tokens is not a token count"),
        ({"content": [], "usage": {"output_tokens": True}}, "usage.output_tokens is bool"),
        ({"content": [], "stop_reason": 5}, "stop_reason is int"),
    ],
)
def test_what_is_not_a_message_is_said(value: Any, said: str) -> None:
    with pytest.raises(NotAMessage, match="^" + re.escape(said)):
        reply_of_message(value)
