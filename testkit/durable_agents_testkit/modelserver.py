"""The reference model server: OpenAI-compatible chat completions (and the Anthropic Messages API,
``POST /v1/messages``) answered from a script, with call counts and injected faults, so tests and
the demo drive the model planner without a real model.

The *script* (:class:`Script`; YAML, JSON or a dict) is a model name and ordered rules. The first
rule whose ``when`` holds answers: ``called``/``notCalled`` (tool names in assistant tool calls),
``lastToolResultContains`` (the last ``tool`` message), ``userContains`` (any ``user`` message),
all optional and ANDed. ``times: N`` lets a rule answer at most N times, so a replay can get
another answer (a model that changes its mind after a crash). No match: ``(no scripted reply)``. ::

    model: scripted
    rules:
      - when: {notCalled: [lookup_order]}
        toolCalls: [{name: lookup_order, arguments: {orderId: A-1}}]  # or argumentsText: raw string
        times: 1
      - when: {called: [lookup_order], lastToolResultContains: shipped}
        content: Your order has shipped.

HTTP API (JSON; errors are OpenAI-style ``{"error": {"message", "type", "param", "code"}}``; with
an API key configured, ``/v1/*`` needs ``Authorization: Bearer <key>``, else 401):

``POST /v1/chat/completions``
    The standard request for the script's ``model`` (else 404). 400 for ``"stream": true`` and for
    what the real API refuses (a tool call without its ``tool`` answer next). Completion and tool
    call ids are sha256 digests of the canonical (RFC 8785) request and of the reply: a replay
    answered alike gets the same ids, another answer new ones. ``usage``: canonical bytes // 4.
``POST /v1/messages``
    The Anthropic Messages API, scripted alike (see :mod:`.modelserver_messages`): the request
    is recorded in the chat-completions shape above; the key as ``x-api-key`` or bearer.
``GET /v1/models``
    The script's model.
``POST /faults``
    ``{"mode", "times": N (default 1), "delay": seconds (default 5), "match": substring of the last
    message's content}``. A valid completion request consumes a unit of the first matching fault:
    ``slow`` sleeps, then answers; ``malformed`` cuts the first tool call's arguments short;
    ``unknown_tool`` names a tool not offered (these two add a tool call if there is none);
    ``none`` answers normally. A broken endpoint, using no rule: ``error`` answers 500; ``drop``
    closes the connection; ``html`` answers 200 with an HTML page; ``not_json`` 200 with an
    ``application/json`` body that is not JSON; ``not_a_completion`` 200 with JSON that has no
    choices; ``unauthorized`` 401, echoing the key it was given; ``empty`` 200 with a completion
    that has no content and no tool calls; ``overloaded`` 529; ``huge`` 200 with 16 MiB of JSON,
    chunked (no ``Content-Length``).
    ``GET /faults`` lists pending faults, ``DELETE /faults`` clears them.
``GET /calls``
    ``{"total", "unmatched", "byRule": {"<index>": n}, "byProtocol": {"openai-chat" |
    "anthropic-messages": n}, "requests": [the last 200 bodies, in the chat-completions shape]}``.
``POST /script`` replaces the script and zeroes rule uses; ``POST /reset`` clears all the rest.

A slow reply takes its rule use before sleeping, as a model spends tokens for a caller who gives
up. State changes happen inside one event loop; :class:`ModelServerThread` runs the server on its
own loop in a daemon thread, with control methods that need no HTTP. Only loopback addresses are
served unless ``allow_non_loopback`` is set.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import enum
import hashlib
import hmac
import json
import socket
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import pydantic.dataclasses
import rfc8785
import yaml
from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import ConfigDict, Field, TypeAdapter, model_validator
from pydantic import JsonValue as PydanticJson
from pydantic.alias_generators import to_camel

from durable_agents_testkit.loopback import (
    LOOPBACK,
    RUNNER_OPTIONS,
    LoopThread,
    RunningApp,
    http_url,
    refuse_non_loopback,
)
from durable_agents_testkit.modelserver_messages import error, key_given, post_messages

NO_SCRIPTED_REPLY = "(no scripted reply)"
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})

JsonValue: TypeAlias = Any  # any value json.loads can produce
Message: TypeAlias = dict[str, JsonValue]


# -- the script ------------------------------------------------------------------------------------

# camelCase in files, like the CRDs; unknown fields are errors; counts are strict (no "3" or true).
_SCRIPT = ConfigDict(extra="forbid", alias_generator=to_camel, validate_by_name=True, allow_inf_nan=False)


def _text(content: JsonValue) -> str:
    """The text of a message content: a string, or the text parts of a list of content parts."""
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def _tool_calls(message: Message) -> list[Message]:
    calls = message.get("tool_calls") if message["role"] == "assistant" else None
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def _function_names(items: list[JsonValue]) -> set[str]:
    """The ``function.name`` of each tool or tool call in ``items``."""
    functions = [i.get("function") for i in items if isinstance(i, dict)]
    return {f["name"] for f in functions if isinstance(f, dict) and isinstance(f.get("name"), str)}


@pydantic.dataclasses.dataclass(frozen=True, config=_SCRIPT)
class Condition:
    """When a rule answers: every given field must hold."""

    called: list[str] = Field(default_factory=list)
    not_called: list[str] = Field(default_factory=list)
    last_tool_result_contains: str | None = None
    user_contains: str | None = None

    def holds(self, messages: list[Message]) -> bool:
        called = _function_names([c for m in messages for c in _tool_calls(m)])
        if not called.issuperset(self.called) or not called.isdisjoint(self.not_called):
            return False
        last_result = [_text(m.get("content")) for m in messages if m["role"] == "tool"][-1:]
        users = [_text(m.get("content")) for m in messages if m["role"] == "user"]
        wanted = [(self.last_tool_result_contains, last_result), (self.user_contains, users)]
        return all(part is None or any(part in text for text in texts) for part, texts in wanted)


@pydantic.dataclasses.dataclass(frozen=True, config=_SCRIPT)
class ScriptedCall:
    """A tool call: ``arguments`` (sent as a JSON string) or ``arguments_text`` (sent as is)."""

    name: str = Field(min_length=1)
    arguments: dict[str, PydanticJson] | None = None
    arguments_text: str | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ScriptedCall:
        if self.arguments is not None and self.arguments_text is not None:
            raise ValueError("give arguments or argumentsText, not both")
        return self

    @property
    def text(self) -> str:
        if self.arguments_text is not None:
            return self.arguments_text
        return json.dumps(self.arguments or {}, ensure_ascii=False)


@pydantic.dataclasses.dataclass(frozen=True, config=_SCRIPT)
class Rule:
    """An answer and when to give it. Neither content nor tool calls is an empty answer."""

    when: Condition = Field(default_factory=Condition)
    content: str | None = None
    tool_calls: list[ScriptedCall] = Field(default_factory=list)
    times: int | None = Field(default=None, gt=0, strict=True)


@pydantic.dataclasses.dataclass(frozen=True, config=_SCRIPT)
class Script:
    model: str = Field(default="scripted", min_length=1)
    rules: list[Rule] = Field(default_factory=list)

    @classmethod
    def from_dict(cls, raw: object) -> Script:
        """The script ``raw`` describes; pydantic's ValidationError (a ValueError) says what is wrong."""
        return TypeAdapter(cls).validate_python(raw)

    @classmethod
    def from_file(cls, path: str | Path) -> Script:
        """Load a YAML or JSON file (YAML reads JSON too)."""
        return cls.from_dict(yaml.safe_load(Path(path).read_text(encoding="utf-8")))


