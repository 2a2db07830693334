"""MCP tasks in the 2025-11-25 form (issue 36, item 2): the pure rule that decides whether a
``tools/call`` asks for a task, the outcome stamp over the task's form and session, and the client
against the MCP project's reference server (server-everything, its ``simulate-research-query``,
``execution.taskSupport: required``), through a recording proxy: the call answered with a task
handle (its form and session kept), polled in its session to its result, fetched with
``tasks/result``, the tool called once; a task asked about in another session is unknown; a
cancellation is answered; a tool that forbids tasks is called directly, its session ended."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from durable_agents.api.v1alpha1 import ActionRecordStatus, ActionState, ActionTask
from durable_agents.core.agent.mcp_tasks import TASK_FORM_2025, TASK_FORM_EXTENSION, ask_for_task, task_form
from durable_agents.core.outcome_stamps import outcome_payload
from durable_agents.shell.agent.mcp_tasks import McpTask, McpTaskUnknown, TaskPoll, cancel_task, poll_task
from durable_agents.shell.agent.mcp_tools import McpResult, call_tool
from durable_agents.shell.effects import Action, Applied, EffectContext, Failed, Tasked, Unknown
from durable_agents.shell.effects.mcp import McpCall
from durable_agents.shell.ground.kube import Kube
from durable_agents_testkit import mcpeverything
from durable_agents_testkit.eventually import Within, eventually_async
from durable_agents_testkit.mcpeverything import EverythingServer
from durable_agents_testkit.mcprecorder import RecordingProxy

pytestmark = pytest.mark.unit

TOOL = "simulate-research-query"
TIMEOUT = 30.0


@pytest.mark.parametrize(
    ("can_hold", "negotiated", "server_call", "support", "asked"),
    [
        (True, TASK_FORM_2025, True, "required", True),
        (True, TASK_FORM_2025, True, "optional", True),
        (True, TASK_FORM_2025, True, "forbidden", False),
        (True, TASK_FORM_2025, True, None, False),  # absent: forbidden
        (True, TASK_FORM_2025, False, "required", False),  # the server does not take task calls
        (True, "2025-06-18", True, "required", False),  # no tasks in that protocol
        (True, "2026-07-28", True, "required", False),  # the extension's form: the server decides
        (False, TASK_FORM_2025, True, "optional", False),  # a read of the worker holds no task
        (False, TASK_FORM_2025, True, "required", False),  # sent without: the server's refusal answers
    ],
)
def test_a_task_is_asked_for_only_where_the_server_and_the_tool_say_so_and_it_can_be_held(
    can_hold: bool, negotiated: str, server_call: bool, support: str | None, asked: bool
) -> None:
    decided = ask_for_task(
        can_hold=can_hold, negotiated=negotiated, server_tasks_tools_call=server_call, task_support=support
    )
    assert decided is asked


def test_a_recorded_task_without_a_form_is_the_extensions() -> None:
    assert task_form(None) == TASK_FORM_EXTENSION
    assert task_form("1999-01-01") == TASK_FORM_EXTENSION
    assert task_form(TASK_FORM_2025) == TASK_FORM_2025


def _status(**task: object) -> ActionRecordStatus:
    at = datetime(2026, 12, 4, tzinfo=UTC)
    fields: dict[str, object] = {"id": "t1", "server": "http://s/mcp", "status": "working", "created_at": at}
    return ActionRecordStatus(state=ActionState.DISPATCHING, task=ActionTask.model_validate(fields | task))


def test_the_outcome_stamp_covers_the_form_and_session_of_a_task() -> None:
    before = outcome_payload("ar-1", "k", _status())
    assert before["task"] == {"id": "t1", "server": "http://s/mcp"}, "earlier stamps are unchanged"
    mine = outcome_payload("ar-1", "k", _status(protocol=TASK_FORM_2025, session="s-1"))
    assert mine["task"] == {
        "id": "t1",
        "server": "http://s/mcp",
        "protocol": TASK_FORM_2025,
        "session": "s-1",
    }
    assert outcome_payload("ar-1", "k", _status(protocol=TASK_FORM_2025, session="s-2")) != mine
    assert outcome_payload("ar-1", "k", _status(protocol=TASK_FORM_EXTENSION, session="s-1")) != mine


@pytest.fixture(scope="module")
def everything_entry() -> Path:
    return mcpeverything.install()


@pytest.fixture
def proxy(everything_entry: Path) -> Iterator[RecordingProxy]:
    with EverythingServer(everything_entry) as server, RecordingProxy(server.url) as recording:
        yield recording


async def _start(proxy: RecordingProxy, key: str) -> McpTask:
    answer = await call_tool(
        proxy.url, TOOL, {"topic": "durability"}, idempotency_key=key, timeout=TIMEOUT, tasks=True
    )
    assert isinstance(answer, McpTask), answer
    return answer


async def test_a_task_capable_tool_is_asked_for_a_task_polled_in_its_session_to_its_result(
    proxy: RecordingProxy,
) -> None:
    task = await _start(proxy, "run/0/research")
    assert (task.protocol, task.status, task.poll_interval_ms) == (TASK_FORM_2025, "working", 1000)
    assert task.session, "the session the task lives in is part of the handle"
    [sent] = proxy.requests("tools/call")
    assert sent["params"]["task"]["ttl"] > 0, "the call asked for a task"
    assert sent["session"] is not None
    assert not proxy.requests("tasks/result")

    async def done() -> TaskPoll | None:
        polled = await poll_task(
            proxy.url, task.id, timeout=TIMEOUT, protocol=task.protocol, session=task.session
        )
        assert polled.task.id == task.id
        return polled if polled.task.status == "completed" else None

    polled = await eventually_async(done, Within.COMMIT, "the research task completes", interval=0.5)
    assert isinstance(polled.result, McpResult)
    assert not polled.result.is_error
    assert "# Research Report: durability" in str(polled.result.content)
    gets = proxy.requests("tasks/get")
    assert gets
    assert {get["session"] for get in gets} == {task.session}, "asked in the task's session"
    assert len(proxy.requests("tasks/result")) == 1, "the payload fetched once, when completed"
    assert len(proxy.requests("tools/call")) == 1, "polling never calls the tool again"


async def test_a_task_asked_about_in_another_session_is_unknown(proxy: RecordingProxy) -> None:
    task = await _start(proxy, "run/0/research")
    with pytest.raises(McpTaskUnknown, match="does not know task"):
        await poll_task(
            proxy.url, task.id, timeout=TIMEOUT, protocol=TASK_FORM_2025, session="no-such-session"
        )
    with pytest.raises(McpTaskUnknown, match="does not know task"):
        await poll_task(
            proxy.url, "no-such-task", timeout=TIMEOUT, protocol=TASK_FORM_2025, session=task.session
        )


async def test_a_cancellation_is_answered_in_the_tasks_session(proxy: RecordingProxy) -> None:
    task = await _start(proxy, "run/0/research")
    answer = await cancel_task(
        proxy.url, task.id, timeout=TIMEOUT, protocol=task.protocol, session=task.session
    )
    assert answer.startswith("cancelled"), answer
    polled = await poll_task(
        proxy.url, task.id, timeout=TIMEOUT, protocol=task.protocol, session=task.session
    )
    assert (polled.task.status, polled.result) == ("cancelled", None)
    gone = await cancel_task(proxy.url, task.id, timeout=TIMEOUT, protocol=TASK_FORM_2025, session="no-such")
    assert gone.startswith("error HTTP 400"), gone


async def test_a_tool_that_forbids_tasks_is_called_directly_and_its_session_ended(
    proxy: RecordingProxy,
) -> None:
    answer = await call_tool(
        proxy.url, "echo", {"message": "hi"}, idempotency_key="k", timeout=TIMEOUT, tasks=True
    )
    assert isinstance(answer, McpResult)
    assert answer.content == "Echo: hi"
    [sent] = proxy.requests("tools/call")
    assert "task" not in sent["params"]
    with pytest.raises(McpTaskUnknown):  # the session was ended (DELETE): nothing is kept there
        await poll_task(proxy.url, "any", timeout=TIMEOUT, protocol=TASK_FORM_2025, session=sent["session"])


async def test_a_read_of_a_tool_that_requires_a_task_asks_none(proxy: RecordingProxy) -> None:
    # The worker's read cannot hold a task: sent without one, the server's refusal is its answer.
    answer = await call_tool(proxy.url, TOOL, {"topic": "x"}, idempotency_key=None, timeout=TIMEOUT)
    assert isinstance(answer, McpResult)
    assert answer.is_error, answer
    assert "task" in str(answer.content).lower(), answer
    [sent] = proxy.requests("tools/call")
    assert "task" not in sent["params"]


async def test_the_ledgers_effect_keeps_the_form_and_session_and_polls_and_cancels_with_them(
    proxy: RecordingProxy,
) -> None:
    # What the dispatcher records (Tasked) and what its polls hand back (protocol, session).
    effect = McpCall()
    ctx = EffectContext(kube=cast(Kube, None), namespace="ns", service_account="sa", timeout=TIMEOUT)
    target = {"server": "everything", "url": proxy.url, "tool": TOOL}
    started = await effect.dispatch(ctx, Action("run/0/research", target, {"topic": "ledger"}))
    assert isinstance(started, Tasked), started
    assert (started.protocol, started.status) == (TASK_FORM_2025, "working")
    assert started.session
    action = Action("run/0/research", target, {})
    held = {"protocol": started.protocol, "session": started.session}

    async def settled() -> Applied | None:
        polled = await effect.poll(ctx, action, started.task_id, **held)
        assert not isinstance(polled, Failed | Unknown), polled
        return polled if isinstance(polled, Applied) else None

    applied = await eventually_async(settled, Within.COMMIT, "the task settles the action", interval=0.5)
    assert "# Research Report: ledger" in str(applied.outcome["content"])
    assert applied.outcome["task"] == started.task_id
    assert len(proxy.requests("tools/call")) == 1

    other = await effect.dispatch(ctx, Action("run/1/research", target, {"topic": "cancel me"}))
    assert isinstance(other, Tasked)
    answer = await effect.cancel(ctx, action, other.task_id, protocol=other.protocol, session=other.session)
    assert answer.startswith("cancelled"), answer
    gone = await effect.poll(ctx, action, other.task_id, protocol=TASK_FORM_2025, session="no-such-session")
    assert isinstance(gone, Unknown), gone
    assert gone.reason == "McpTaskUnknown"
