"""MCP tasks in the 2025-11-25 form (:mod:`durable_agents.core.agent.mcp_tasks`), the wire side:
the client's ``tasks`` capability, the ``CreateTaskResult`` a ``tools/call`` with a ``task`` field
is answered with, and the requests about the task made later, in the session that created it.

A 2025-11-25 task lives in its MCP session (the reference server keeps a task store per
session): a poll on a new session would not find it. So the call's session is kept open (no
``DELETE`` when the call's connection closes; :func:`end_session` ends it when the call was not
answered with a task), its ID is part of the handle the ledger records, and ``tasks/get``,
``tasks/result`` and ``tasks/cancel`` are sent as single JSON-RPC requests in that session
(:func:`session_request`): by any operator process, after any restart, the session being an HTTP
header. The SDK has the types of these requests only, and no way to join a session it did not
open.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Final

import httpx2

from durable_agents.core.agent.mcp_tasks import TASK_FORM_2025, ask_for_task
from durable_agents.shell.agent.mcp_task_handles import McpTask, task_of

__all__ = [
    "SESSION_HEADER",
    "SessionAnswered",
    "SessionUnanswered",
    "asks_task",
    "created_task",
    "end_session",
    "event_message",
    "session_headers",
    "session_request",
    "tasks_client",
]

SESSION_HEADER: Final = "mcp-session-id"
_VERSION_HEADER: Final = "mcp-protocol-version"
_ANSWER_MAX_BYTES: Final = 4 * 1024 * 1024


class SessionUnanswered(Exception):
    """No readable answer came (a cut stream, a body past its bound, not JSON): ask again later."""


class SessionAnswered(Exception):
    """The server answered the request with an error (a JSON-RPC error, or an HTTP 4xx such as
    an unknown session): it was reached and does not know or refuses what was asked."""


def tasks_client() -> type[Any]:
    """The SDK's ``Client``, declaring the ``tasks`` capability at the initialize handshake
    (2025-11-25: the client understands task-augmented requests). Nothing more is declared: no
    ``tasks.requests`` (the client runs no tasks of its own: a server's sampling or elicitation
    is never sent to it as a task), no ``list`` or ``cancel`` of client-side tasks."""
    from mcp import Client
    from mcp_types import ClientCapabilities, ClientTasksCapability

    class TasksClient(Client):
        async def _build_session(self, exit_stack: Any) -> Any:
            session = await super()._build_session(exit_stack)
            built = session._build_capabilities

            def with_tasks(version: str) -> ClientCapabilities:
                declared: ClientCapabilities = built(version)
                if version != TASK_FORM_2025:
                    return declared
                return declared.model_copy(update={"tasks": ClientTasksCapability()})

            session._build_capabilities = with_tasks  # type: ignore[method-assign]
            return session

    return TasksClient


def created_task(raw: dict[str, Any]) -> McpTask | None:
    """The task of a ``CreateTaskResult`` (``{"task": {taskId, status, ...}}``), else None."""
    task = raw.get("task")
    if not isinstance(task, dict) or "content" in raw:
        return None
    return task_of(task)


def _answer_of(response: httpx2.Response, body: bytes, request_id: int) -> dict[str, Any]:
    """The JSON-RPC response to ``request_id`` in a JSON body or an SSE stream."""
    kind = response.headers.get("content-type", "").lower()
    messages: list[Any] = []
    try:
        if kind.startswith("text/event-stream"):
            for event in body.decode("utf-8", errors="replace").split("\n\n"):
                message = event_message(event)
                if message is not None:  # a priming event carries an empty data line
                    messages.append(message)
        else:
            messages.append(json.loads(body))
    except ValueError as err:
        raise SessionUnanswered(f"an answer that is not JSON: {err}") from None
    for message in messages:
        if isinstance(message, dict) and message.get("id") == request_id:
            if isinstance(message.get("error"), dict):
                error = message["error"]
                raise SessionAnswered(f"{error.get('code')}: {str(error.get('message'))[:512]}")
            if isinstance(message.get("result"), dict):
                return dict(message["result"])
    raise SessionUnanswered(f"no answer to request {request_id} in the response ({len(messages)} messages)")


def session_headers(session: str | None) -> dict[str, str]:
    """The headers of a request in ``session`` (None: a server without sessions)."""
    headers = {"accept": "application/json, text/event-stream", _VERSION_HEADER: TASK_FORM_2025}
    if session is not None:
        headers[SESSION_HEADER] = session
    return headers


def event_message(event: str) -> Any:
    """The JSON-RPC message of one SSE event (None: a priming event, its data line empty)."""
    lines = [line[5:].lstrip() for line in event.splitlines() if line.startswith("data:")]
    if not "".join(lines).strip():
        return None
    try:
        return json.loads("\n".join(lines))
    except ValueError as err:
        raise SessionUnanswered(f"an event that is not JSON: {err}") from None


async def session_request(
    http: httpx2.AsyncClient, url: str, session: str | None, method: str, params: dict[str, Any]
) -> dict[str, Any]:
    """One JSON-RPC request in ``session`` (None: a server without sessions); its result. Raises
    :class:`SessionAnswered` when the server answered an error (an HTTP 4xx included: an unknown
    session is one), an ``httpx`` error or :class:`SessionUnanswered` when it did not answer
    (readably)."""
    request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    async with http.stream("POST", url, json=request, headers=session_headers(session)) as response:
        body = b""
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > _ANSWER_MAX_BYTES:
                raise SessionUnanswered(f"the answer to {method} was larger than {_ANSWER_MAX_BYTES} bytes")
    if 400 <= response.status_code < 500:
        try:
            return _answer_of(response, body, 1)
        except (SessionUnanswered, SessionAnswered) as err:
            raise SessionAnswered(f"HTTP {response.status_code}: {err}"[:600]) from None
    response.raise_for_status()
    return _answer_of(response, body, 1)


async def end_session(http: httpx2.AsyncClient, url: str, session: str) -> None:
    """End a session kept open for a task that did not come (best effort: the server's own
    expiry ends it otherwise)."""
    with contextlib.suppress(httpx2.HTTPError):
        await http.delete(url, headers={SESSION_HEADER: session, _VERSION_HEADER: TASK_FORM_2025})


def asks_task(client: Any, entry: Any, *, can_hold: bool) -> bool:
    """Whether the ``tools/call`` of the listed tool ``entry`` carries a ``task`` field, on this
    connection (:func:`~durable_agents.core.agent.mcp_tasks.ask_for_task`)."""
    capabilities = client.server_capabilities
    tasks = getattr(capabilities, "tasks", None)
    tools = getattr(getattr(tasks, "requests", None), "tools", None)
    execution = getattr(entry, "execution", None)
    return ask_for_task(
        can_hold=can_hold,
        negotiated=client.protocol_version,
        server_tasks_tools_call=getattr(tools, "call", None) is not None,
        task_support=getattr(execution, "task_support", None),
    )


async def send_unchecked(session: Any, request: Any, on_progress: Any) -> dict[str, Any]:
    """``session.send_request`` without the SDK's check of the answer against the method's result
    type: the SDK takes a ``tools/call`` answer for a ``CallToolResult``, and a
    ``CreateTaskResult`` is not one. The caller checks what came (a task, else a result)."""
    data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    opts: dict[str, Any] = {"on_progress": on_progress}
    session._stamp(data, opts)
    return dict(await session._dispatcher.send_raw_request(data["method"], data.get("params"), opts))
