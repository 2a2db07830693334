"""The 2025-11-25 path (issue 36, item 1): a server sends ``elicitation/create`` while the call is
open; :class:`HoldOpen`, the SDK's elicitation callback, holds the call open while a person
answers, up to a bound, refuses a form that is not flat with an error the server is told, and
refuses past the rounds bound. Over the wire (loopback, the asking reference server), on a session
forced to the initialize handshake (``mode="legacy"``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from durable_agents.core.agent.mcp_elicitation import (
    MAX_INPUT_ROUNDS,
    ElicitationAnswer,
    ElicitationQuestion,
)
from durable_agents.shell.agent.mcp_elicitation import AskPerson, HoldOpen
from durable_agents_testkit.mcpasking import STAY_SCHEMA, AskingServerThread

pytestmark = pytest.mark.unit


@pytest.fixture
def server() -> Iterator[AskingServerThread]:
    with AskingServerThread() as running:
        yield running


async def ask_open(server: AskingServerThread, hold: HoldOpen, form: str = "flat") -> str:
    transport = streamable_http_client(server.url)
    async with Client(transport, mode="legacy", elicitation_callback=hold) as client:
        result = await client.call_tool("ask_open", {"form": form})
    (part,) = result.content
    return str(part.text)  # type: ignore[union-attr]


def person(answer: ElicitationAnswer, asked: list[ElicitationQuestion]) -> AskPerson:
    async def ask(question: ElicitationQuestion) -> ElicitationAnswer:
        asked.append(question)
        return answer

    return ask


async def test_the_call_is_held_open_while_the_person_answers(server: AskingServerThread) -> None:
    asked: list[ElicitationQuestion] = []
    stay = ElicitationAnswer("accept", {"date": "2026-12-24", "nights": 2})
    said = await ask_open(server, HoldOpen("hotel", "ask_open", person(stay, asked), hold=30))
    assert said == 'accept {"date": "2026-12-24", "nights": 2}'
    (question,) = asked
    assert (question.server, question.tool, question.message) == ("hotel", "ask_open", "When do you arrive?")
    assert question.schema == STAY_SCHEMA


async def test_a_form_that_is_not_flat_is_refused_with_an_error_told_to_the_server(
    server: AskingServerThread,
) -> None:
    asked: list[ElicitationQuestion] = []
    hold = HoldOpen("hotel", "ask_open", person(ElicitationAnswer("decline"), asked), hold=30)
    said = await ask_open(server, hold, form="nested")
    assert said.startswith("error: refused: requestedSchema.properties.address.type: 'object'"), said
    assert asked == [], "no person is asked a form that is not flat"


async def test_a_person_who_does_not_answer_within_the_bound_is_a_cancel(server: AskingServerThread) -> None:
    async def never(question: ElicitationQuestion) -> ElicitationAnswer:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    assert await ask_open(server, HoldOpen("hotel", "ask_open", never, hold=0.5)) == "cancel"


async def test_past_the_rounds_bound_every_request_is_refused(server: AskingServerThread) -> None:
    asked: list[ElicitationQuestion] = []
    hold = HoldOpen("hotel", "ask_open", person(ElicitationAnswer("decline"), asked), hold=30)
    hold.rounds = MAX_INPUT_ROUNDS
    said = await ask_open(server, hold)
    assert said == f"error: refused: more than {MAX_INPUT_ROUNDS} requests for input in one call"
    assert asked == []
