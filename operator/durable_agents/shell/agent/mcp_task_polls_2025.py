"""Polling and cancelling a task of the 2025-11-25 form, in the MCP session it lives in
(:mod:`.mcp_task_sessions`): ``tasks/get`` tells the status; once ``completed``, ``tasks/result``
fetches the call's ``CallToolResult`` (a read: fetched again, never the tool called again, when
the operator died before the outcome was written); ``tasks/cancel`` cancels.

What a poll tells is what the extension's poll tells (:mod:`.mcp_tasks`): a :class:`TaskPoll`, or
:class:`McpTaskUnknown` when the server answered an error (an unknown session or task: expired,
restarted; or ``tasks/get`` naming another task), or :class:`McpUnreachable` when it did not
answer (poll again later).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2

from durable_agents.shell.agent.bounded_body import unencoded
from durable_agents.shell.agent.mcp_elicitation import HoldOpen
from durable_agents.shell.agent.mcp_notices import bound_response
from durable_agents.shell.agent.mcp_task_handles import McpTask, McpTaskUnknown, TaskPoll, task_of
from durable_agents.shell.agent.mcp_task_questions import result_answering
from durable_agents.shell.agent.mcp_task_sessions import SessionAnswered, session_request
from durable_agents.shell.agent.mcp_tools import (
    _HTTP_TIMEOUT,
    NO_ACCESS,
    McpAccess,
    McpUnreachable,
    _describe,
    _result,
    _verify,
)

__all__ = ["cancel_in_session", "poll_in_session"]

_MESSAGE_MAX = 512


def _http(access: McpAccess) -> httpx2.AsyncClient:
    """A client bounded as the SDK's connection is: every body (a single answer to a
    ``tasks/result`` too, read whole) up to 4 MiB, none encoded; a cut says why in its exception."""

    async def bound(response: httpx2.Response) -> None:
        bound_response(response, [])

    return httpx2.AsyncClient(
        headers=unencoded(access.headers),
        timeout=_HTTP_TIMEOUT,
        verify=_verify(access),
        event_hooks={"response": [bound]},
    )


async def poll_in_session(
    url: str,
    task_id: str,
    session: str | None,
    *,
    timeout: float,  # noqa: ASYNC109 (a deadline for the whole operation, applied inside)
    access: McpAccess = NO_ACCESS,
    hold: HoldOpen | None = None,
) -> TaskPoll:
    """``tasks/get`` once, and ``tasks/result`` when the task completed. A task that waits for
    input (``input_required``) with ``hold`` (who answers its questions): ``tasks/result``, its
    server's questions answered on the stream (:mod:`.mcp_task_questions`), until it ends."""
    from mcp_types import CallToolResult
    from pydantic import ValidationError

    asked = {"taskId": task_id}
    try:
        async with asyncio.timeout(timeout), _http(access) as http:
            task = await _status(http, url, session, task_id)
            raw: dict[str, Any] | None = None
            if task.status == "input_required" and hold is not None:
                raw = await result_answering(http, url, session, task_id, hold)
                if raw is None:  # the stream ended before the task: as it stands now
                    task = await _status(http, url, session, task_id)
            if raw is None and task.status != "completed":
                ended = task.status in ("failed", "cancelled")
                return TaskPoll(task, error=(task.status_message or task.status) if ended else None)
            if raw is None:
                raw = await session_request(http, url, session, "tasks/result", asked)
            else:
                task = McpTask(task.id, "completed", task.status_message, task.poll_interval_ms)
    except McpTaskUnknown:
        raise
    except SessionAnswered as err:
        raise McpTaskUnknown(f"{url} does not know task {task_id!r}: {err}", url=url) from None
    except ValueError as err:  # task_of: an answer without a task ID or status
        raise McpTaskUnknown(f"{url} answered tasks/get for {task_id!r} with {err}", url=url) from None
    except Exception as exc:
        raise McpUnreachable(f"polling task {task_id!r} at {url}: {_describe(exc)}", url=url) from exc
    try:
        result = CallToolResult.model_validate(_payload(raw), by_name=False)
    except ValidationError as err:
        raise McpTaskUnknown(
            f"{url}: task {task_id!r} completed without a readable result ({err.error_count()} errors)",
            url=url,
        ) from None
    return TaskPoll(task, _result(result))


async def _status(http: httpx2.AsyncClient, url: str, session: str | None, task_id: str) -> McpTask:
    task = task_of(await session_request(http, url, session, "tasks/get", {"taskId": task_id}))
    if task.id != task_id:
        raise McpTaskUnknown(f"{url} answered tasks/get for {task_id!r} with task {task.id!r}", url=url)
    return task


def _payload(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``CallToolResult`` of a ``tasks/result`` answer, its related-task ``_meta`` dropped
    (it addresses the client, not the model)."""
    return {key: value for key, value in raw.items() if key != "_meta"}


async def cancel_in_session(
    url: str,
    task_id: str,
    session: str | None,
    *,
    timeout: float,  # noqa: ASYNC109
    access: McpAccess = NO_ACCESS,
) -> str:
    """``tasks/cancel`` once: the server's answer in words. Never raises an ``McpError``."""
    try:
        async with asyncio.timeout(timeout), _http(access) as http:
            raw = await session_request(http, url, session, "tasks/cancel", {"taskId": task_id})
        task = task_of(raw)
    except SessionAnswered as err:
        return f"error {err}"[:_MESSAGE_MAX]
    except ValueError as err:
        return f"unreadable answer: {err}"[:_MESSAGE_MAX]
    except Exception as exc:
        return f"not answered: {_describe(exc)}"[:_MESSAGE_MAX]
    message = f": {task.status_message}" if task.status_message else ""
    return f"{task.status}{message}"[:_MESSAGE_MAX]