# -- faults and state ------------------------------------------------------------------------------


class FaultMode(enum.StrEnum):
    SLOW = "slow"
    ERROR = "error"
    DROP = "drop"
    MALFORMED = "malformed"
    UNKNOWN_TOOL = "unknown_tool"
    NONE = "none"
    # A broken endpoint (or what stands in front of it); these use no rule:
    HTML = "html"  # 200, text/html: a proxy's sign-in page
    NOT_JSON = "not_json"  # 200, application/json, a body that is not JSON
    NOT_A_COMPLETION = "not_a_completion"  # 200, JSON without choices
    UNAUTHORIZED = "unauthorized"  # 401, echoing the key it was given (as careless servers do)
    EMPTY = "empty"  # 200, a completion with no content and no tool calls
    OVERLOADED = "overloaded"  # 529, the Anthropic API's "overloaded_error"
    HUGE = "huge"  # 200, application/json, chunked (no Content-Length): HUGE_BYTES of a JSON string


# The modes that answer without a rule, with what they answer.
BROKEN = frozenset({FaultMode.ERROR, FaultMode.DROP, FaultMode.HTML, FaultMode.NOT_JSON})
BROKEN |= {FaultMode.NOT_A_COMPLETION, FaultMode.UNAUTHORIZED, FaultMode.EMPTY, FaultMode.OVERLOADED}
BROKEN |= {FaultMode.HUGE}
HUGE_BYTES = 16 * 1024 * 1024
PROXY_PAGE = (
    "<!DOCTYPE html>\n<html><head><title>Sign in to continue - Example Proxy</title></head>"
    "<body><h1>Authentication required</h1><p>Your session has expired.</p></body></html>"
)
NOT_JSON_BODY = "upstream connect error or disconnect/reset before headers. reset reason: overflow"


