"""One exchange with a chat-completions model, as the core sees it: a request it built, a reply.

Plain values, no SDK types: the shell translates to and from the ``openai`` client, so the core
stays free of I/O and of any vendor's classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from durable_agents.core.digest import canonical_digest, canonical_json


@dataclass(frozen=True)
class ModelRequest:
    """A chat-completions request: deterministic (the same facts give the same bytes)."""

    model: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    max_tokens: int | None = None
    """The most tokens the reply may take (an MCP server's sample); None: the endpoint's default."""

    def body(self) -> dict[str, Any]:
        """The request body (OpenAI chat-completions shape); one tool call per turn."""
        out: dict[str, Any] = {"model": self.model, "messages": list(self.messages)}
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        if self.tools:
            out["tools"] = list(self.tools)
            out["tool_choice"] = "auto"
            out["parallel_tool_calls"] = False
        return out

    def canonical_bytes(self) -> bytes:
        return canonical_json(self.body())

    def digest(self) -> str:
        return canonical_digest(self.body())


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model proposed. ``arguments_text`` is as the model wrote it: maybe not JSON."""

    id: str
    name: str
    arguments_text: str


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class ModelReply:
    """What the model answered: text (its stated reason, or a final answer) and tool calls."""

    model: str
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)

    @property
    def is_empty(self) -> bool:
        """No text and no tool call: no answer at all, never a final one (a model error)."""
        return not self.tool_calls and not (self.content or "").strip()
