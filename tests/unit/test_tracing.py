"""Traces of the model planner's calls (shell/ground/tracing.py) against the reference servers (loopback):
one ``chat {model}`` span per model call and one ``execute_tool {tool}`` span per read-only MCP
tool call, attributed per the GenAI semantic conventions, and never carrying what was said (the
prompt, the objective, the arguments or the result are sealed data).

Each test gets its own SDK provider with an in-memory exporter, passed in as the tracer: the
process's global provider is never touched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import rfc8785
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, Tracer
from tests.unit.builders import new_run, snap

from durable_agents.core.agent.exchange import ModelRequest
from durable_agents.core.engine import NeedModelTurn, NeedToolCall, RunSnapshot
from durable_agents.core.planner import ReadTool
from durable_agents.shell.agent.model_client import ModelEndpoint
from durable_agents.shell.agent.model_turns import ModelTurns
from durable_agents.shell.agent.tool_calls import call_read_tool
from durable_agents.shell.ground import tracing
from durable_agents_testkit.mcpserver import McpServerThread
from durable_agents_testkit.modelserver import ModelServerThread

pytestmark = pytest.mark.unit

MODEL = "reference-model"
SYSTEM_PROMPT = "You operate the printer fleet of the third floor."
OBJECTIVE = "Close the toner ticket of the east wing printer."
TICKET = "T-101"
SCRIPT: dict[str, Any] = {
    "model": MODEL,
    "rules": [
        {
            "content": "The ticket says which printer.",
            "toolCalls": [{"name": "lookup_ticket", "arguments": {"id": TICKET}}],
        }
    ],
}
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup_ticket",
        "description": "look a ticket up",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
    },
}
REQUEST = ModelRequest(
    model=MODEL,
    messages=({"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": OBJECTIVE}),
    tools=(TOOL,),
)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(exporter: InMemorySpanExporter) -> Iterator[Tracer]:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test")
    provider.shutdown()


@pytest.fixture
def model_server() -> Iterator[ModelServerThread]:
    with ModelServerThread(SCRIPT) as running:
        yield running


@pytest.fixture
def mcp_server() -> Iterator[McpServerThread]:
    with McpServerThread() as running:
        yield running


def the_run(**spec: Any) -> RunSnapshot:
    return snap(new_run(objective=OBJECTIVE, **spec))


def only_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    [span] = exporter.get_finished_spans()
    return span


def assert_nothing_said(span: ReadableSpan, *texts: str) -> None:
    """No attribute, event or status of the span quotes what was said."""
    assert not [name for name in span.attributes or {} if name.startswith(("gen_ai.prompt", "gen_ai.input"))]
    assert not span.events
    shown = json.dumps(
        [dict(span.attributes or {}), span.status.description, span.name], default=str, ensure_ascii=False
    )
    for text in texts:
        assert text not in shown


async def answer(model_server: ModelServerThread, tracer: Tracer, run: RunSnapshot) -> Any:
    endpoint = ModelEndpoint(base_url=model_server.base_url, timeout_seconds=5.0)
    turns = ModelTurns(lambda _run: endpoint, tracer=tracer)
    try:
        return await turns.answer(run, NeedModelTurn(REQUEST, step_index=3))
    finally:
        await turns.client.close()


async def test_a_model_call_is_a_chat_span_with_the_servers_usage(
    model_server: ModelServerThread, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    answered = await answer(model_server, tracer, the_run())

    assert answered.reply is not None
    span = only_span(exporter)
    assert span.name == f"chat {MODEL}"
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    [sent] = model_server.calls()["requests"]  # type: ignore[misc]
    prompt_tokens = len(rfc8785.dumps(sent)) // 4  # how the reference server counts
    attributes = dict(span.attributes or {})
    assert attributes.pop("server.port") == int(model_server.base_url.rsplit(":", 1)[1].split("/")[0])
    assert attributes.pop("gen_ai.response.finish_reasons") == ("tool_calls",)
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": MODEL,
        "gen_ai.response.model": MODEL,
        "gen_ai.usage.input_tokens": prompt_tokens,
        "gen_ai.usage.output_tokens": answered.reply.usage.output_tokens,
        "server.address": "127.0.0.1",
        "durable_agents.run": "team-a/run-1",
        "durable_agents.step": 3,
    }
    assert prompt_tokens == answered.reply.usage.input_tokens > 0
    assert answered.reply.usage.output_tokens > 0
    assert_nothing_said(span, SYSTEM_PROMPT, OBJECTIVE, answered.reply.content, TICKET)


async def test_a_messages_api_call_is_a_chat_span_of_the_anthropic_provider(
    model_server: ModelServerThread, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    protocol = "anthropic-messages"
    endpoint = ModelEndpoint(
        base_url=model_server.base_url_for(protocol), timeout_seconds=5.0, protocol=protocol
    )
    turns = ModelTurns(lambda _run: endpoint, tracer=tracer)
    try:
        answered = await turns.answer(the_run(), NeedModelTurn(REQUEST, step_index=3))
    finally:
        await turns.client.close()

    assert answered.reply is not None
    assert model_server.calls()["byProtocol"] == {protocol: 1}
    span = only_span(exporter)
    assert span.name == f"chat {MODEL}"
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.provider.name"] == "anthropic"
    assert attributes["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert attributes["gen_ai.usage.input_tokens"] == answered.reply.usage.input_tokens > 0
    assert_nothing_said(span, SYSTEM_PROMPT, OBJECTIVE, answered.reply.content, TICKET)


async def test_a_failed_model_call_is_an_error_span_named_by_its_reason(
    model_server: ModelServerThread, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    model_server.inject("error")

    answered = await answer(model_server, tracer, the_run())

    assert answered.failure_reason == "ModelError"
    span = only_span(exporter)
    assert span.name == f"chat {MODEL}"
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["error.type"] == "ModelError"
    assert "gen_ai.usage.input_tokens" not in span.attributes
    assert_nothing_said(span, SYSTEM_PROMPT, OBJECTIVE, answered.failure_message)


async def test_no_endpoint_makes_no_call_and_no_span(tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    turns = ModelTurns(tracer=tracer)
    answered = await turns.answer(the_run(), NeedModelTurn(REQUEST, step_index=0))
    assert answered.failure_reason == "ModelEndpointMissing"
    assert exporter.get_finished_spans() == ()


def lookup(server: McpServerThread, ticket: str) -> NeedToolCall:
    step = ReadTool(
        name="look", server="tickets", url=server.url, tool="lookup_ticket", arguments={"id": ticket}
    )
    return NeedToolCall(step_index=2, step=step)


def tool_run(server: McpServerThread) -> RunSnapshot:
    return the_run(agent={"mcpServers": [{"name": "tickets", "url": server.url, "timeout": "10s"}]})


async def test_a_read_tool_call_is_an_execute_tool_span(
    mcp_server: McpServerThread, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    read = await call_read_tool(tool_run(mcp_server), lookup(mcp_server, TICKET), tracer=tracer)

    assert read.content is not None
    assert read.content["isError"] is False
    span = only_span(exporter)
    assert span.name == "execute_tool lookup_ticket"
    assert span.kind is SpanKind.INTERNAL
    assert span.status.status_code is StatusCode.UNSET
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup_ticket",
        "gen_ai.tool.type": "function",
        "server.address": "127.0.0.1",
        "server.port": mcp_server.port,
        "durable_agents.mcp.server": "tickets",
        "durable_agents.run": "team-a/run-1",
        "durable_agents.step": 2,
    }
    assert_nothing_said(span, OBJECTIVE, TICKET, "VPN drops hourly")


async def test_a_failed_tool_call_is_an_error_span(
    mcp_server: McpServerThread, tracer: Tracer, exporter: InMemorySpanExporter
) -> None:
    answered = await call_read_tool(tool_run(mcp_server), lookup(mcp_server, "T-999"), tracer=tracer)
    assert answered.content is not None
    assert answered.content["isError"] is True  # the tool's own error: told to the model
    tool_error = only_span(exporter)
    assert tool_error.status.status_code is StatusCode.ERROR
    assert (tool_error.attributes or {})["error.type"] == "ToolError"
    assert_nothing_said(tool_error, "T-999")

    exporter.clear()
    run, need = tool_run(mcp_server), lookup(mcp_server, TICKET)
    mcp_server.stop()  # nobody answers at its address any more
    answered = await call_read_tool(run, need, tracer=tracer)
    assert answered.error_reason == "McpUnreachable"
    span = only_span(exporter)
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "McpUnreachable"


def test_tracing_is_off_unless_configured() -> None:
    assert tracing.configure({}) is None
    assert tracing.configure({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert tracing._exporter_names({"OTEL_TRACES_EXPORTER": "console"}) == ["console"]
    assert tracing._exporter_names({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) == ["otlp"]
    assert tracing.server_attributes("https://models.example/v1") == {
        "server.address": "models.example",
        "server.port": 443,
    }
