"""MCP tasks, the client side, against the task reference server (loopback; issue 36, item 2): a
call answered with a task is a durable handle (not a result, not a failure); polling it tells its
status and, once completed, its result; a task the server does not know is told apart from a
server that did not answer; a cancellation is answered; a server without the client's tasks
declaration is not handed a task."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from durable_agents.shell.agent.mcp_tasks import McpTask, McpTaskUnknown, cancel_task, poll_task
from durable_agents.shell.agent.mcp_tools import McpResult, McpUnreachable, call_tool
from durable_agents_testkit.mcptasks import TOOL, TaskServerThread

pytestmark = pytest.mark.unit

TIMEOUT = 30.0


@pytest.fixture
def server() -> Iterator[TaskServerThread]:
    with TaskServerThread() as running:
        yield running


async def start(server: TaskServerThread, key: str) -> McpTask:
    answer = await call_tool(
        server.url, TOOL, {"topic": "q3"}, idempotency_key=key, timeout=TIMEOUT, tasks=True
    )
    assert isinstance(answer, McpTask), answer
    return answer


async def test_a_task_is_a_handle_polled_to_its_result(server: TaskServerThread) -> None:
    task = await start(server, "run/0/report")
    assert (task.status, task.poll_interval_ms) == ("working", 200)
    assert server.calls() == {"run/0/report": 1}

    polled = await poll_task(server.url, task.id, timeout=TIMEOUT)
    assert (polled.task.id, polled.task.status, polled.result) == (task.id, "working", None)
    assert polled.task.status_message == "compiling q3: polled 1 times"

    server.finish()
    done = await poll_task(server.url, task.id, timeout=TIMEOUT)
    assert done.task.status == "completed"
    assert isinstance(done.result, McpResult)
    assert not done.result.is_error
    assert '"idempotencyKey": "run/0/report"' in str(done.result.content)
    assert server.fetches() == {task.id: 1}
    assert server.calls() == {"run/0/report": 1}, "polling never calls the tool again"


async def test_an_unknown_task_is_told_apart_from_no_answer(server: TaskServerThread) -> None:
    task = await start(server, "run/0/report")
    server.forget()
    with pytest.raises(McpTaskUnknown, match="does not know task"):
        await poll_task(server.url, task.id, timeout=TIMEOUT)
    with pytest.raises(McpUnreachable):
        await poll_task("http://127.0.0.1:9/mcp", task.id, timeout=TIMEOUT)


async def test_a_completed_task_with_an_unreadable_result_is_unknown(server: TaskServerThread) -> None:
    task = await start(server, "run/0/report")
    server.break_results()
    server.finish()
    with pytest.raises(McpTaskUnknown, match="completed without a readable result"):
        await poll_task(server.url, task.id, timeout=TIMEOUT, tool=TOOL)


async def test_a_cancellation_is_answered(server: TaskServerThread) -> None:
    task = await start(server, "run/0/report")
    assert await cancel_task(server.url, task.id, timeout=TIMEOUT) == "cancelled: cancelled on request"
    assert server.cancels() == [task.id]
    polled = await poll_task(server.url, task.id, timeout=TIMEOUT)
    assert (polled.task.status, polled.result) == ("cancelled", None)
    unknown = await cancel_task(server.url, "no-such-task", timeout=TIMEOUT)
    assert unknown.startswith("error -32602"), unknown


async def test_without_the_tasks_declaration_no_task_is_handed_out(server: TaskServerThread) -> None:
    answer = await call_tool(server.url, TOOL, {"topic": "q3"}, idempotency_key="k", timeout=TIMEOUT)
    assert isinstance(answer, McpResult)
    assert answer.is_error
    assert server.calls() == {}
