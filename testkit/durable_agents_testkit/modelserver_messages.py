"""The reference model server's Anthropic Messages API side: ``POST /v1/messages``.

Scripted exactly like chat completions (the same script, rules, faults and counts): a request is
translated to the protocol-neutral form, the chat-completions shape (``system`` as the first
message, ``tool_use`` blocks as the assistant's ``tool_calls`` with RFC 8785 arguments,
``tool_result`` blocks as ``tool`` messages, ``image`` blocks as ``image_url`` parts with data
URLs, tools as functions), which is what ``GET /calls``
records and what the rules match, so a test asserts on either protocol alike; ``byProtocol``
counts the requests of each. The answer is then written as a Messages API message (text and
``tool_use`` blocks, ``stop_reason`` ``end_turn`` or ``tool_use``, ``usage``).

Written independently of the operator's translation (:mod:`durable_agents.core.agent.messages_api`),
so that a mistake there shows here instead of being mirrored. Errors are the API's own shape,
``{"type": "error", "error": {"type", "message"}}``; with an API key configured, the request
needs ``x-api-key: <key>`` or ``Authorization: Bearer <key>`` (else 401). The ``overloaded``
fault answers 529 ``overloaded_error``; a ``malformed`` tool call's ``input`` is the cut-short
text (no object can be malformed JSON).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

import rfc8785
from aiohttp import web

PROTOCOL = "anthropic-messages"
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
_ERROR_TYPES |= {500: "api_error", 529: "overloaded_error"}


def error(status: int, message: str) -> web.Response:
    kind = _ERROR_TYPES.get(status, "api_error")
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return content if isinstance(content, str) else ""


def _assistant(blocks: list[Any]) -> dict[str, Any]:
    text = "".join(b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str))
    calls = [
        {
            "id": b.get("id"),
            "type": "function",
            "function": {"name": b.get("name"), "arguments": rfc8785.dumps(b.get("input")).decode()},
        }
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list[Any]) -> list[dict[str, Any]]:
    results = [
        {"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _text(b.get("content"))}
        for b in blocks
        if b.get("type") == "tool_result"
    ]
    text = "".join(b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str))
    images = [_image_part(b) for b in blocks if b.get("type") == "image"]
    if images:  # recorded as chat-completions parts: text, then each image as a data URL
        parts = [*([{"type": "text", "text": text}] if text else []), *images]
        return [*results, {"role": "user", "content": parts}]
    return [*results, *([{"role": "user", "content": text}] if text else [])]


def _image_part(block: dict[str, Any]) -> dict[str, Any]:
    source = block.get("source") or {}
    url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    return {"type": "image_url", "image_url": {"url": url}}


def _problem(messages: Any) -> str | None:
    """Why the real API would refuse these messages: roles alternate from ``user``, blocks are
    objects, and each ``tool_use`` is answered by a ``tool_result`` in the very next message."""
    if not isinstance(messages, list) or not messages:
        return "messages: must be a non-empty list"
    pending: set[Any] = set()
    for index, message in enumerate(messages):
        role = "user" if index % 2 == 0 else "assistant"
        if not isinstance(message, dict) or message.get("role") != role:
            return f"messages.{index}: roles must alternate, from user (expected {role})"
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            return f"messages.{index}.content: must be a string or a list of blocks"
        answered = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
        if answered != pending:
            return f"messages.{index}: tool_use ids {sorted(map(str, pending))} need tool_result blocks, next"
        pending = {b.get("id") for b in blocks if b.get("type") == "tool_use"}
    return "the last message has tool_use blocks without results" if pending else None


def neutral(body: dict[str, Any]) -> dict[str, Any]:
    """The request in the chat-completions shape (see the module's docstring)."""
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"])})
    for message in body["messages"]:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        messages.extend([_assistant(blocks)] if message["role"] == "assistant" else _user(blocks))
    tools = [
        {
            "type": "function",
            "function": {
                "name": t.get("name"),
                "description": t.get("description", ""),
                "parameters": t.get("input_schema"),
            },
        }
        for t in body.get("tools") or []
        if isinstance(t, dict)
    ]
    return {"model": body.get("model"), "messages": messages, **({"tools": tools} if tools else {})}


def message_of(completion: dict[str, Any]) -> dict[str, Any]:
    """The server's chat completion, written as a Messages API message."""
    chosen = completion["choices"][0]["message"]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": chosen["content"]}] if chosen["content"] else []
    for call in chosen.get("tool_calls", []):
        try:
            arguments = json.loads(call["function"]["arguments"])
        except ValueError:
            arguments = call["function"]["arguments"]  # a malformed fault: the cut-short text
        name = call["function"]["name"]
        blocks.append({"type": "tool_use", "id": "toolu_" + call["id"][5:], "name": name, "input": arguments})
    usage = completion["usage"]
    return {
        "id": "msg_" + completion["id"].removeprefix("chatcmpl-"),
        "type": "message",
        "role": "assistant",
        "model": completion["model"],
        "content": blocks,
        "stop_reason": "tool_use" if chosen.get("tool_calls") else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]},
    }


