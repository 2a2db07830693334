"""A 2025-11-25 task that waits for input (``input_required``): its server's questions come on
the stream of a ``tasks/result`` request in the task's session (the spec's input_required flow;
the server relates each ``elicitation/create`` to the task). The client answers each with a
JSON-RPC response POSTed in the same session, and the stream goes on: once the task ends, its
``tasks/result`` answer is the call's result.

The question is answered by a :class:`~durable_agents.shell.agent.mcp_elicitation.HoldOpen`,
as a call held open answers one: the ledger's poll wires it to the run's questions
(:mod:`durable_agents.shell.ledger.held_calls`). Nothing here calls the tool: ``tasks/result``
is a read of the task.
"""

from __future__ import annotations

from typing import Any, Final

import httpx2

from durable_agents.shell.agent.mcp_elicitation import HoldOpen
from durable_agents.shell.agent.mcp_task_sessions import (
    SessionAnswered,
    SessionUnanswered,
    event_message,
    session_headers,
)

__all__ = ["result_answering"]

_STREAM_MAX: Final = 4 * 1024 * 1024
# A person may take the whole hold to answer: the stream is silent meanwhile (the caller's
# deadline bounds the whole request).
_WAITING: Final = httpx2.Timeout(30.0, read=None)


class _Asked:
    """What the SDK's elicitation callback is given as its context: the request's JSON-RPC id."""

    def __init__(self, request_id: Any) -> None:
        self.request_id = request_id


async def _reply(hold: HoldOpen, message: dict[str, Any]) -> dict[str, Any]:
    """The JSON-RPC response to the server's ``elicitation/create`` ``message``."""
    from mcp_types import ElicitRequestParams, ErrorData
    from pydantic import TypeAdapter, ValidationError

    rid = message.get("id")
    try:
        params = TypeAdapter(ElicitRequestParams).validate_python(message.get("params") or {}, by_name=False)
    except ValidationError as err:
        said = f"refused: an elicitation request that is not readable ({err.error_count()} errors)"
        return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": said}}
    answer = await hold(_Asked(rid), params)
    if isinstance(answer, ErrorData):
        return {"jsonrpc": "2.0", "id": rid, "error": answer.model_dump(mode="json", exclude_none=True)}
    result = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
    return {"jsonrpc": "2.0", "id": rid, "result": result}


async def result_answering(
    http: httpx2.AsyncClient, url: str, session: str | None, task_id: str, hold: HoldOpen
) -> dict[str, Any] | None:
    """``tasks/result`` for ``task_id``, answering the server's questions on its stream (each
    through ``hold``); the task's result once it ended, None when the stream ended without it
    (polled again). Raises :class:`SessionAnswered` for an error answer (an unknown session or
    task), :class:`SessionUnanswered` or an ``httpx`` error when nothing readable came."""
    request = {"jsonrpc": "2.0", "id": 1, "method": "tasks/result", "params": {"taskId": task_id}}
    headers = session_headers(session)
    async with http.stream("POST", url, json=request, headers=headers, timeout=_WAITING) as response:
        if response.status_code >= 400 or "event-stream" not in response.headers.get("content-type", ""):
            body = await response.aread()
            return _single(response, body)
        buffer, read = "", 0
        async for text in response.aiter_text():
            read += len(text)
            if read > _STREAM_MAX:
                raise SessionUnanswered(f"the tasks/result stream was longer than {_STREAM_MAX} bytes")
            buffer += text.replace("\r\n", "\n")
            while "\n\n" in buffer:
                event, buffer = buffer.split("\n\n", 1)
                message = event_message(event)
                if not isinstance(message, dict):
                    continue
                if message.get("method") == "elicitation/create" and "id" in message:
                    reply = await _reply(hold, message)
                    posted = await http.post(url, json=reply, headers=headers)
                    posted.raise_for_status()
                elif message.get("id") == 1:
                    return _ended(message)
    return None


def _ended(message: dict[str, Any]) -> dict[str, Any]:
    error = message.get("error")
    if isinstance(error, dict):
        raise SessionAnswered(f"{error.get('code')}: {str(error.get('message'))[:512]}")
    result = message.get("result")
    if not isinstance(result, dict):
        raise SessionUnanswered("a tasks/result answer without a result")
    return dict(result)


def _single(response: httpx2.Response, body: bytes) -> dict[str, Any]:
    """A ``tasks/result`` answered with one JSON body (no stream: nothing was asked)."""
    import json

    try:
        message = json.loads(body)
    except ValueError as err:
        if response.status_code >= 400:
            raise SessionAnswered(f"HTTP {response.status_code}") from None
        raise SessionUnanswered(f"an answer that is not JSON: {err}") from None
    if response.status_code >= 400 and not isinstance(message, dict):
        raise SessionAnswered(f"HTTP {response.status_code}")
    if response.status_code >= 500:
        response.raise_for_status()
    if not isinstance(message, dict):
        raise SessionUnanswered("an answer that is not a JSON-RPC message")
    if response.status_code >= 400 and "error" not in message:
        raise SessionAnswered(f"HTTP {response.status_code}")
    return _ended(message)
