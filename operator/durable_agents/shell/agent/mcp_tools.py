"""MCP tools, the operator's client side: list a server's tools and call one over streamable HTTP,
through the official MCP SDK, with every failure mapped to what the operator can know about the
call's outcome.

One connection per operation: :func:`list_tools` and :func:`call_tool` each open an SDK
``Client``, do the protocol handshake, do their work and close it. That costs a handshake per call
but keeps no session state that a server restart or a failover could silently invalidate, and it
makes the "was it sent?" question below answerable per call.

What a caller of :func:`call_tool` can be told:

* :class:`McpResult` - the server answered with a ``CallToolResult``. ``is_error=True`` is a tool
  error: a definite answer from the tool (for the reference server: not applied).
* :class:`McpUnreachable` - the ``tools/call`` request was never sent: the connection could not be
  opened, or the handshake or the tool listing that precede the call failed or timed out, or the
  call's own HTTP connection could not be opened (an ``httpx`` connect error: no request byte went
  out). Safe to send again.
* :class:`McpToolNotListed` - the server does not list the tool; nothing was sent.
* :class:`McpCallUnknown` - the request was handed to the transport and no result came back: the
  connection dropped before the answer (the SDK raises ``httpx`` ``RemoteProtocolError`` or
  ``ReadError`` from its task group, or synthesizes a JSON-RPC ``CONNECTION_CLOSED`` error when an
  SSE stream ends early), the deadline passed, the server answered a JSON-RPC error instead of a
  result, or the result could not be read. The server may have applied the call: reconcile (for
  example with a read-only query by idempotency key) before deciding to send it again.

What cannot be told apart with the SDK: a JSON-RPC error could come from the server before it ran
the tool, from the server after (``INTERNAL_ERROR``), or be synthesized by the SDK's transport
(``PARSE_ERROR``, ``INVALID_REQUEST``, ``CONNECTION_CLOSED`` for unreadable, redirected or
truncated replies), so every JSON-RPC error after sending is "unknown" (``code`` keeps the number);
and a dropped connection looks the same whether the server crashed before or after applying.
Cancelling the awaiting task (``CancelledError``) is not mapped: the caller owns that outcome,
which is unknown once the call was sent.

The SDK's automatic re-sends are avoided on purpose: the call goes through ``ClientSession``, not
``Client.call_tool`` (which re-sends after a ``HEADER_MISMATCH`` and drives input-required rounds),
so one :func:`call_tool` sends one ``tools/call``, and again only when the server answers an
``InputRequiredResult`` that asks nothing but to come back with its request state (at most
``MAX_INPUT_ROUNDS`` times, with the same key: nothing was applied). The tools are listed first on
the same connection, so the SDK has the output schemas it validates results against (otherwise it
lists after the call, and a failure there would hide a result that did arrive).

The idempotency key travels in the request's ``_meta`` under :data:`IDEMPOTENCY_META_KEY`.

Credentials (:class:`McpAccess`: headers such as ``Authorization``, a CA bundle) are read by the
caller as the run's ServiceAccount (:mod:`.credentials`) and go on the HTTP client of this one
connection only; their values never appear in an error's message (which names the URL).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, cast, overload

import httpx2

from durable_agents.core.agent.mcp_content import model_content, schema_mismatch
from durable_agents.core.agent.mcp_tasks import TASK_FORM_2025, TASK_TTL_MS
from durable_agents.core.digest import canonical_digest
from durable_agents.shell.agent.bounded_body import unencoded
from durable_agents.shell.agent.mcp_answers import (
    OUTCOME_MAX_BYTES,
    McpCallUnknown,
    McpError,
    McpInputRequired,
    McpResult,
    McpToolNotListed,
    McpUnreachable,
    bounded_content,
)
from durable_agents.shell.agent.mcp_elicitation import (
    call_result_adapter,
    input_required,
    may_be_task,
    refuse_elicitation,
    retried_while_state_only,
)
from durable_agents.shell.agent.mcp_notices import (
    ProgressSeen,
    ProgressSink,
    ServerLog,
    bound_response,
)
from durable_agents.shell.agent.mcp_sampling import refuse_sampling
from durable_agents.shell.agent.mcp_tool_entries import McpTool
from durable_agents.shell.ground import tracing

# The SDK is imported on first use: building its pydantic models takes seconds of CPU, which every
# operator start (a takeover, a restarted Pod) would pay, MCP servers or not.
if TYPE_CHECKING:
    from mcp import Client
    from mcp.client.session import ElicitationFnT, SamplingFnT
    from mcp_types import CallToolResult, RequestParamsMeta, Tool

    from durable_agents.shell.agent.mcp_task_handles import McpTask

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "OUTCOME_MAX_BYTES",
    "McpAccess",
    "McpCallUnknown",
    "McpError",
    "McpInputRequired",
    "McpResult",
    "McpTool",
    "McpToolNotListed",
    "McpUnreachable",
    "bounded_content",
    "call_tool",
    "list_tools",
    "tool_list_digest",
]

IDEMPOTENCY_META_KEY = "durable-agents.io/idempotency-key"
# A paginator that never ends (or cycles) must not hang the operator.
_MAX_PAGES = 100
# httpx errors raised before a request byte was written: the request was not sent.
_NOT_SENT_ERRORS = (
    httpx2.ConnectError,
    httpx2.ConnectTimeout,
    httpx2.PoolTimeout,
    httpx2.UnsupportedProtocol,
)


@dataclass(frozen=True)
class McpAccess:
    """What a request to one MCP server carries: headers (values from Secrets) and the PEM CA
    bundle that verifies an https server (None: the system's). ``repr`` shows header names only."""

    headers: Mapping[str, str] = field(default_factory=dict)
    ca_pem: str | None = None

    def __repr__(self) -> str:
        return f"McpAccess(headers={sorted(self.headers)}, ca_pem={'set' if self.ca_pem else None})"


NO_ACCESS = McpAccess()
# The SDK's defaults (create_mcp_http_client): 30 s to connect, 300 s to read an SSE stream; the
# caller's deadline bounds the whole operation anyway.
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


def _verify(access: McpAccess) -> ssl.SSLContext | bool:
    if access.ca_pem is None:
        return True
    return ssl.create_default_context(cadata=access.ca_pem)


@dataclass
class _Seen:
    """What a connection observed besides its answers: refusals of its credentials (401/403: the
    SDK reports them only as "an error response", which would not say why), why responses were
    cut (their size bound, an encoding), the server's log notifications; the MCP session, kept
    open when a call is answered with a 2025-11-25 task (``keep_session``: it lives there)."""

    server_log: ServerLog
    refused: list[int] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)
    session: str | None = None
    keep_session: bool = False