def broken_message(mode: str, api_key: str) -> web.Response | None:
    """The reply of a broken endpoint for the fault ``mode``, in this API's terms, where it
    differs from chat completions' (None: the same reply)."""
    if mode == "error":
        return error(500, "injected fault: the server had an error")
    if mode == "overloaded":
        return error(529, "Overloaded")
    if mode == "unauthorized":
        return error(401, f"invalid x-api-key: {api_key.removeprefix('Bearer ')}")
    if mode == "not_a_completion":
        return web.json_response({"type": "completion", "completion": "this is not a message"})
    return None


def post_messages(
    server_of: Callable[[web.Request], Any], broken_reply: Callable[[Any, str], web.Response | None]
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The ``POST /v1/messages`` handler for the server :func:`server_of` gives (its
    ``complete`` answers as for chat completions; ``broken_reply`` the faults alike)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return await _post_messages(request, server_of(request), broken_reply)

    return handler


async def _post_messages(
    request: web.Request, server: Any, broken_reply: Callable[[Any, str], web.Response | None]
) -> web.StreamResponse:
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return error(400, "the body must be a JSON object")
    if body.get("stream"):
        return error(400, "streaming is not supported by this server")
    if not isinstance(body.get("max_tokens"), int):
        return error(400, "max_tokens: Field required")
    if body.get("model") != server.script.model:
        return error(404, f"model: {body.get('model')}")
    problem = _problem(body.get("messages"))
    if problem is not None:
        return error(400, problem)
    chat = neutral(body)
    try:
        canonical = rfc8785.dumps(chat)
    except rfc8785.CanonicalizationError as exc:
        return error(400, f"the body has no canonical JSON form: {exc}")
    fault, completion = server.complete(chat, canonical, PROTOCOL)  # no await: atomic, as for chat
    given = request.headers.get("x-api-key") or request.headers.get("Authorization") or ""
    broken = None if fault is None else broken_message(fault.mode, given) or broken_reply(fault.mode, given)
    if broken is not None:
        return broken
    if fault is not None and fault.mode == "drop":
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=500)
    if fault is not None and fault.mode == "slow":
        await asyncio.sleep(fault.delay)
    return web.json_response(message_of(completion))


def key_given(request: web.Request, key: str) -> bool:
    """Whether a Messages API request carries the key: as ``x-api-key`` (the API's header) or as
    ``Authorization: Bearer`` (what the ``anthropic`` client sends for an api_key since 2.x)."""
    given = {request.headers.get("x-api-key", ""), request.headers.get("Authorization", "")}
    wanted = {key, f"Bearer {key}"}
    return any(hmac.compare_digest(g.encode(), w.encode()) for g in given for w in wanted)
