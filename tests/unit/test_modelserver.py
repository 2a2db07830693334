"""The reference model server, through the official ``openai`` client: scripted answers, rule
selection, deterministic ids and usage, API key, injected faults, counts, script files and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import openai
import pytest
import rfc8785
from openai.types.chat import ChatCompletion

from durable_agents_testkit import modelserver
from durable_agents_testkit.modelserver import NO_SCRIPTED_REPLY, FaultMode, ModelServerThread, Script

pytestmark = pytest.mark.unit

MODEL = "scripted-planner"
KEY = "test-key"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": {"orderId": {"type": "string"}}},
        },
    }
    for name in ("lookup_order", "refund")
]
OFFERED = {"lookup_order", "refund"}
SCRIPT: dict[str, Any] = {
    "model": MODEL,
    "rules": [
        {
            "when": {"notCalled": ["lookup_order"], "userContains": "order"},
            "toolCalls": [{"name": "lookup_order", "arguments": {"orderId": "A-1"}}],
        },
        {
            "when": {"called": ["lookup_order"], "notCalled": ["refund"], "lastToolResultContains": "lost"},
            "toolCalls": [{"name": "refund", "arguments": {"orderId": "A-1", "amount": 25}}],
        },
        {"when": {"called": ["lookup_order", "refund"]}, "content": "Refunded."},
        {"when": {"lastToolResultContains": "shipped"}, "content": "Your order has shipped."},
    ],
}
ASK: list[Any] = [
    {"role": "system", "content": "You help with orders."},
    {"role": "user", "content": "Where is my order?"},
]


@pytest.fixture
def server() -> Iterator[ModelServerThread]:
    with ModelServerThread(SCRIPT, api_key=KEY) as running:
        yield running


@pytest.fixture
async def client(server: ModelServerThread) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=5.0) as c:
        yield c


async def complete(client: openai.AsyncOpenAI, messages: list[Any]) -> ChatCompletion:
    return await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)


def answered(messages: list[Any], completion: ChatCompletion, *results: str) -> list[Any]:
    """``messages`` followed by the completion's tool calls and one ``tool`` result for each."""
    calls = completion.choices[0].message.tool_calls or []
    assert len(calls) == len(results)
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [c.model_dump(include={"id", "type", "function"}) for c in calls],
    }
    tools = [
        {"role": "tool", "tool_call_id": c.id, "content": r} for c, r in zip(calls, results, strict=True)
    ]
    return [*messages, assistant, *tools]


def only_call(completion: ChatCompletion) -> tuple[str, str]:
    calls = completion.choices[0].message.tool_calls
    assert calls is not None
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function"
    return call.function.name, call.function.arguments


async def test_a_scripted_tool_call_comes_back_parsed(client: openai.AsyncOpenAI) -> None:
    completion = await complete(client, ASK)

    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    assert completion.id.startswith("chatcmpl-")
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.role == "assistant"
    assert choice.message.content is None
    name, arguments = only_call(completion)
    assert name == "lookup_order"
    assert json.loads(arguments) == {"orderId": "A-1"}


async def test_rules_are_chosen_by_the_tool_calls_and_results_so_far(
    client: openai.AsyncOpenAI, server: ModelServerThread
) -> None:
    first = await complete(client, ASK)

    shipped = await complete(client, answered(ASK, first, "status: shipped"))
    assert shipped.choices[0].finish_reason == "stop"
    assert shipped.choices[0].message.content == "Your order has shipped."
    assert shipped.choices[0].message.tool_calls is None

    lost = answered(ASK, first, "status: lost in transit")
    refund = await complete(client, lost)
    name, arguments = only_call(refund)
    assert (name, json.loads(arguments)) == ("refund", {"orderId": "A-1", "amount": 25})

    done = await complete(client, answered(lost, refund, "refund issued"))
    assert done.choices[0].message.content == "Refunded."

    # No rule for a user who never mentions an order: the fallback, counted as unmatched.
    other = await complete(client, [{"role": "user", "content": "Hello"}])
    assert other.choices[0].message.content == NO_SCRIPTED_REPLY
    assert other.choices[0].finish_reason == "stop"
    calls = server.calls()
    assert (calls["total"], calls["unmatched"]) == (5, 1)
    assert calls["byRule"] == {"0": 1, "1": 1, "2": 1, "3": 1}


