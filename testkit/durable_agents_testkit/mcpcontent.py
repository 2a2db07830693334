"""A reference MCP server whose read-only tools answer every kind of content a tool result can
carry, and misbehave in the ways a client must bound (issue 36, items 4 and 5).

Tools (all ``readOnlyHint=true``, no arguments unless said):

``show_everything``
    One result with a text part, a PNG image, a WAV audio clip, a resource link, an embedded text
    resource and an embedded binary resource (:data:`EVERYTHING`).
``show_structured``
    Structured content ``{"total": 42, "currency": "EUR"}`` matching its declared output schema
    (:data:`TOTAL_SCHEMA`), with the JSON text part the spec asks for.
``show_mismatch``
    Declares the same output schema and answers ``{"total": "many"}``: a result the client must
    refuse as a tool error.
``show_large`` ``{"mebibytes": int}``
    A text part of that many MiB (one 50 MiB result, say).
``show_noisy`` ``{"progress": int, "logs": int, "seconds": int}``
    Sends that many progress notifications and log notifications (each log line 2 KiB) while the
    call is open, spread over ``seconds`` (default 0: at once), then answers ``"noisy done"``.
    :meth:`ContentServerThread.noise` counts what it sent.

Run by :class:`ContentServerThread`, the ticket server's thread with this server in its place.
"""

from __future__ import annotations

import asyncio
import base64
import json
import warnings
from dataclasses import dataclass
from typing import Any, Final

from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolRequestParams,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ListToolsResult,
    PaginatedRequestParams,
    ResourceLink,
    TextContent,
    TextResourceContents,
    Tool,
    ToolAnnotations,
)

from durable_agents_testkit.mcpserver import McpServerThread

PNG: Final = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
WAV: Final = base64.b64encode(b"RIFF" + b"\0" * 40).decode()
BLOB: Final = base64.b64encode(b"\x00\x01binary report\x02" * 64).decode()
REPORT_URI: Final = "https://reports.example/q3.pdf"
NOTE_URI: Final = "memo://notes/7"
NOTE_TEXT: Final = "Remember: the gateway was replaced on Monday."
TOTAL_SCHEMA: Final = {
    "type": "object",
    "properties": {"total": {"type": "integer"}, "currency": {"type": "string"}},
    "required": ["total"],
}
LOG_LINE_BYTES: Final = 2048

EVERYTHING: Final = [
    TextContent(text="Quarterly figures attached."),
    ImageContent(data=PNG, mime_type="image/png"),
    AudioContent(data=WAV, mime_type="audio/wav"),
    ResourceLink(name="q3-report", uri=REPORT_URI, mime_type="application/pdf", description="The Q3 report"),
    EmbeddedResource(resource=TextResourceContents(uri=NOTE_URI, mime_type="text/plain", text=NOTE_TEXT)),
    EmbeddedResource(
        resource=BlobResourceContents(uri="blob://raw/1", mime_type="application/octet-stream", blob=BLOB)
    ),
]


def _tool(name: str, description: str, output: dict[str, Any] | None = None, **args: str) -> Tool:
    schema = {
        "type": "object",
        "properties": {arg: {"type": "integer", "description": doc} for arg, doc in args.items()},
        "additionalProperties": False,
    }
    return Tool(
        name=name,
        description=description,
        input_schema=schema,
        output_schema=output,
        annotations=ToolAnnotations(read_only_hint=True),
    )


TOOLS: Final = (
    _tool("show_everything", "A result with every kind of content."),
    _tool("show_large", "A text result of the given size.", mebibytes="Its size in MiB."),
    _tool("show_mismatch", "Structured content that does not match the schema.", TOTAL_SCHEMA),
    _tool(
        "show_noisy",
        "Progress and log notifications, then a short answer.",
        progress="Progress notifications to send.",
        logs="Log notifications to send.",
        seconds="Seconds to spread them over (0: at once).",
    ),
    _tool("show_structured", "Structured content matching the schema.", TOTAL_SCHEMA),
)
CONTENT_TOOL_NAMES: Final = tuple(tool.name for tool in TOOLS)


@dataclass
class Noise:
    """What ``show_noisy`` sent, and how many calls it answered."""

    progress: int = 0
    logs: int = 0
    answered: int = 0


def _count(arguments: dict[str, Any] | None, name: str, most: int) -> int:
    value = (arguments or {}).get(name, 0)
    return max(0, min(int(value), most)) if isinstance(value, int) else 0


def make_content_server(noise: Noise) -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=list(TOOLS))

    async def noisy(ctx: ServerRequestContext[Any], arguments: dict[str, Any] | None) -> CallToolResult:
        progress, logs = _count(arguments, "progress", 100_000), _count(arguments, "logs", 100_000)
        steps = max(progress, logs, 1)
        pause = _count(arguments, "seconds", 600) / steps  # spread over that many seconds
        for n in range(max(progress, logs)):
            if pause:
                await asyncio.sleep(pause)
            if n < progress:
                await ctx.session.report_progress(n + 1, progress, f"step {n + 1} of {progress}")
                noise.progress += 1
            if n < logs:
                line = f"log line {n}: " + "x" * LOG_LINE_BYTES
                with warnings.catch_warnings():  # deprecated in 2026-07-28, still what servers send
                    warnings.simplefilter("ignore")
                    await ctx.session.send_log_message(
                        "info", line, "noisy", related_request_id=ctx.request_id
                    )
                noise.logs += 1
        noise.answered += 1
        return CallToolResult(content=[TextContent(text="noisy done")])

    async def call_tool(ctx: ServerRequestContext[Any], params: CallToolRequestParams) -> CallToolResult:
        name = params.name
        if name == "show_everything":
            return CallToolResult(content=list(EVERYTHING))
        if name == "show_structured":
            total = {"total": 42, "currency": "EUR"}
            return CallToolResult(content=[TextContent(text=json.dumps(total))], structured_content=total)
        if name == "show_mismatch":
            wrong = {"total": "many"}
            return CallToolResult(content=[TextContent(text=json.dumps(wrong))], structured_content=wrong)
        if name == "show_large":
            size = _count(params.arguments, "mebibytes", 256) * 1024 * 1024
            return CallToolResult(content=[TextContent(text="L" * size)])
        if name == "show_noisy":
            return await noisy(ctx, params.arguments)
        return CallToolResult(content=[TextContent(text=f"unknown tool {name!r}")], is_error=True)

    return Server("durable-agents-content", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


class ContentServerThread(McpServerThread):
    """:class:`McpServerThread` serving :func:`make_content_server` (the ticket system unused)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.sent = Noise()
        self._server = make_content_server(self.sent)

    def noise(self) -> Noise:
        return self.call(lambda: Noise(self.sent.progress, self.sent.logs, self.sent.answered))
