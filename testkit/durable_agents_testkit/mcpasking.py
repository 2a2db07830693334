"""A reference MCP server (the ``mcp`` 2.x SDK, 2026-07-28 protocol) whose tools ask for input
before they complete, with an ``InputRequiredResult`` that carries opaque request state, and
count what they applied (issue 36, item 1).

Tools:

``book_room`` ``{"room": str}`` (consequential)
    Asks ``{"date": string (date), "nights": integer 1..14}`` (request ``stay``). Retried with an
    accepted answer and the echoed state, it books once per idempotency key (a retry with the same
    key answers the same booking, applied once); declined or canceled: a tool error, nothing booked.
    The state is the server's own (HMAC-signed): one not echoed verbatim is refused.
``ask_nested`` (read-only)
    Asks with a schema that is not a flat object of primitives: the client must refuse it and tell
    the server (declined); then answers ``"the client refused the form"``.
``ask_forever`` (read-only)
    Asks again on every retry, however it is answered.
``ask_later`` ``{"rounds": str}`` (read-only)
    Answers "not yet" (an ``InputRequiredResult`` with request state only) that many times, then
    ``"ready after N"``.
``ask_open`` ``{"form": "flat"|"nested"}`` (read-only; the 2025-11-25 path)
    Sends ``elicitation/create`` while the call is open and answers with what the client said:
    ``"accept {...}"``, ``"decline"``, ``"cancel"``, or ``"error: <message>"`` when the client
    refused the request with a JSON-RPC error.
``ask_link`` (read-only)
    A URL-mode request: the person opens the link; accepted, it answers ``"linked"``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any, Final

from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequiredResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
    ToolAnnotations,
)

from durable_agents_testkit.mcpserver import McpServerThread

IDEMPOTENCY_META_KEY: Final = "durable-agents.io/idempotency-key"
STAY_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "date": {"type": "string", "format": "date", "description": "Arrival date"},
        "nights": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["date", "nights"],
}
NESTED_SCHEMA: Final = {
    "type": "object",
    "properties": {"address": {"type": "object", "properties": {"street": {"type": "string"}}}},
}
LINK: Final = "https://pay.example/checkout/42"
_SECRET: Final = b"asking-server-state-key"


@dataclass
class Bookings:
    """What ``book_room`` applied: one booking per idempotency key, and every application."""

    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)
    applications: list[str] = field(default_factory=list)
    asked: int = 0


def _sign(state: dict[str, Any]) -> str:
    body = json.dumps(state, sort_keys=True)
    mac = hmac.new(_SECRET, body.encode(), hashlib.sha256).hexdigest()
    return f"{mac}.{body}"


def _unsign(token: str | None) -> dict[str, Any] | None:
    if token is None or "." not in token:
        return None
    mac, body = token.split(".", 1)
    good = hmac.new(_SECRET, body.encode(), hashlib.sha256).hexdigest()
    return json.loads(body) if hmac.compare_digest(mac, good) else None


def _text(text: str, *, error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(text=text)], is_error=error)


def _form(message: str, schema: dict[str, Any]) -> ElicitRequest:
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _tool(name: str, description: str, *, read_only: bool, **args: str) -> Tool:
    schema = {
        "type": "object",
        "properties": {arg: {"type": "string", "description": d} for arg, d in args.items()},
    }
    return Tool(
        name=name,
        description=description,
        input_schema=schema,
        annotations=ToolAnnotations(read_only_hint=read_only, idempotent_hint=False),
    )


TOOLS: Final = (
    _tool("book_room", "Book a room; asks for the stay.", read_only=False, room="The room"),
    _tool("ask_nested", "Asks with a nested form.", read_only=True),
    _tool("ask_forever", "Asks for input on every retry.", read_only=True),
    _tool("ask_link", "Asks the person to open a link.", read_only=True),
    _tool("ask_later", "Not yet, that many times.", read_only=True, rounds="How many times"),
    _tool("ask_open", "Asks while the call is open.", read_only=True, form="flat or nested"),
)


def _answer(params: CallToolRequestParams, key: str) -> ElicitResult | None:
    response = (params.input_responses or {}).get(key)
    return response if isinstance(response, ElicitResult) else None


def make_asking_server(bookings: Bookings) -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=list(TOOLS))

    def book(params: CallToolRequestParams) -> CallToolResult | InputRequiredResult:
        room = str((params.arguments or {}).get("room", ""))
        key = str((params.meta or {}).get(IDEMPOTENCY_META_KEY, ""))
        state, answer = _unsign(params.request_state), _answer(params, "stay")
        if answer is None or state is None or state.get("room") != room:
            bookings.asked += 1
            return InputRequiredResult(
                input_requests={
                    "stay": _form(f"When do you arrive in room {room}, and for how long?", STAY_SCHEMA)
                },
                request_state=_sign({"room": room}),
            )
        if answer.action != "accept" or answer.content is None:
            return _text(f"not booked: the person answered {answer.action}", error=True)
        if key in bookings.by_key:  # the same key again: the same booking, not applied twice
            return _text(json.dumps(bookings.by_key[key], sort_keys=True))
        booking = {"booking": f"B-{len(bookings.by_key) + 1}", "room": room, **answer.content}
        bookings.by_key[key] = booking
        bookings.applications.append(key)
        return _text(json.dumps(booking, sort_keys=True))

    async def call_tool(
        ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult | InputRequiredResult:
        name = params.name
        if name == "book_room":
            return book(params)
        if name == "ask_nested":
            answer = _answer(params, "address")
            if answer is None:
                return InputRequiredResult(
                    input_requests={"address": _form("Your address?", NESTED_SCHEMA)}, request_state="nested"
                )
            return _text(f"the client refused the form ({answer.action})")
        if name == "ask_forever":
            rounds = int(params.request_state or "0") + 1
            return InputRequiredResult(
                input_requests={f"q{rounds}": _form("Once more?", STAY_SCHEMA)}, request_state=str(rounds)
            )
        if name == "ask_open":
            nested = (params.arguments or {}).get("form") == "nested"
            schema = NESTED_SCHEMA if nested else STAY_SCHEMA
            try:
                said = await ctx.session.elicit_form("When do you arrive?", schema, ctx.request_id)
            except MCPError as err:
                return _text(f"error: {err.error.message}")
            content = f" {json.dumps(said.content, sort_keys=True)}" if said.content else ""
            return _text(f"{said.action}{content}")
        if name == "ask_later":
            seen = int(params.request_state or "0")
            if seen < int((params.arguments or {}).get("rounds", "0")):
                return InputRequiredResult(request_state=str(seen + 1))
            return _text(f"ready after {seen}")
        if name == "ask_link":
            answer = _answer(params, "pay")
            if answer is None:
                url = ElicitRequestURLParams(message="Pay the deposit", url=LINK)
                return InputRequiredResult(
                    input_requests={"pay": ElicitRequest(params=url)}, request_state="pay"
                )
            return _text("linked" if answer.action == "accept" else f"not linked ({answer.action})")
        return _text(f"unknown tool {name!r}", error=True)

    return Server("durable-agents-asking", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


class AskingServerThread(McpServerThread):
    """:class:`McpServerThread` serving :func:`make_asking_server` (the ticket system unused)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.bookings = Bookings()
        self._server = make_asking_server(self.bookings)

    def restart(self) -> None:
        """The server stopped and started again on its port, as a restarted process: its
        connections and its SDK server are new; what survives is its system of record (the
        bookings) and its state key (a stateless server's configuration)."""
        port = self.port
        self.stop()
        self._requested_port = port
        self._server = make_asking_server(self.bookings)
        self.start()

    def applications(self) -> list[str]:
        """The idempotency keys ``book_room`` applied, in order (one per booking)."""
        return self.call(lambda: list(self.bookings.applications))

    def asked(self) -> int:
        """How many calls of ``book_room`` were answered with a request for input."""
        return self.call(lambda: self.bookings.asked)