@asynccontextmanager
async def _connect(
    url: str, access: McpAccess, seen: _Seen, sampling: SamplingFnT | None = None, *,
    tasks: bool = False, elicitation: ElicitationFnT | None = None,
) -> AsyncIterator[Client]:  # fmt: skip
    """A client of ``url`` sending ``access``, observed into ``seen``. The client declares sampling
    always (:mod:`.mcp_sampling`): ``sampling`` answers, else every request is refused;
    ``tasks``: declaring tasks (the extension, :mod:`.mcp_tasks`; the 2025-11-25 capability,
    the session left open unless ``seen.keep_session`` is not set, :mod:`.mcp_task_sessions`);
    ``elicitation``: declaring elicitation (form and URL) answered by it (a ledger call held open:
    :class:`.HoldOpen`)."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp_types import Implementation

    from durable_agents.shell.agent.mcp_task_handles import tasks_extension
    from durable_agents.shell.agent.mcp_task_sessions import SESSION_HEADER, end_session, tasks_client

    async def note(response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            seen.refused.append(response.status_code)
        bound_response(response, seen.cut)  # before its body is read, whatever transport read it
        seen.session = response.headers.get(SESSION_HEADER) or seen.session

    info = Implementation(name="durable-agents", version="1")
    http = httpx2.AsyncClient(
        headers=unencoded(access.headers),
        timeout=_HTTP_TIMEOUT,
        verify=_verify(access),
        event_hooks={"response": [note]},
    )
    async with http:
        # cache=None: every listing is fetched from the server (a tool list is pinned by digest).
        # log_level: the opt-in to the server's log notifications (2026-07-28), bounded by ServerLog.
        transport = streamable_http_client(url, http_client=http, terminate_on_close=not tasks)
        client = (tasks_client() if tasks else Client)(
            transport,
            cache=None,
            client_info=info,
            logging_callback=seen.server_log,
            log_level="info",
            extensions=[tasks_extension()] if tasks else None,
            sampling_callback=sampling or refuse_sampling,
            elicitation_callback=elicitation,
        )
        try:
            async with client:
                yield client
        finally:
            seen.server_log.close()
            if tasks and seen.session and not seen.keep_session:
                await end_session(http, url, seen.session)


async def _all_tools(client: Client) -> list[Tool]:
    tools: list[Tool] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
        if cursor in seen:
            raise RuntimeError(f"tools/list returned cursor {cursor!r} twice")
        seen.add(cursor)
    raise RuntimeError(f"tools/list did not end within {_MAX_PAGES} pages")


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups: the SDK's task groups wrap what failed."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _describe(exc: BaseException, seen: _Seen | None = None) -> str:
    said = "; ".join(f"{type(leaf).__name__}: {leaf}" for leaf in _leaves(exc))
    if seen is not None and seen.cut:
        return f"{seen.cut[-1]} and was not read; {said}"
    if seen is not None and seen.refused:
        return f"the server refused the request's credentials (HTTP {seen.refused[-1]}); {said}"
    return said


# A timeout parameter (ASYNC109): the deadline is part of the contract, applied inside.
async def list_tools(
    server: str,
    url: str,
    *,
    timeout: float,  # noqa: ASYNC109
    access: McpAccess = NO_ACCESS,
) -> list[McpTool]:
    """All the tools ``url`` lists (every page), sorted by name, as ``server``'s.

    Raises :class:`McpUnreachable` if the server could not be reached or the handshake failed,
    :class:`McpError` for any other failure (a timeout, a JSON-RPC error, an endless listing).
    """
    connected = False
    seen = _Seen(ServerLog(server))
    try:
        async with asyncio.timeout(timeout):
            async with _connect(url, access, seen, elicitation=refuse_elicitation) as client:
                connected = True
                tools = await _all_tools(client)
    except Exception as exc:
        failure = McpUnreachable if not connected else McpError
        raise failure(f"listing the tools of {url} failed: {_describe(exc, seen)}", url=url) from exc
    return sorted((McpTool.from_sdk(server, tool) for tool in tools), key=lambda tool: tool.name)


def tool_list_digest(tools: Sequence[McpTool]) -> str:
    """``sha256:<hex>`` over the canonical JSON of the tools sorted by (server, name): any change
    to a name, description, input schema or hint gives another digest."""
    ordered = sorted(tools, key=lambda tool: (tool.server, tool.name))
    return canonical_digest([asdict(tool) for tool in ordered])


def _result(result: CallToolResult) -> McpResult:
    """The result as the model is given it (:func:`durable_agents.core.agent.mcp_content.model_content`)."""
    parts = [part.model_dump(mode="json", by_alias=True, exclude_none=True) for part in result.content]
    return McpResult(is_error=result.is_error, content=model_content(parts, result.structured_content))


async def _checked(client: Client, tool: str, result: CallToolResult) -> McpResult:
    """``result``, or a tool error telling the model its structured content does not match the
    output schema the tool declared (the SDK's check; a definite answer, not an unknown one)."""
    if not result.is_error:
        try:
            await client.session.validate_tool_result(tool, result)
        except RuntimeError as err:
            return McpResult(is_error=True, content=schema_mismatch(tool, str(err)))
    return _result(result)


def _unknown(url: str, tool: str, exc: BaseException, seen: _Seen) -> McpError:
    """The error for a failure after the request was handed to the transport."""
    from mcp.shared.exceptions import MCPError

    leaves = _leaves(exc)
    if leaves and all(isinstance(leaf, _NOT_SENT_ERRORS) for leaf in leaves):
        # The call's HTTP connection could not be opened: no byte of the request went out.
        return McpUnreachable(f"calling {tool} at {url}: not sent: {_describe(exc)}", url=url)
    codes = [leaf.code for leaf in leaves if isinstance(leaf, MCPError)]
    timed_out = isinstance(exc, TimeoutError) and not seen.cut
    reason = "timed out waiting for the result" if timed_out else _describe(exc, seen)
    return McpCallUnknown(
        f"calling {tool} at {url}: outcome unknown ({reason})",
        url=url,
        tool=tool,
        code=codes[0] if codes else None,
    )


async def _answer(
    client: Client,
    url: str,
    server: str,
    tool: str,
    arguments: dict[str, Any],
    meta: RequestParamsMeta | None,
    on_progress: ProgressSink | None,
    tasks: bool,
    request_state: str | None,
    input_responses: Mapping[str, Any] | None,
    ask_task: bool = False,
) -> McpResult | McpTask | McpError:
    """Send the ``tools/call`` (again while the server only echoes its state) and read its answer:
    a result, a task handle (``tasks``; ``ask_task``: asked for, 2025-11-25), or
    :class:`McpInputRequired` for a server that asks."""
    from mcp_types import CallToolRequest, CallToolRequestParams, InputRequiredResult, TaskMetadata

    from durable_agents.shell.agent.mcp_task_handles import McpTask, raw_answer, task_of
    from durable_agents.shell.agent.mcp_task_sessions import created_task, send_unchecked

    raw_type = raw_answer()  # the answer as sent: a result, an input request or (tasks) a task handle
    adapter = call_result_adapter()  # a result or an input request, told apart by resultType

    async def send(state: str | None, responses: Any = None) -> Any:
        params = CallToolRequestParams(
            name=tool,
            arguments=arguments,
            input_responses=responses,
            request_state=state,
            task=TaskMetadata(ttl=TASK_TTL_MS) if ask_task else None,
            _meta=meta,
        )
        # send_request, not session.call_tool: the SDK's call_tool raises on a result that does
        # not match the output schema, which would lose a definite answer.
        request, progress = CallToolRequest(params=params), ProgressSeen(on_progress)
        if ask_task:  # a CreateTaskResult is no tools/call result to the SDK: checked below
            raw = await send_unchecked(client.session, request, progress)
        else:
            raw = await client.session.send_request(request, raw_type, progress_callback=progress)
        if tasks and raw.get("resultType") == "task":  # a durable handle, not a result
            return task_of(raw)  # no protocol: the extension's (its records as before)
        if ask_task and (created := created_task(raw)) is not None:  # 2025-11-25: a handle too
            return replace(created, protocol=TASK_FORM_2025)
        return adapter.validate_python(raw, by_name=False)

    got = await retried_while_state_only(await send(request_state, input_responses), send)
    if isinstance(got, McpTask):
        return got
    if isinstance(got, InputRequiredResult):
        return McpInputRequired(url, tool, input_required(server or url, tool, got))
    return await _checked(client, tool, got)


def _in_session(
    answer: McpResult | McpTask | McpError | None, seen: _Seen
) -> McpResult | McpTask | McpError | None:
    """A 2025-11-25 task with the session it lives in, the session kept open for its polls."""
    if getattr(answer, "protocol", None) != TASK_FORM_2025:
        return answer
    seen.keep_session = True
    return replace(cast("McpTask", answer), session=seen.session)


@overload
async def call_tool(
    url: str,
    tool: str,
    arguments: dict[str, Any],
    *,
    idempotency_key: str | None,
    timeout: float,  # noqa: ASYNC109
    access: McpAccess = ...,
    server: str = ...,
    on_progress: ProgressSink | None = ...,
    tasks: Literal[False] = ...,
    sampling: SamplingFnT | None = ...,
    input_responses: Mapping[str, Any] | None = ...,
    request_state: str | None = ...,
    elicitation: ElicitationFnT | None = ...,
) -> McpResult: ...


@overload
async def call_tool(
    url: str,
    tool: str,
    arguments: dict[str, Any],
    *,
    idempotency_key: str | None,
    timeout: float,  # noqa: ASYNC109
    access: McpAccess = ...,
    server: str = ...,
    on_progress: ProgressSink | None = ...,
    tasks: bool,
    sampling: SamplingFnT | None = ...,
    input_responses: Mapping[str, Any] | None = ...,
    request_state: str | None = ...,
    elicitation: ElicitationFnT | None = ...,
) -> McpResult | McpTask: ...


async def call_tool(
    url: str,
    tool: str,
    arguments: dict[str, Any],
    *,
    idempotency_key: str | None,
    timeout: float,  # noqa: ASYNC109 (a deadline for the whole operation, applied inside)
    access: McpAccess = NO_ACCESS,
    server: str = "",
    on_progress: ProgressSink | None = None,
    tasks: bool = False,
    sampling: SamplingFnT | None = None,
    input_responses: Mapping[str, Any] | None = None,
    request_state: str | None = None,
    elicitation: ElicitationFnT | None = None,
) -> McpResult | McpTask:
    """Call ``tool`` once with ``arguments``; ``idempotency_key`` goes in the request's ``_meta``.
    ``tasks``: tasks are declared (the extension; 2025-11-25: asked of a task-capable tool), and a
    task handle the server answers with is returned as a :class:`~.mcp_tasks.McpTask` (polled).

    ``timeout`` bounds the whole operation (connect, handshake, listing, call). Returns the
    server's answer, a tool error included (``is_error``; a result that does not match the tool's
    output schema is one). Raises :class:`McpUnreachable` or :class:`McpToolNotListed` when nothing
    was sent, :class:`McpCallUnknown` when the call was sent and its outcome is unknown (see the
    module docstring; a response past its size bound is one). ``server`` names the server in the
    operator's log (its log notifications); ``on_progress`` is given its progress notifications;
    ``sampling`` answers the server's sampling requests (None: refused). A server that asks for
    input first (2026-07-28) raises :class:`McpInputRequired` (nothing applied); the retry passes
    the answers as ``input_responses`` and the echoed ``request_state``, under the same
    idempotency key. ``elicitation``: declared (2025-11-25); a tool that may run as a task gets it
    only when ``tasks`` (its questions come through ``tasks/result``), else a connection without it."""
    from mcp_types import RequestParamsMeta

    from durable_agents.shell.agent.mcp_task_handles import McpTask
    from durable_agents.shell.agent.mcp_task_sessions import asks_task

    # The W3C traceparent of the current span (a dispatch's, a tool call's): the server may join it.
    items: dict[str, Any] = tracing.traceparent()
    if idempotency_key is not None:
        items[IDEMPOTENCY_META_KEY] = idempotency_key
    # RequestParamsMeta is an open TypedDict (PEP 728 extra items), which mypy cannot express.
    meta = cast(RequestParamsMeta, items) if items else None
    sent = False
    seen = _Seen(ServerLog(server or url))
    answer: McpResult | McpTask | McpError | None = None
    try:
        async with asyncio.timeout(timeout):
            args = (url, server, tool, arguments, meta, on_progress, tasks, request_state, input_responses)
            declared = elicitation
            for _ in range(2):
                async with _connect(url, access, seen, sampling, tasks=tasks, elicitation=declared) as client:
                    entry = next((known for known in await _all_tools(client) if known.name == tool), None)
                    if declared is not None and not tasks and may_be_task(entry):
                        declared = None  # its questions go through its task, never a call held open
                        continue
                    if entry is not None:
                        sent = True
                        answer = await _answer(client, *args, asks_task(client, entry, can_hold=tasks))
                    answer = _in_session(answer, seen)
                break
    except Exception as exc:
        if isinstance(answer, McpResult | McpTask):
            # The answer arrived; only closing the connection failed.
            return answer
        if answer is not None:
            raise answer from exc
        if not sent:
            raise McpUnreachable(
                f"calling {tool} at {url}: not sent: {_describe(exc, seen)}", url=url
            ) from exc
        raise _unknown(url, tool, exc, seen) from exc
    if answer is None:
        raise McpToolNotListed(f"{url} does not list a tool named {tool!r}; not sent", url=url)
    if isinstance(answer, McpError):
        raise answer
    return answer