@pydantic.dataclasses.dataclass(config=ConfigDict(extra="forbid", allow_inf_nan=False))
class Fault:
    """A queued fault; ``times`` counts the upcoming matching requests it still applies to."""

    mode: FaultMode
    times: int = Field(default=1, gt=0, strict=True)
    delay: float = Field(default=5.0, ge=0, strict=True)
    match: str | None = None


def _digest(value: JsonValue) -> str:
    return hashlib.sha256(rfc8785.dumps(value)).hexdigest()


@dataclass
class ModelServer:
    """The server's state; use it on its event loop only (:class:`ModelServerThread` marshals calls)."""

    script: Script = field(default_factory=lambda: Script())
    api_key: str | None = None
    uses: collections.Counter[int] = field(default_factory=collections.Counter)  # by rule index
    protocols: collections.Counter[str] = field(default_factory=collections.Counter)
    total: int = 0
    unmatched: int = 0
    requests: collections.deque[JsonValue] = field(default_factory=lambda: collections.deque(maxlen=200))
    faults: list[Fault] = field(default_factory=list)

    def set_script(self, script: Script | Mapping[str, JsonValue]) -> Script:
        self.script = script if isinstance(script, Script) else Script.from_dict(script)
        self.uses.clear()
        return self.script

    def inject(self, mode: FaultMode | str, **options: JsonValue) -> Fault:
        self.faults.append(TypeAdapter(Fault).validate_python({"mode": mode, **options}))
        return self.faults[-1]

    def reset(self) -> None:
        self.total = self.unmatched = 0
        self.uses.clear()
        self.protocols.clear()
        self.requests.clear()
        self.faults.clear()

    def calls_json(self) -> dict[str, JsonValue]:
        by_rule = {str(i): self.uses[i] for i in range(len(self.script.rules))}
        return dict(
            total=self.total,
            unmatched=self.unmatched,
            byRule=by_rule,
            byProtocol=dict(self.protocols),
            requests=list(self.requests),
        )

    def _choose(self, messages: list[Message]) -> Rule:
        """The first rule with uses left whose condition holds takes a use; none: the fallback."""
        for index, rule in enumerate(self.script.rules):
            if (rule.times is None or self.uses[index] < rule.times) and rule.when.holds(messages):
                self.uses[index] += 1
                return rule
        self.unmatched += 1
        return Rule(content=NO_SCRIPTED_REPLY)

    def complete(
        self, body: Message, canonical: bytes, protocol: str = "openai-chat"
    ) -> tuple[Fault | None, JsonValue]:
        """Count and answer one valid request, given in the chat-completions shape (the Messages
        API side translates first): (the fault taken, the completion or None)."""
        messages: list[Message] = body["messages"]
        self.total += 1
        self.protocols[protocol] += 1
        self.requests.append(body)
        last = _text(messages[-1].get("content"))
        fault = next((f for f in self.faults if f.match is None or f.match in last), None)
        if fault is not None:  # consume one unit of the first pending fault that matches
            fault.times -= 1
            self.faults[:] = [f for f in self.faults if f.times > 0]
        mode = fault.mode if fault is not None else FaultMode.NONE
        if mode is FaultMode.EMPTY:
            return fault, self._completion(canonical, None, [])
        if mode in BROKEN:
            return fault, None
        rule = self._choose(messages)
        calls = [(c.name, c.text) for c in rule.tool_calls]
        offered = _function_names(body.get("tools") or [])
        first = calls[0] if calls else (min(offered, default="tool"), "{}")
        if mode is FaultMode.MALFORMED:  # cut short as by a length limit: never JSON ("…" is no token)
            calls[:1] = [(first[0], first[1][:-1] + "…")]
        elif mode is FaultMode.UNKNOWN_TOOL:
            # Longer than every offered name, so never one of them.
            calls[:1] = [("not_offered".ljust(max(map(len, offered), default=0) + 1, "_"), first[1])]
        return fault, self._completion(canonical, rule.content, calls)

    def _completion(self, canonical: bytes, content: str | None, calls: list[tuple[str, str]]) -> JsonValue:
        request = hashlib.sha256(canonical).hexdigest()
        # Ids hash the request and the reply: a replay answered alike gets the same ids, while
        # another answer to the same request (a used-up rule, a fault) never reuses an id.
        message: Message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{_digest([request, i, n, a])[:24]}",
                    "type": "function",
                    "function": {"name": n, "arguments": a},
                }
                for i, (n, a) in enumerate(calls)
            ]
        prompt, completion = len(canonical) // 4, len(rfc8785.dumps(message)) // 4
        usage = dict(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        return {
            "id": f"chatcmpl-{_digest([request, message])[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.script.model,
            "choices": [choice],
            "usage": usage,
        }


def _conversation_problem(messages: JsonValue) -> str | None:
    """Why the real API would refuse these messages, or None: tool calls need answers, in turn."""
    if not isinstance(messages, list) or not messages:
        return "messages: must be a non-empty list"
    pending: set[str] = set()
    for index, message in enumerate([*messages, {"role": "(end)"}]):
        if index < len(messages) and (not isinstance(message, dict) or message.get("role") not in ROLES):
            return f"messages[{index}]: must be an object with a role in {sorted(ROLES)}"
        if message["role"] == "tool" and message.get("tool_call_id") in pending:
            pending.discard(message["tool_call_id"])
        elif message["role"] == "tool" or pending:
            return f"messages[{index}]: the tool calls {sorted(pending)} need one 'tool' answer each, next"
        else:
            pending = {str(c.get("id")) for c in _tool_calls(message)}
    return None


# -- HTTP ------------------------------------------------------------------------------------------

SERVER_KEY: web.AppKey[ModelServer] = web.AppKey("modelserver", ModelServer)


def _error(status: int, message: str, code: str | None = None) -> web.Response:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    error = {"message": message, "type": kind, "param": None, "code": code}
    return web.json_response({"error": error}, status=status)


@web.middleware
async def _check_api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
    key = request.app[SERVER_KEY].api_key
    if key is not None and request.path == "/v1/messages":  # the Messages API's own header
        if not key_given(request, key):
            return error(401, "invalid x-api-key")
    elif key is not None and request.path.startswith("/v1/"):
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            return _error(401, "Incorrect API key provided.", code="invalid_api_key")
    return await handler(request)


async def _post_completion(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER_KEY]
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return _error(400, "the body must be a JSON object")
    if body.get("stream"):
        return _error(400, "streaming is not supported by this server", code="unsupported_parameter")
    if body.get("model") != server.script.model:
        return _error(404, f"The model `{body.get('model')}` does not exist.", code="model_not_found")
    problem = _conversation_problem(body.get("messages"))
    if problem is not None:
        return _error(400, problem)
    try:
        canonical = rfc8785.dumps(body)
    except rfc8785.CanonicalizationError as exc:  # integers beyond 2**53 and the like
        return _error(400, f"the body has no canonical JSON form: {exc}")

    # From here to the answer there is no await: taking the fault and the rule use is atomic.
    fault, completion = server.complete(body, canonical)
    broken = broken_reply(fault.mode, request.headers.get("Authorization", "")) if fault is not None else None
    if broken is not None:
        return broken
    if fault is not None and fault.mode is FaultMode.DROP:
        # Close without writing anything: the client sees a server disconnect. aiohttp then fails
        # to write the response below (a ConnectionError it handles quietly).
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=500)
    if fault is not None and fault.mode is FaultMode.SLOW:
        await asyncio.sleep(fault.delay)
    return web.json_response(completion)


