"""The stateless round trip of the 2026-07-28 protocol through the SDK against the asking reference
server (loopback): a call that needs input raises McpInputRequired with the question and the
opaque state; the retry with the answer, the echoed state and the same key applies once; a form
that is not flat is refused and the server told; a server that asks forever is bounded."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from durable_agents.core.agent.mcp_elicitation import MAX_INPUT_ROUNDS, ElicitationAnswer, parse_answer
from durable_agents.shell.agent.mcp_elicitation import InputAsked, input_required, input_responses
from durable_agents.shell.agent.mcp_tools import McpInputRequired, McpResult, call_tool
from durable_agents.shell.effects.base import Action, Applied, EffectContext, InputRequired
from durable_agents.shell.effects.mcp import INPUT_EXTRA, McpCall, McpInputAnswers
from durable_agents_testkit.mcpasking import LINK, STAY_SCHEMA, AskingServerThread

pytestmark = pytest.mark.unit

TIMEOUT = 30.0


@pytest.fixture
def server() -> Iterator[AskingServerThread]:
    with AskingServerThread() as running:
        yield running


async def ask(server: AskingServerThread, tool: str, key: str | None = None, **arguments: str) -> InputAsked:
    with pytest.raises(McpInputRequired) as raised:
        await call_tool(
            server.url, tool, dict(arguments), idempotency_key=key, timeout=TIMEOUT, server="hotel"
        )
    return raised.value.asked


async def retry(
    server: AskingServerThread,
    tool: str,
    asked: InputAsked,
    answers: dict[str, ElicitationAnswer],
    key: str | None,
    **arguments: str,
) -> McpResult:
    return await call_tool(
        server.url,
        tool,
        dict(arguments),
        idempotency_key=key,
        timeout=TIMEOUT,
        server="hotel",
        input_responses=input_responses(answers, asked.refused),
        request_state=asked.request_state,
    )


async def test_the_call_is_retried_with_the_answer_and_the_same_key_applied_once(
    server: AskingServerThread,
) -> None:
    asked = await ask(server, "book_room", "key-1", room="7")
    (question,) = asked.questions
    assert (question.server, question.tool, question.key) == ("hotel", "book_room", "stay")
    assert question.schema == STAY_SCHEMA
    assert "room 7" in question.message
    assert asked.request_state
    assert not asked.refused
    assert server.applications() == []
    answer = parse_answer(
        question.schema, json.dumps({"action": "accept", "content": {"date": "2026-12-24", "nights": 2}})
    )
    assert isinstance(answer, ElicitationAnswer)
    first = await retry(server, "book_room", asked, {"stay": answer}, "key-1", room="7")
    again = await retry(
        server, "book_room", asked, {"stay": answer}, "key-1", room="7"
    )  # a retry after a lost answer
    assert not first.is_error
    assert first.content == again.content
    assert json.loads(first.content)["nights"] == 2
    assert server.applications() == ["key-1"]


async def test_a_declined_question_applies_nothing(server: AskingServerThread) -> None:
    asked = await ask(server, "book_room", "key-2", room="8")
    result = await retry(
        server, "book_room", asked, {"stay": ElicitationAnswer("decline")}, "key-2", room="8"
    )
    assert result.is_error
    assert "decline" in result.content
    assert server.applications() == []


async def test_a_form_that_is_not_flat_is_refused_and_the_server_told(server: AskingServerThread) -> None:
    asked = await ask(server, "ask_nested")
    assert asked.questions == []
    assert "properties.address.type: 'object' is not a primitive" in asked.refused["address"]
    result = await retry(server, "ask_nested", asked, {}, None)
    assert result.content == "the client refused the form (decline)"


async def test_a_url_request_is_a_link_for_the_person(server: AskingServerThread) -> None:
    asked = await ask(server, "ask_link")
    (question,) = asked.questions
    assert question.url == LINK
    assert question.schema is None
    result = await retry(server, "ask_link", asked, {"pay": ElicitationAnswer("accept")}, None)
    assert result.content == "linked"


async def test_a_server_that_asks_forever_is_seen_round_after_round(server: AskingServerThread) -> None:
    # Each round is a new question under a new key: the caller counts rounds against MAX_INPUT_ROUNDS.
    asked = await ask(server, "ask_forever")
    keys = [asked.questions[0].key]
    for _ in range(MAX_INPUT_ROUNDS):
        with pytest.raises(McpInputRequired) as raised:
            await retry(server, "ask_forever", asked, {keys[-1]: ElicitationAnswer("cancel")}, None)
        asked = raised.value.asked
        keys.append(asked.questions[0].key)
    assert len(set(keys)) == MAX_INPUT_ROUNDS + 1


async def test_an_approved_call_that_asks_for_input_is_asked_then_sent_again_with_the_answer(
    server: AskingServerThread,
) -> None:
    # What the ledger is told: nothing was applied (the round trip is stateless), the questions as
    # a person reads them and the state to echo; the retry carries the answer under the same key.
    ctx = EffectContext(kube=None, namespace="ns", service_account="sa")  # type: ignore[arg-type]
    action = Action("key-3", {"server": "hotel", "url": server.url, "tool": "book_room"}, {"room": "9"})
    result = await McpCall().dispatch(ctx, action)
    assert isinstance(result, InputRequired)
    assert sorted(result.questions) == ["stay"]
    assert json.loads(result.questions["stay"])["requestedSchema"]["required"] == ["date", "nights"]
    assert (result.refused, server.applications()) == ({}, [])
    answer = ElicitationAnswer("accept", {"date": "2030-02-01", "nights": 2})
    retry_ctx = EffectContext(
        kube=None,  # type: ignore[arg-type]
        namespace="ns",
        service_account="sa",
        extra={INPUT_EXTRA: McpInputAnswers({"stay": answer}, [], result.request_state)},
    )
    for _ in range(2):  # the same key twice: the same booking, applied once
        booked = await McpCall().dispatch(retry_ctx, action)
        assert isinstance(booked, Applied), booked
    assert server.applications() == ["key-3"]


def test_sampling_and_roots_requests_are_not_questions_for_a_person() -> None:
    from mcp_types import (
        CreateMessageRequest,
        CreateMessageRequestParams,
        InputRequiredResult,
        ListRootsRequest,
        SamplingMessage,
        TextContent,
    )

    sample = CreateMessageRequest(
        params=CreateMessageRequestParams(
            messages=[SamplingMessage(role="user", content=TextContent(text="hi"))], max_tokens=10
        )
    )
    result = InputRequiredResult(input_requests={"s": sample, "r": ListRootsRequest()}, request_state="x")
    asked = input_required("hotel", "book_room", result)
    assert asked.questions == []
    assert sorted(asked.refused) == ["r", "s"]
    assert "sampling/createMessage is not served" in asked.refused["s"]
    assert {key: response.action for key, response in input_responses({}, asked.refused).items()} == {
        "r": "decline",
        "s": "decline",
    }


async def test_a_server_that_only_says_not_yet_is_retried_with_its_state_within_the_bound(
    server: AskingServerThread,
) -> None:
    result = await call_tool(
        server.url, "ask_later", {"rounds": "3"}, idempotency_key=None, timeout=TIMEOUT, server="hotel"
    )
    assert result.content == "ready after 3"
    with pytest.raises(McpInputRequired) as raised:
        await call_tool(
            server.url,
            "ask_later",
            {"rounds": str(MAX_INPUT_ROUNDS + 5)},
            idempotency_key=None,
            timeout=TIMEOUT,
            server="hotel",
        )
    assert f"asked only to be retried with its request state, {MAX_INPUT_ROUNDS} times" in str(raised.value)
