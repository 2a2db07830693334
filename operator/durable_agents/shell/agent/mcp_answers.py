"""What an MCP tool call answers: a result, or an error that says whether anything was sent.

Kept apart from :mod:`.mcp_tools` (the client) so that the ledger and the agent name the answers
without the client's imports; :mod:`.mcp_tools` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from durable_agents.core.agent.mcp_elicitation import MAX_INPUT_ROUNDS
from durable_agents.core.digest import canonical_json
from durable_agents.shell.agent.mcp_elicitation import InputAsked


@dataclass(frozen=True)
class McpResult:
    """A ``CallToolResult``. ``content`` is ``structuredContent`` when the server sent it, else
    the text parts joined by newlines, else (non-text parts present) the parts as JSON objects,
    binary ones described (:mod:`durable_agents.core.agent.mcp_content`)."""

    is_error: bool
    content: Any


class McpError(Exception):
    """An MCP operation failed. ``url`` is the server's endpoint."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class McpUnreachable(McpError):
    """The operation failed before the ``tools/call`` request was sent: nothing was sent."""


class McpToolNotListed(McpError):
    """The server does not list the tool that was to be called; nothing was sent."""


class McpCallUnknown(McpError):
    """The ``tools/call`` request was sent and no result came back: the server may have applied
    it. ``code`` is the JSON-RPC error code when the failure was a JSON-RPC error."""

    def __init__(self, message: str, *, url: str, tool: str, code: int | None = None) -> None:
        super().__init__(message, url=url)
        self.tool = tool
        self.code = code


class McpInputRequired(McpError):
    """The server asks for input before it completes the call (2026-07-28); nothing was applied
    (the round trip is stateless). ``asked``: the questions, the refused requests, the state."""

    def __init__(self, url: str, tool: str, asked: InputAsked) -> None:
        keys = ", ".join(question.key for question in asked.questions)
        if keys or asked.refused:
            said = f"asks for input before it completes ({keys or 'nothing a person can answer'})"
        else:
            said = f"asked only to be retried with its request state, {MAX_INPUT_ROUNDS} times"
        super().__init__(f"{tool} at {url} {said}; nothing was applied", url=url)
        self.tool = tool
        self.asked = asked


OUTCOME_MAX_BYTES = 16 * 1024


def bounded_content(content: Any) -> Any:
    """The tool's answer as the outcome keeps it: whole when small, else its first bytes as text,
    with a note that tells the model the cut (``note`` sorts first: a later cut keeps it)."""
    text = canonical_json(content)
    if len(text) <= OUTCOME_MAX_BYTES:
        return content
    return {
        "note": f"cut: the result has {len(text)} bytes, only its first {OUTCOME_MAX_BYTES} are shown",
        "truncated": text[:OUTCOME_MAX_BYTES].decode("utf-8", errors="ignore"),
    }