def broken_reply(mode: FaultMode, authorization: str) -> web.Response | None:
    """The reply of a broken endpoint for ``mode``; None for the modes handled in line."""
    if mode is FaultMode.ERROR:
        return _error(500, "injected fault: the server had an error")
    if mode is FaultMode.OVERLOADED:
        return _error(529, "injected fault: overloaded")
    if mode is FaultMode.HTML:
        return web.Response(text=PROXY_PAGE, content_type="text/html")
    if mode is FaultMode.NOT_JSON:
        return web.Response(text=NOT_JSON_BODY, content_type="application/json")
    if mode is FaultMode.NOT_A_COMPLETION:
        return web.json_response({"object": "list", "data": [], "note": "this is not a chat completion"})
    if mode is FaultMode.UNAUTHORIZED:
        given = authorization.removeprefix("Bearer ")
        return _error(401, f"Incorrect API key provided: {given}.", code="invalid_api_key")
    if mode is FaultMode.HUGE:  # valid JSON, endless to a client that reads all of it
        padding = b"x" * HUGE_BYTES
        huge = web.Response(body=b'{"padding": "' + padding + b'"}', content_type="application/json")
        huge.enable_chunked_encoding()
        return huge
    return None


async def _get_models(request: web.Request) -> web.Response:
    model = request.app[SERVER_KEY].script.model
    data = [{"id": model, "object": "model", "created": 0, "owned_by": "durable-agents-testkit"}]
    return web.json_response({"object": "list", "data": data})


