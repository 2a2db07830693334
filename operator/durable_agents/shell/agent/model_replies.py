"""What a model endpoint answered, classified: a chat completion (or, for an endpoint speaking
the Anthropic Messages API, a message) the core can use, or a
:class:`ModelCallFailed` that names the endpoint and the kind of reply.

Everything here reads bytes someone else wrote (the endpoint, or whatever stands in front of it:
a proxy's HTML error page, a captive portal, a misconfigured server), so nothing here may raise
anything but :class:`ModelCallFailed`: a reply that is not a chat completion is the endpoint's
failure, a retry window of the run under its policy, never the operator's internal error.

What a message says about a reply is bounded and sanitized: its status, its content type, and at
most :data:`EXCERPT_MAX` printable characters of it (an HTML page's title, a JSON error's
message), with the run's API key and anything that looks like a credential replaced. Never the
whole body, never the key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from durable_agents.core.agent.exchange import ModelReply, ToolCall, Usage
from durable_agents.core.agent.messages_api import (
    ANTHROPIC_MESSAGES,
    OPENAI_CHAT,
    NotAMessage,
    reply_of_message,
)

EXCERPT_MAX: Final = 120
"""The most characters of a reply a message quotes."""
MESSAGE_MAX: Final = 1024
TOKENS_MAX: Final = 2**32 - 1
"""The most tokens one reply may claim (no model spends that many; it keeps the run's totals,
summed over its calls, far within their bound)."""
REPLY_MAX_BYTES: Final = 4 * 1024 * 1024
"""A reply body read past this many bytes is cut and refused (``ModelReplyTooLarge``), by both
clients: a completion the run can use is a few KiB, and a broken or hostile endpoint must not fill
the worker's memory (the bound of an MCP server's response, ``mcp_notices.RESPONSE_MAX_BYTES``)."""
REDACTED: Final = "[redacted]"
# Bearer tokens, OpenAI-style keys (sk-..., also masked "sk-ab***yz"), key=value credentials.
_CREDENTIAL = re.compile(
    r"(?i)(bearer\s+\S+|\bsk-[A-Za-z0-9_*.\-]{3,}|\b(?:api[_-]?key|token|password|secret)\s*[=:]\s*\S+)"
)
_TITLE = re.compile(r"(?is)<title[^>]*>(.*?)</title>")
_TAGS = re.compile(r"(?s)<[^>]*>")


class ModelCallFailed(Exception):
    """The model did not answer usably. ``reason`` is a run outcome reason; ``retryable`` says
    whether the run's retry policy may try again (a refused request will not heal)."""

    def __init__(self, reason: str, message: str, retryable: bool) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message[:MESSAGE_MAX]
        self.retryable = retryable


def reply_too_large(status: int, where: str) -> ModelCallFailed:
    """The failure of a reply cut at :data:`REPLY_MAX_BYTES`: the endpoint's, retryable."""
    message = (
        f"HTTP {status} from {where}: the reply is larger than {REPLY_MAX_BYTES} bytes, not read further"
    )
    return ModelCallFailed("ModelReplyTooLarge", message, True)


def shown_endpoint(base_url: str) -> str:
    """The endpoint as messages name it: scheme, host, port and path; never a user, password or
    query string (a credential some put in the URL)."""
    try:
        parts = urlsplit(base_url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an endpoint URL that does not parse)"
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))[:256]


