"""Read-only MCP tool calls of the model planner: made by the worker between commits, like a read.

A crash before the next commit makes the call again (read-only: harmless, and the policy decided
it is). The answer, or why there is none, goes back to the core as a
:class:`~durable_agents.core.engine.ReadResult` whose ``content`` the model is told (sealed into
the run's facts). No idempotency key: a read-only call has no effect to deduplicate.

Each call is an ``execute_tool {tool}`` span (GenAI semantic conventions, see :mod:`.tracing`):
which tool on which server, and how it ended, never its arguments, result or credentials.

The server's credentials are read as the run's ServiceAccount before every call (a rotated Secret
is used by the next call); one that cannot be read is the call's error, and nothing is sent.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from opentelemetry.trace import SpanKind

from durable_agents.api.v1alpha1 import McpServer
from durable_agents.core.destinations import destination_refusal, of_policy
from durable_agents.core.durations import parse_duration
from durable_agents.core.engine import NeedToolCall, ReadResult, RunSnapshot, Settings
from durable_agents.shell.agent.credentials import Unresolvable, mcp_access
from durable_agents.shell.agent.mcp_sampling import Sampler
from durable_agents.shell.agent.mcp_tools import NO_ACCESS, McpAccess, McpError, bounded_content, call_tool
from durable_agents.shell.ground import metrics, tracing
from durable_agents.shell.ground.kube import Kube

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from durable_agents.shell.agent.model_turns import ModelTurns

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
DESTINATION_NOT_ALLOWED = "DestinationNotAllowed"
CREDENTIALS_UNREADABLE = "McpCredentialsUnreadable"


def refused_destination(run: RunSnapshot, need: NeedToolCall, settings: Settings | None) -> ReadResult | None:
    """The call's error result when its server's URL is outside the run's policy's allowlist now
    (checked before every call: a policy may have narrowed since the call was proposed), else None."""
    if settings is None or settings.policy is None:
        return None
    source = f"AgentPolicy {run.namespace}/{settings.policy_name}"
    field = f"the MCP server {need.step.server!r} (spec.agent.mcpServers[].url)"
    problem = destination_refusal(
        [of_policy(source, settings.policy)], field, "mcpServers", "", need.step.url
    )
    if problem is None:
        return None
    metrics.MCP_CALLS.labels(DESTINATION_NOT_ALLOWED).inc()
    log.warning("%s/%s MCP read %s not sent: %s", run.namespace, run.name, need.step.tool, problem)
    return ReadResult(need.step_index, error_reason=DESTINATION_NOT_ALLOWED, error_message=problem[:1024])


def _configured(run: RunSnapshot, server: str) -> McpServer | None:
    for configured in run.spec.agent.mcp_servers if run.spec.agent else []:
        if configured.name == server:
            return configured
    return None


async def server_access(
    kube: Kube | None, namespace: str, service_account: str, server: McpServer | None
) -> McpAccess:
    """The server's credentials, read now as the run's ServiceAccount (none configured: none)."""
    if kube is None or server is None:
        return NO_ACCESS
    return await mcp_access(kube, namespace, service_account, server)


def _counted(result: ReadResult, sampler: Sampler) -> ReadResult:
    """``result`` with the model calls the server's samples made (counted at the read's commit)."""
    used = sampler.used
    return replace(
        result,
        sampled_calls=used.calls,
        sampled_input_tokens=used.input_tokens,
        sampled_output_tokens=used.output_tokens,
    )


async def call_read_tool(
    run: RunSnapshot,
    need: NeedToolCall,
    *,
    kube: Kube | None = None,
    tracer: Tracer | None = None,
    models: ModelTurns | None = None,
) -> ReadResult:
    """The read-only call's result; its server may sample the run's model (``models``) as far as
    ``need.sampling`` allows, the samples counted in the result."""
    granted = models if need.sampling is not None else None  # the endpoint resolved only if used
    sampler = Sampler(
        need.sampling,
        run=f"{run.namespace}/{run.name}",
        endpoint=granted.endpoints(run) if granted is not None else None,
        client=granted.client if granted is not None else None,
        tracer=tracer,
    )
    return _counted(await _call_read_tool(run, need, sampler, kube=kube, tracer=tracer), sampler)


async def _call_read_tool(
    run: RunSnapshot, need: NeedToolCall, sampler: Sampler, *, kube: Kube | None, tracer: Tracer | None
) -> ReadResult:
    step = need.step
    configured = _configured(run, step.server)
    timeout = parse_duration(configured.timeout).total_seconds() if configured else DEFAULT_TIMEOUT
    try:
        access = await server_access(kube, run.namespace, run.spec.service_account_name, configured)
    except Unresolvable as err:
        message = f"MCP server {step.server!r}: {err}; not sent"
        metrics.MCP_CALLS.labels(CREDENTIALS_UNREADABLE).inc()
        log.warning("%s/%s MCP read %s not sent: %s", run.namespace, run.name, step.tool, message)
        return ReadResult(need.step_index, error_reason=CREDENTIALS_UNREADABLE, error_message=message[:1024])
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": step.tool,
        "gen_ai.tool.type": "function",
        **tracing.server_attributes(step.url),
        "durable_agents.mcp.server": step.server,
        "durable_agents.run": f"{run.namespace}/{run.name}",
        "durable_agents.step": need.step_index,
    }
    span_name = f"execute_tool {step.tool}"
    with tracing.call_span(tracer or tracing.tracer(), span_name, SpanKind.INTERNAL, attributes) as span:
        try:
            result = await call_tool(
                step.url,
                step.tool,
                step.arguments,
                idempotency_key=None,
                timeout=timeout,
                access=access,
                server=step.server,
                sampling=sampler,
            )
        except McpError as err:
            tracing.failed(span, type(err).__name__)
            metrics.MCP_CALLS.labels(type(err).__name__).inc()
            log.warning(
                "%s/%s MCP read %s/%s failed: %s", run.namespace, run.name, step.server, step.tool, err
            )
            return ReadResult(need.step_index, error_reason=type(err).__name__, error_message=str(err)[:1024])
        if result.is_error:  # a definite answer, told to the model; an error of the tool all the same
            tracing.failed(span, "ToolError")
    metrics.MCP_CALLS.labels("ToolError" if result.is_error else "Answered").inc()
    content = {"isError": result.is_error, "content": bounded_content(result.content)}
    return ReadResult(need.step_index, content=content)
