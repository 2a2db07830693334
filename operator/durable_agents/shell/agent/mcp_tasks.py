"""MCP tasks, the operator's client side: a ``tools/call`` a server answers with a task (the tasks
extension ``io.modelcontextprotocol/tasks`` of the 2026-07-28 protocol), and the task's polling
and cancellation.

The client declares the extension only on the connections of ledger dispatches
(:func:`durable_agents.shell.agent.mcp_tools.call_tool` with ``tasks=True``): a server may then
answer the call with a task handle (``resultType: "task"``) instead of its result. The handle is a
durable ID; the dispatcher records it in the ActionRecord before anything else
(:mod:`durable_agents.shell.ledger.task_polls`) and polls it with ``tasks/get``, here, one
connection per poll, like every other operation: a poll after an operator restart, an upgrade or
a failover is the same as any other.

What a poll can tell (:func:`poll_task`):

* :class:`TaskPoll` with a non-terminal status (``working``, ``input_required``): poll again later;
* :class:`TaskPoll` with ``completed`` and its ``result`` (the call's ``CallToolResult``, carried
  inline by ``tasks/get``), or ``failed`` / ``cancelled`` (the server's ``error`` or message);
* :class:`McpTaskUnknown`: the server answered, with a JSON-RPC error: it does not know the task
  (expired, server restarted): whether the call applied is unknown, reconciled like any other;
* :class:`McpUnreachable` (or any :class:`McpError`): no answer: poll again later.

A ``tasks/get`` answer that names another task than the one asked about is not taken
(:class:`McpTaskUnknown`): a server that mixes its tasks up does not get to settle this call with
another call's result.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Literal

from durable_agents.core.agent.mcp_tasks import TASK_FORM_2025, task_form
from durable_agents.shell.agent.mcp_elicitation import HoldOpen
from durable_agents.shell.agent.mcp_notices import ServerLog
from durable_agents.shell.agent.mcp_task_handles import (
    TASKS_EXTENSION,
    McpTask,
    McpTaskUnknown,
    TaskPoll,
    raw_answer,
    task_of,
)
from durable_agents.shell.agent.mcp_task_polls_2025 import cancel_in_session, poll_in_session
from durable_agents.shell.agent.mcp_tools import (
    NO_ACCESS,
    McpAccess,
    McpUnreachable,
    _checked,
    _connect,
    _describe,
    _leaves,
    _result,
    _Seen,
)

if TYPE_CHECKING:
    from mcp import Client

__all__ = [
    "TASKS_EXTENSION",
    "TERMINAL_TASK_STATUSES",
    "McpTask",
    "McpTaskUnknown",
    "TaskPoll",
    "cancel_task",
    "poll_task",
]

TERMINAL_TASK_STATUSES = frozenset({"completed", "failed", "cancelled"})
_MESSAGE_MAX = 512


def _request(method: Literal["tasks/get", "tasks/cancel"], task_id: str) -> Any:
    """A ``tasks/*`` request: the SDK keeps the 2025-11-25 task requests as types only; their
    wire form (``{"taskId"}``) is the same in the extension."""
    from mcp_types import CancelTaskRequest, CancelTaskRequestParams, GetTaskRequest, GetTaskRequestParams

    if method == "tasks/get":
        return GetTaskRequest(params=GetTaskRequestParams(task_id=task_id))
    return CancelTaskRequest(params=CancelTaskRequestParams(task_id=task_id))


async def _ask(client: Client, method: Literal["tasks/get", "tasks/cancel"], task_id: str) -> dict[str, Any]:
    raw = await client.session.send_request(_request(method, task_id), raw_answer())
    return dict(raw)


def _answered_error(exc: BaseException) -> str | None:
    """The server's JSON-RPC error, when the failure was one (the server answered)."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    for leaf in _leaves(exc):
        if isinstance(leaf, MCPError) and leaf.code != CONNECTION_CLOSED:
            return f"{leaf.code}: {leaf}"
    return None


async def poll_task(
    url: str,
    task_id: str,
    *,
    timeout: float,  # noqa: ASYNC109 (a deadline for the whole operation, applied inside)
    access: McpAccess = NO_ACCESS,
    server: str = "",
    tool: str | None = None,
    protocol: str | None = None,
    session: str | None = None,
    hold: HoldOpen | None = None,
) -> TaskPoll:
    """``tasks/get`` for ``task_id`` once (module docstring); a read: safe to repeat. A completed
    task's result is checked against ``tool``'s output schema, like a direct answer. A task of
    the 2025-11-25 form (``protocol``) is asked in its ``session``, its result fetched by
    ``tasks/result`` (:mod:`.mcp_task_polls_2025`); ``hold`` answers its questions."""
    if task_form(protocol) == TASK_FORM_2025:
        return await poll_in_session(url, task_id, session, timeout=timeout, access=access, hold=hold)
    seen = _Seen(ServerLog(server or url))
    try:
        async with asyncio.timeout(timeout), _connect(url, access, seen, tasks=True) as client:
            raw = await _ask(client, "tasks/get", task_id)
            return await _polled(client, url, task_id, raw, tool)
    except Exception as exc:
        told = [leaf for leaf in _leaves(exc) if isinstance(leaf, McpTaskUnknown)]
        if told:  # raised within the connection (the SDK's task groups wrap it)
            raise told[0] from exc
        said = _answered_error(exc)
        if said is not None:
            raise McpTaskUnknown(f"{url} does not know task {task_id!r}: {said}", url=url) from exc
        raise McpUnreachable(f"polling task {task_id!r} at {url}: {_describe(exc, seen)}", url=url) from exc


async def _polled(client: Client, url: str, task_id: str, raw: dict[str, Any], tool: str | None) -> TaskPoll:
    from mcp_types import CallToolResult
    from pydantic import ValidationError

    try:
        task = task_of(raw)
    except ValueError as err:
        raise McpTaskUnknown(f"{url} answered tasks/get for {task_id!r} with {err}", url=url) from None
    if task.id != task_id:
        raise McpTaskUnknown(f"{url} answered tasks/get for {task_id!r} with task {task.id!r}", url=url)
    if task.status == "completed":
        try:
            result = CallToolResult.model_validate(raw.get("result"), by_name=False)
        except ValidationError as err:
            count = err.error_count()
            raise McpTaskUnknown(
                f"{url}: task {task_id!r} completed without a readable result ({count} errors)", url=url
            ) from None
        return TaskPoll(task, await _checked(client, tool, result) if tool else _result(result))
    if task.status in ("failed", "cancelled"):
        error = raw.get("error")
        words = str(error.get("message") or error)[:_MESSAGE_MAX] if isinstance(error, dict) else None
        return TaskPoll(task, error=words or task.status_message or task.status)
    return TaskPoll(task)


async def cancel_task(
    url: str,
    task_id: str,
    *,
    timeout: float,  # noqa: ASYNC109
    access: McpAccess = NO_ACCESS,
    server: str = "",
    protocol: str | None = None,
    session: str | None = None,
) -> str:
    """``tasks/cancel`` for ``task_id``; the server's answer in words (its status, or its error,
    or why it could not be asked), for the record. Never raises an :class:`McpError`."""
    if task_form(protocol) == TASK_FORM_2025:
        return await cancel_in_session(url, task_id, session, timeout=timeout, access=access)
    seen = _Seen(ServerLog(server or url))
    try:
        async with asyncio.timeout(timeout), _connect(url, access, seen, tasks=True) as client:
            raw = await _ask(client, "tasks/cancel", task_id)
    except Exception as exc:
        said = _answered_error(exc)
        return (f"error {said}" if said else f"not answered: {_describe(exc, seen)}")[:_MESSAGE_MAX]
    try:
        task = task_of(raw)
    except ValueError as err:
        return f"unreadable answer: {err}"[:_MESSAGE_MAX]
    message = f": {task.status_message}" if task.status_message else ""
    return f"{task.status}{message}"[:_MESSAGE_MAX]