async def test_times_uses_up_a_rule_so_a_replay_gets_the_next_one(
    client: openai.AsyncOpenAI, server: ModelServerThread
) -> None:
    call = {"name": "refund", "arguments": {"orderId": "A-1", "amount": 25}}
    changed = {"name": "refund", "arguments": {"orderId": "A-1", "amount": 40}}
    server.set_script(
        {"model": MODEL, "rules": [{"toolCalls": [call], "times": 1}, {"toolCalls": [changed]}]}
    )

    before = await complete(client, ASK)
    replay = await complete(client, ASK)
    again = await complete(client, ASK)

    assert json.loads(only_call(before)[1])["amount"] == 25
    assert json.loads(only_call(replay)[1])["amount"] == 40
    assert json.loads(only_call(again)[1])["amount"] == 40
    assert server.calls()["byRule"] == {"0": 1, "1": 2}
    # The changed proposal is a different call: it never reuses the first call's id.
    assert replay.choices[0].message.tool_calls != before.choices[0].message.tool_calls
    assert replay.id != before.id


async def test_ids_are_digests_of_the_request_and_answer(client: openai.AsyncOpenAI) -> None:
    first = await complete(client, ASK)
    replay = await complete(client, ASK)
    other = await complete(client, [*ASK[:1], {"role": "user", "content": "Where is my order A-1?"}])

    def call_ids(completion: ChatCompletion) -> list[str]:
        return [c.id for c in completion.choices[0].message.tool_calls or []]

    assert replay.id == first.id
    assert call_ids(replay) == call_ids(first)
    assert call_ids(first)[0].startswith("call_")
    # The same answer to a different request gets other ids.
    assert only_call(other) == only_call(first)
    assert other.id != first.id
    assert call_ids(other) != call_ids(first)


async def test_usage_counts_bytes_of_the_canonical_request_and_reply(
    client: openai.AsyncOpenAI, server: ModelServerThread
) -> None:
    first = await complete(client, ASK)
    replay = await complete(client, ASK)
    longer = await complete(client, [*ASK, {"role": "user", "content": "Please look it up quickly." * 20}])

    assert first.usage is not None
    assert longer.usage is not None
    assert first.usage == replay.usage
    sent = server.calls()["requests"][0]
    assert first.usage.prompt_tokens == len(rfc8785.dumps(sent)) // 4
    reply = first.choices[0].message.model_dump(include={"role", "content", "tool_calls"})
    assert first.usage.completion_tokens == len(rfc8785.dumps(reply)) // 4
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    assert longer.usage.prompt_tokens > first.usage.prompt_tokens + 100


async def test_the_api_key_is_required(server: ModelServerThread) -> None:
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="wrong", max_retries=0, timeout=5.0) as c:
        with pytest.raises(openai.AuthenticationError) as refused:
            await complete(c, ASK)
        with pytest.raises(openai.AuthenticationError):
            await c.models.list()
    assert refused.value.code == "invalid_api_key"
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.base_url}/chat/completions", json={"model": MODEL}) as response,
    ):
        assert response.status == 401
        error = (await response.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert server.calls()["total"] == 0


async def test_models_lists_the_script_model_and_other_models_are_unknown(client: openai.AsyncOpenAI) -> None:
    assert [m.id async for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="gpt-4o", messages=ASK)


async def test_streaming_is_refused(client: openai.AsyncOpenAI, server: ModelServerThread) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, stream=True)
    assert refused.value.status_code == 400
    assert refused.value.code == "unsupported_parameter"
    assert server.calls()["total"] == 0