async def _post_fault(request: web.Request) -> web.Response:
    server = request.app[SERVER_KEY]
    try:
        spec = await request.json()
        fault = server.inject(**spec) if isinstance(spec, dict) else server.inject(spec)
    except (TypeError, ValueError) as exc:
        return _error(400, f"a fault is {{mode, times, delay, match}}: {exc}")
    pending = [asdict(f) for f in server.faults]
    return web.json_response({"queued": asdict(fault), "pending": pending}, status=201)


async def _faults(request: web.Request) -> web.Response:
    faults = request.app[SERVER_KEY].faults
    if request.method == "DELETE":
        faults.clear()
    return web.json_response({"pending": [asdict(f) for f in faults]})


async def _get_calls(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVER_KEY].calls_json())


async def _post_script(request: web.Request) -> web.Response:
    try:
        script = request.app[SERVER_KEY].set_script(Script.from_dict(await request.json()))
    except ValueError as exc:
        return _error(400, str(exc))
    return web.json_response({"model": script.model, "rules": len(script.rules)})


async def _post_reset(request: web.Request) -> web.Response:
    request.app[SERVER_KEY].reset()
    return web.json_response({"reset": True})


def make_app(server: ModelServer | None = None) -> web.Application:
    """The aiohttp application serving ``server`` (a fresh one with an empty script if not given)."""
    # Conversations with long tool results outgrow aiohttp's 1 MiB default body limit.
    app = web.Application(middlewares=[_check_api_key], client_max_size=16 * 1024 * 1024)
    app[SERVER_KEY] = server if server is not None else ModelServer()
    app.router.add_post("/v1/chat/completions", _post_completion)
    app.router.add_post("/v1/messages", post_messages(lambda request: request.app[SERVER_KEY], broken_reply))
    app.router.add_get("/v1/models", _get_models)
    app.router.add_post("/faults", _post_fault)
    app.router.add_get("/faults", _faults)
    app.router.add_delete("/faults", _faults)
    app.router.add_get("/calls", _get_calls)
    app.router.add_post("/script", _post_script)
    app.router.add_post("/reset", _post_reset)
    return app


