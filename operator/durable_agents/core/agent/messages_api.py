"""The Anthropic Messages API, as a translation of the core's one request and reply shape.

The core builds every request in one shape (chat-completions messages, see :mod:`.context`) and
records that request's digest, the model, the prompt's digest and the tool set's digest the same
way whatever the endpoint speaks. An endpoint whose protocol is ``anthropic-messages`` gets the
same request translated here (pure: no SDK types, the shell hands the body to the ``anthropic``
client), and its reply is read back into the core's :class:`ModelReply`:

- the ``system`` messages become the ``system`` parameter; ``user`` messages text blocks, and the
  images of a tool result (``image_url`` parts with ``data:`` URLs) base64 image blocks, after the
  ``tool_result`` blocks of the same user turn;
- an assistant's ``tool_calls`` become ``tool_use`` blocks (after its text, if any), with the
  arguments as the ``input`` object (arguments that are not a JSON object are replayed as ``{}``,
  as the core already does for chat completions);
- ``tool`` messages become ``tool_result`` blocks, all the results of one assistant turn in the
  one ``user`` message that must follow it (the API refuses results spread over several);
- tools carry ``input_schema``; one tool call per turn (``disable_parallel_tool_use``).

A reply's ``text`` blocks are its content, its ``tool_use`` blocks its tool calls (the ``input``
written back as JSON text, which the core parses like any model's arguments), its
``stop_reason`` the finish reason, ``usage.input_tokens``/``output_tokens`` the tokens.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from durable_agents.core.agent.exchange import ModelReply, ModelRequest, ToolCall, Usage

OPENAI_CHAT: Final = "openai-chat"
ANTHROPIC_MESSAGES: Final = "anthropic-messages"
PROTOCOLS: Final = (OPENAI_CHAT, ANTHROPIC_MESSAGES)

MAX_TOKENS: Final = 4096
"""The ``max_tokens`` of every request (the Messages API requires one): a turn is a short reason
and one tool call, or a final answer."""
TOKENS_MAX: Final = 2**32 - 1
_NOT_IN_ID: Final = re.compile(r"[^a-zA-Z0-9_-]")


class NotAMessage(ValueError):
    """What in a JSON reply is not a Messages API message (said for a person, no content quoted)."""


def _text(content: Any) -> str:
    """A chat message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type", "text") == "text"]
        return "".join(t for t in parts if isinstance(t, str))
    return content if isinstance(content, str) else ""


def _block_id(call_id: Any) -> str:
    """A call ID as the API accepts one (``^[a-zA-Z0-9_-]+$``): the core's may also hold ``.`` or
    ``:`` (a chat-completions model's own ID, kept); the same ID maps alike in use and result."""
    return _NOT_IN_ID.sub("_", call_id) if isinstance(call_id, str) and call_id else "call"


def _arguments(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _assistant_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    text = _text(message.get("content"))
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text.strip() else []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": _block_id(call.get("id")),
                "name": function.get("name", ""),
                "input": _arguments(function.get("arguments")),
            }
        )
    return blocks


def _blocks(message: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The role and content blocks of one non-system chat message."""
    role = message.get("role")
    if role == "assistant":
        return "assistant", _assistant_blocks(message)
    if role == "tool":
        result = {
            "type": "tool_result",
            "tool_use_id": _block_id(message.get("tool_call_id")),
            "content": _text(message.get("content")),
        }
        return "user", [result]
    return "user", _user_blocks(message.get("content"))


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    """A user message's text, and its images (``data:`` URLs, as the core writes a result's
    images) as base64 image blocks."""
    if not isinstance(content, list):
        return [{"type": "text", "text": _text(content)}]
    blocks: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        url = (part.get("image_url") or {}).get("url") if part.get("type") == "image_url" else None
        if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
            media_type, data = url.removeprefix("data:").split(";base64,", 1)
            blocks.append(
                {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
            )
        elif part.get("type", "text") == "text" and isinstance(part.get("text"), str):
            blocks.append({"type": "text", "text": part["text"]})
    return blocks


def messages_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A chat-completions ``tools`` entry as a Messages API tool."""
    function = tool.get("function") or {}
    return {
        "name": function.get("name", ""),
        "description": function.get("description", ""),
        "input_schema": function.get("parameters") or {"type": "object"},
    }


def messages_body(request: ModelRequest, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """The Messages API body of the core's ``request`` (same facts, same bytes)."""
    system = "\n\n".join(_text(m.get("content")) for m in request.messages if m.get("role") == "system")
    messages: list[dict[str, Any]] = []
    for message in request.messages:
        if message.get("role") == "system":
            continue
        role, blocks = _blocks(message)
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:  # the API wants the roles to alternate
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    body: dict[str, Any] = {"model": request.model, "max_tokens": max_tokens, "messages": messages}
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = [messages_tool(tool) for tool in request.tools]
        body["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
    return body


def _field(value: Any, where: str, kind: type, *, optional: bool = True) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise NotAMessage(f"{where} is {type(value).__name__}, not {kind.__name__}")
    return _unicode(value) if isinstance(value, str) else value


def _unicode(text: str) -> str:
    """``text`` with lone surrogates replaced (not Unicode text; sealing would refuse them)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _count(usage: dict[str, Any], key: str) -> int:
    value = _field(usage.get(key), f"usage.{key}", int)
    if value is not None and not 0 <= value <= TOKENS_MAX:
        raise NotAMessage(f"usage.{key} is not a token count")
    return int(value or 0)


def _tool_call(block: dict[str, Any], index: int) -> ToolCall:
    where = f"content[{index}]"
    arguments = block.get("input")
    if arguments is None:
        arguments = {}
    # ASCII JSON text: the core parses it as any model's arguments (escapes keep lone surrogates).
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(
        id=_field(block.get("id"), f"{where}.id", str) or "",
        name=_field(block.get("name"), f"{where}.name", str) or "",
        arguments_text=_unicode(text),
    )


def reply_of_message(value: Any) -> ModelReply:
    """The core's view of a parsed Messages API reply; :class:`NotAMessage` says what is not."""
    _field(value, "the reply", dict, optional=False)
    if value.get("type", "message") != "message":
        raise NotAMessage(f"its type is {str(value.get('type'))[:32]!r}, not 'message'")
    content = _field(value.get("content"), "content", list, optional=False)
    texts: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(content):
        _field(block, f"content[{index}]", dict, optional=False)
        kind = block.get("type")
        if kind == "text":
            texts.append(_field(block.get("text"), f"content[{index}].text", str) or "")
        elif kind == "tool_use":
            calls.append(_tool_call(block, index))
        # other blocks (thinking, server tools) are not the core's: ignored, as unknown call kinds
    usage = _field(value.get("usage"), "usage", dict) or {}
    return ModelReply(
        model=_field(value.get("model"), "model", str) or "",
        content="".join(texts) or None,
        tool_calls=tuple(calls),
        finish_reason=_field(value.get("stop_reason"), "stop_reason", str),
        usage=Usage(input_tokens=_count(usage, "input_tokens"), output_tokens=_count(usage, "output_tokens")),
    )