async def test_conversations_the_real_api_refuses_are_refused(client: openai.AsyncOpenAI) -> None:
    first = await complete(client, ASK)
    conversation = answered(ASK, first, "status: shipped")
    with pytest.raises(openai.BadRequestError, match="tool"):
        await complete(client, conversation[:-1])  # the tool call has no answer
    stray = {"role": "tool", "tool_call_id": "call_unknown", "content": "x"}
    with pytest.raises(openai.BadRequestError, match="tool"):
        await complete(client, [*ASK, stray])


async def test_error_fault_answers_500_then_the_script_again(
    client: openai.AsyncOpenAI, server: ModelServerThread
) -> None:
    server.inject(FaultMode.ERROR, times=2)

    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            await complete(client, ASK)
    assert only_call(await complete(client, ASK))[0] == "lookup_order"
    calls = server.calls()
    # The failed requests are counted, but used no rule.
    assert (calls["total"], calls["byRule"]["0"]) == (3, 1)


async def test_slow_fault_makes_the_client_time_out(
    client: openai.AsyncOpenAI, server: ModelServerThread
) -> None:
    server.inject("slow", delay=1.0)

    with pytest.raises(openai.APITimeoutError):
        await complete(client.with_options(timeout=0.2), ASK)
    assert only_call(await complete(client, ASK))[0] == "lookup_order"
    assert server.call(lambda: server.server.faults) == []


async def test_drop_fault_closes_the_connection(
    client: openai.AsyncOpenAI, server: ModelServerThread
) -> None:
    server.inject("drop")

    with pytest.raises(openai.APIConnectionError) as dropped:
        await complete(client, ASK)
    assert not isinstance(dropped.value, openai.APITimeoutError)
    assert only_call(await complete(client, ASK))[0] == "lookup_order"


async def test_malformed_fault_breaks_the_arguments(
    client: openai.AsyncOpenAI, server: ModelServerThread
) -> None:
    server.inject("malformed")

    name, arguments = only_call(await complete(client, ASK))
    assert name == "lookup_order"
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)
    assert json.loads(only_call(await complete(client, ASK))[1]) == {"orderId": "A-1"}


async def test_unknown_tool_fault_calls_a_tool_not_offered(
    client: openai.AsyncOpenAI, server: ModelServerThread
) -> None:
    server.inject("unknown_tool")
    server.set_script({"model": MODEL, "rules": [{"content": "No tool needed."}]})

    completion = await complete(client, ASK)
    name, _ = only_call(completion)
    assert name not in OFFERED
    assert completion.choices[0].finish_reason == "tool_calls"


async def test_a_fault_with_match_waits_for_a_matching_last_message(
    client: openai.AsyncOpenAI, server: ModelServerThread
) -> None:
    server.inject("error", match="lost")

    first = await complete(client, ASK)  # the last message does not mention "lost"
    with pytest.raises(openai.InternalServerError):
        await complete(client, answered(ASK, first, "status: lost"))
    assert only_call(await complete(client, answered(ASK, first, "status: lost")))[0] == "refund"


async def test_counts_requests_and_reset(client: openai.AsyncOpenAI, server: ModelServerThread) -> None:
    await complete(client, ASK)
    await complete(client, [{"role": "user", "content": "Hello"}])
    server.inject("error")

    calls = server.calls()
    assert (calls["total"], calls["unmatched"], calls["byRule"]["0"]) == (2, 1, 1)
    assert [r["messages"][-1]["content"] for r in calls["requests"]] == ["Where is my order?", "Hello"]
    assert calls["requests"][0]["tools"] == TOOLS
    assert calls["byProtocol"] == {"openai-chat": 2}

    server.reset()
    empty = {"total": 0, "unmatched": 0, "byRule": dict.fromkeys("0123", 0), "byProtocol": {}, "requests": []}
    assert server.calls() == empty
    # The queued fault went too.
    assert only_call(await complete(client, ASK))[0] == "lookup_order"