class RunningModelServer(RunningApp):
    """The server listening on a socket; ``port=0`` picks a free port (see :attr:`base_url`)."""

    def __init__(
        self,
        server: ModelServer | None = None,
        host: str = LOOPBACK,
        port: int = 0,
        *,
        allow_non_loopback: bool = False,
    ) -> None:
        self.server = server if server is not None else ModelServer()
        # RUNNER_OPTIONS: a client giving up on a slow reply cancels the sleep; stopping never waits.
        super().__init__(
            make_app(self.server), host, port, allow_non_loopback=allow_non_loopback, name="the model server"
        )

    @property
    def base_url(self) -> str:
        """What the OpenAI client takes as ``base_url``; the control endpoints are beside ``/v1``."""
        return f"{self.url}/v1"


@contextlib.asynccontextmanager
async def serve(
    host: str = LOOPBACK,
    port: int = 0,
    server: ModelServer | None = None,
    *,
    allow_non_loopback: bool = False,
) -> AsyncIterator[RunningModelServer]:
    """Serve the model server for the duration of the ``async with`` block."""
    async with RunningModelServer(server, host, port, allow_non_loopback=allow_non_loopback) as running:
        yield running


class ModelServerThread(LoopThread[RunningModelServer]):
    """The server on its own event loop in a daemon thread, for synchronous test code. The control
    methods run on that loop and wait for the result: safe from any thread, and no HTTP needed
    (:meth:`call` runs any function there, the only place that may touch :attr:`server`)."""

    def __init__(
        self,
        script: Script | Mapping[str, JsonValue] | None = None,
        *,
        api_key: str | None = None,
        host: str = LOOPBACK,
        port: int = 0,
        allow_non_loopback: bool = False,
    ) -> None:
        refuse_non_loopback(host, allow_non_loopback)
        self.server = ModelServer(api_key=api_key)
        self.server.set_script(script if script is not None else Script())
        super().__init__(
            "the model server",
            lambda: RunningModelServer(self.server, host, port, allow_non_loopback=allow_non_loopback),
        )

    @property
    def base_url(self) -> str:
        """What the OpenAI client takes as ``base_url``; the control endpoints are beside ``/v1``."""
        return self._served.base_url

    def base_url_for(self, protocol: str) -> str:
        """The ``baseUrl`` of an endpoint speaking ``protocol``: ``…/v1`` for openai-chat, the
        server's root for anthropic-messages (its client appends ``/v1/messages``)."""
        return self._served.url if protocol == "anthropic-messages" else self.base_url

    def calls(self) -> dict[str, JsonValue]:
        """The ``GET /calls`` document."""
        return self.call(self.server.calls_json)

    def set_script(self, script: Script | Mapping[str, JsonValue]) -> Script:
        return self.call(lambda: self.server.set_script(script))

    def inject(self, mode: FaultMode | str, **options: JsonValue) -> Fault:
        """Queue a fault; ``options`` are :class:`Fault`'s ``times``, ``delay`` and ``match``."""
        return self.call(lambda: self.server.inject(mode, **options))

    def reset(self) -> None:
        self.call(self.server.reset)


# -- standalone ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m durable_agents_testkit.modelserver",
        description=(
            "The reference model server: OpenAI-compatible chat completions and the Anthropic "
            "Messages API, answered from a script."
        ),
    )
    parser.add_argument("--script", required=True, type=Path, help="the script: a YAML or .json file")
    parser.add_argument("--host", default=LOOPBACK, help="address to listen on (loopback only by default)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on; 0 picks a free one")
    parser.add_argument("--api-key", help="require 'Authorization: Bearer <key>' on /v1/*")
    parser.add_argument("--allow-non-loopback", action="store_true", help="allow a non-loopback address")
    args = parser.parse_args(argv)
    try:
        refuse_non_loopback(args.host, args.allow_non_loopback)
        server = ModelServer(script=Script.from_file(args.script), api_key=args.api_key)
        # Bind first, so the one line printed (a launcher reads it) has the real port.
        sock = socket.create_server((args.host, args.port), family=socket.getaddrinfo(args.host, None)[0][0])
    except (OSError, ValueError, yaml.YAMLError) as exc:
        parser.error(str(exc))
    print(http_url(args.host, sock.getsockname()[1], "/v1"), flush=True)
    web.run_app(make_app(server), sock=sock, print=None, **RUNNER_OPTIONS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
