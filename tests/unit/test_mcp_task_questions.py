"""A 2025-11-25 task that waits for input (issue 36 item 2): its server's question comes on the
stream of ``tasks/result`` in the task's session and is answered there; the task goes on and the
same stream brings its result. Against the reference server (server-everything's
``simulate-research-query`` with ``ambiguous``, which asks only a client that declared
elicitation), through the recording proxy: the tool called once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_agents.core.agent.mcp_elicitation import ElicitationAnswer, ElicitationQuestion
from durable_agents.shell.agent.mcp_elicitation import HoldOpen, refuse_elicitation
from durable_agents.shell.agent.mcp_tasks import McpTask, TaskPoll, poll_task
from durable_agents.shell.agent.mcp_tools import McpResult, call_tool
from durable_agents_testkit import mcpeverything
from durable_agents_testkit.eventually import Within, eventually_async
from durable_agents_testkit.mcpeverything import EverythingServer
from durable_agents_testkit.mcprecorder import RecordingProxy

pytestmark = pytest.mark.unit

TOOL = "simulate-research-query"
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def everything_entry() -> Path:
    return mcpeverything.install()


@pytest.fixture
def proxy(everything_entry: Path) -> Iterator[RecordingProxy]:
    with EverythingServer(everything_entry) as server, RecordingProxy(server.url) as recording:
        yield recording


async def _ambiguous(proxy: RecordingProxy) -> McpTask:
    answer = await call_tool(
        proxy.url,
        TOOL,
        {"topic": "python", "ambiguous": True},
        idempotency_key="run/0/research",
        timeout=TIMEOUT,
        tasks=True,
        elicitation=refuse_elicitation,  # declared: the server may ask (through the task)
    )
    assert isinstance(answer, McpTask), answer
    return answer


async def test_a_tasks_question_is_answered_on_its_result_stream_and_the_task_completes(
    proxy: RecordingProxy,
) -> None:
    task = await _ambiguous(proxy)
    asked: list[ElicitationQuestion] = []

    async def person(question: ElicitationQuestion) -> ElicitationAnswer:
        asked.append(question)
        return ElicitationAnswer("accept", {"interpretation": "snake"})

    hold = HoldOpen("everything", TOOL, person, hold=20.0)

    async def done() -> TaskPoll | None:
        polled = await poll_task(
            proxy.url, task.id, timeout=TIMEOUT, protocol=task.protocol, session=task.session, hold=hold
        )
        return polled if polled.task.status == "completed" else None

    polled = await eventually_async(done, Within.COMMIT, "the research task completes", interval=0.5)
    assert len(asked) == 1, asked
    [question] = asked
    assert "could have multiple interpretations" in question.message
    assert question.schema is not None
    assert question.schema["required"] == ["interpretation"]
    assert isinstance(polled.result, McpResult)
    assert not polled.result.is_error
    assert "**Clarification**: snake" in str(polled.result.content)
    assert len(proxy.requests("tools/call")) == 1, "answering never calls the tool again"
    assert {r["session"] for r in proxy.requests("tasks/result")} == {task.session}


async def test_without_someone_to_ask_a_task_waiting_for_input_is_only_polled(proxy: RecordingProxy) -> None:
    task = await _ambiguous(proxy)

    async def waiting() -> TaskPoll | None:
        polled = await poll_task(
            proxy.url, task.id, timeout=TIMEOUT, protocol=task.protocol, session=task.session
        )
        return polled if polled.task.status == "input_required" else None

    polled = await eventually_async(waiting, Within.COMMIT, "the task waits for input", interval=0.5)
    assert polled.result is None
    assert not proxy.requests("tasks/result"), "nobody to ask: its questions are not fetched"