def sanitized(text: str, api_key: str | None, limit: int = EXCERPT_MAX) -> str:
    """``text`` safe to quote: printable, one line, no credential, at most ``limit`` characters."""
    if api_key:
        text = text.replace(api_key, REDACTED)
    text = _CREDENTIAL.sub(REDACTED, text)
    text = "".join(c if c.isprintable() else " " for c in text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _content_type(headers: Mapping[str, str]) -> str:
    raw = headers.get("content-type") or ""
    return sanitized(raw.split(";")[0].strip().lower(), None, 64) or "no content type"


def _json_error(value: Any) -> str | None:
    """The message of an OpenAI-style error body ``{"error": {"message": …}}`` (or ``{"error": "…"}``)."""
    error = value.get("error") if isinstance(value, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    return error if isinstance(error, str) else None


def reply_kind(headers: Mapping[str, str], body: bytes, api_key: str | None) -> str:
    """What kind of reply ``body`` is, said for a person: its content type, and an excerpt."""
    ctype = _content_type(headers)
    if not body.strip():
        return f"an empty body ({ctype})"
    text = body[: 64 * 1024].decode("utf-8", errors="replace")
    if "html" in ctype or text.lstrip()[:15].lower().startswith(("<!doctype html", "<html")):
        title = _TITLE.search(text)
        shown = title.group(1) if title else _TAGS.sub(" ", text)
        return f'an HTML page ({ctype}): "{sanitized(shown, api_key)}"'
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        if ctype.endswith("json"):
            return (
                f'a body that is not JSON although its content type is {ctype}: "{sanitized(text, api_key)}"'
            )
        return f'a {ctype} body: "{sanitized(text, api_key)}"'
    error = _json_error(value)
    if error is not None:
        return f'a JSON error ({ctype}): "{sanitized(error, api_key)}"'
    return f"a JSON {type(value).__name__} ({ctype})"


class _NotACompletion(Exception):
    """What in a JSON reply is not a chat completion (said for a person, no content quoted)."""


def _field(value: Any, where: str, kind: type | tuple[type, ...], *, optional: bool = True) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _NotACompletion(f"{where} is {type(value).__name__}, not {names}")
    return _unicode(value) if isinstance(value, str) else value


def _unicode(text: str) -> str:
    """``text`` with lone surrogates (JSON lets a reply write "\\ud800") replaced: they are not
    Unicode text, and sealing or canonical JSON would refuse them deep in the core."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = _field(usage.get(key), f"usage.{key}", int)
    if value is not None and not 0 <= value <= TOKENS_MAX:
        raise _NotACompletion(f"usage.{key} is not a token count")
    return value or 0


def _tool_call(call: Any, index: int) -> ToolCall | None:
    where = f"choices[0].message.tool_calls[{index}]"
    _field(call, where, dict, optional=False)
    if call.get("type", "function") != "function":
        return None  # a kind of call this operator does not offer (the core only sees functions)
    function = _field(call.get("function"), f"{where}.function", dict, optional=False)
    arguments = function.get("arguments")
    if isinstance(arguments, dict):  # some servers send the object itself
        arguments = json.dumps(arguments)  # ASCII: escapes even a lone surrogate, as JSON text
    return ToolCall(
        id=_field(call.get("id"), f"{where}.id", str) or "",
        name=_field(function.get("name"), f"{where}.function.name", str) or "",
        arguments_text=_field(arguments, f"{where}.function.arguments", str) or "",
    )


def _content(content: Any) -> str | None:
    """The message's text; a list of content parts gives its text parts, joined."""
    parts = _field(content, "choices[0].message.content", (str, list))
    if isinstance(parts, str) or parts is None:
        return parts
    texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type", "text") == "text"]
    return _unicode("".join(t for t in texts if isinstance(t, str))) or None


def completion_of(value: Any) -> ModelReply:
    """The core's view of a parsed chat completion (its first choice); :class:`_NotACompletion`
    says what does not have the chat-completions shape."""
    _field(value, "the reply", dict, optional=False)
    choices = _field(value.get("choices"), "choices", list)
    if not choices:
        raise _NotACompletion("it has no choices")
    choice = _field(choices[0], "choices[0]", dict, optional=False)
    message = _field(choice.get("message"), "choices[0].message", dict, optional=False)
    raw_calls = _field(message.get("tool_calls"), "choices[0].message.tool_calls", list) or []
    calls = tuple(call for i, raw in enumerate(raw_calls) if (call := _tool_call(raw, i)) is not None)
    usage = _field(value.get("usage"), "usage", dict) or {}
    return ModelReply(
        model=_field(value.get("model"), "model", str) or "",
        content=_content(message.get("content")),
        tool_calls=calls,
        finish_reason=_field(choice.get("finish_reason"), "choices[0].finish_reason", str),
        usage=Usage(
            input_tokens=_count(usage, "prompt_tokens"), output_tokens=_count(usage, "completion_tokens")
        ),
    )


def reply_of(
    base_url: str,
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    api_key: str | None,
    protocol: str = OPENAI_CHAT,
) -> ModelReply:
    """The reply an endpoint answered with ``status`` (2xx) and ``body``, read as ``protocol``
    says (a chat completion, or a Messages API message); else :class:`ModelCallFailed` naming the
    endpoint and the kind of reply. Never another exception."""
    where = f"{shown_endpoint(base_url)} answered HTTP {status} with"
    expected = "a Messages API reply" if protocol == ANTHROPIC_MESSAGES else "a chat completion"
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        kind = reply_kind(headers, body, api_key)
        raise ModelCallFailed("ModelReplyNotJson", f"{where} {kind}, not {expected}", True) from None
    try:
        reply = reply_of_message(value) if protocol == ANTHROPIC_MESSAGES else completion_of(value)
    except (_NotACompletion, NotAMessage) as err:
        what = f"{where} {reply_kind(headers, body, api_key)} that is not {expected}: {err}"
        raise ModelCallFailed("ModelReplyInvalid", what, True) from None
    if reply.is_empty:
        finish = sanitized(reply.finish_reason or "none", None, 32)
        message = f"{where} {expected} with no content and no tool calls (finish reason {finish})"
        raise ModelCallFailed("ModelReplyEmpty", message, True)
    return reply