async def test_the_control_endpoints_over_http(client: openai.AsyncOpenAI, server: ModelServerThread) -> None:
    root = server.base_url.removesuffix("/v1")
    async with aiohttp.ClientSession() as http:
        script = {"model": MODEL, "rules": [{"content": "Replaced."}]}
        async with http.post(f"{root}/script", json=script) as response:
            assert (response.status, await response.json()) == (200, {"model": MODEL, "rules": 1})
        async with http.post(f"{root}/script", json={"model": MODEL, "rules": [{"times": 0}]}) as response:
            assert response.status == 400
        async with http.post(f"{root}/faults", json={"mode": "error", "times": 2, "match": "x"}) as response:
            assert response.status == 201
            assert (await response.json())["pending"] == [
                {"mode": "error", "times": 2, "delay": 5.0, "match": "x"}
            ]
        async with http.post(f"{root}/faults", json={"mode": "sideways"}) as response:
            assert response.status == 400
        async with http.delete(f"{root}/faults") as response:
            assert (await response.json()) == {"pending": []}
        assert (await complete(client, ASK)).choices[0].message.content == "Replaced."
        async with http.get(f"{root}/calls") as response:
            calls = await response.json()
        assert (calls["total"], calls["byRule"]) == (1, {"0": 1})
        async with http.post(f"{root}/reset") as response:
            assert response.status == 200
    assert server.calls()["total"] == 0


def test_script_from_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "script.yaml"
    path.write_text(
        f"model: {MODEL}\n"
        "rules:\n"
        "  - when: {notCalled: [lookup_order]}\n"
        "    toolCalls:\n"
        "      - {name: lookup_order, argumentsText: '{\"orderId\": '}\n"
        "    times: 1\n"
        "  - content: Done.\n"
    )
    script = Script.from_file(path)

    assert script.model == MODEL
    assert [rule.times for rule in script.rules] == [1, None]
    assert script.rules[0].when.not_called == ["lookup_order"]
    assert script.rules[0].tool_calls[0].text == '{"orderId": '
    assert script.rules[1].content == "Done."


@pytest.mark.parametrize(
    "bad",
    [
        {"rules": [{"content": "x", "unknown": 1}]},
        {"rules": [{"content": "x", "times": 0}]},
        {"rules": [{"content": "x", "times": True}]},
        {"rules": [{"toolCalls": [{"name": "t", "arguments": {}, "argumentsText": "{}"}]}]},
        {"rules": [{"when": {"called": "lookup_order"}, "content": "x"}]},
        {"model": ""},
    ],
)
def test_bad_scripts_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="validation error"):
        Script.from_dict(bad)


def test_standalone_main_prints_the_base_url(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    process = subprocess.Popen(
        [sys.executable, "-m", "durable_agents_testkit.modelserver", "--script", str(path), "--api-key", KEY],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(modelserver.__file__).parents[1])},
    )
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:")
        assert base_url.endswith("/v1")
        with openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=5.0) as c:
            completion = c.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS)
        assert only_call(completion)[0] == "lookup_order"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
        if process.stdout is not None:
            process.stdout.close()


def test_the_thread_refuses_a_port_in_use_and_non_loopback_addresses() -> None:
    with ModelServerThread(SCRIPT) as first:
        port = urlsplit(first.base_url).port
        assert port is not None
        with pytest.raises(OSError, match="in use"):
            ModelServerThread(SCRIPT, port=port).start()
    with pytest.raises(ValueError, match="non-loopback"):
        ModelServerThread(SCRIPT, host="0.0.0.0")
    stopped = ModelServerThread(SCRIPT)
    stopped.stop()  # never started: nothing to do
    with pytest.raises(RuntimeError):
        stopped.calls()
