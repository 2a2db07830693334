"""The client's sampling callback: an MCP server's ``sampling/createMessage`` request, answered by
the run's model when the run's policy grants it (:mod:`durable_agents.core.agent.mcp_sampling`),
refused otherwise with a JSON-RPC error the server is told (the call and the run go on).

The client declares the sampling capability on every connection (so a server offers the tools
that sample), and :func:`refuse_sampling` answers where no grant applies: a listing, a call sent by
the action ledger. A :class:`Sampler` serves one read-only call of a run: each sample is a model
call of the run, made with the run's model endpoint and client, recorded like the run's own (a
``chat {model}`` span with the tokens and ``durable_agents.mcp.server``, the model-call metrics, a
log line with identifiers only: never the server's messages or the model's text).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind

from durable_agents.core.agent.mcp_sampling import (
    LEDGER_CALL,
    SampleUse,
    SamplingAllowance,
    refusal,
    sampled_request,
)
from durable_agents.core.agent.messages_api import ANTHROPIC_MESSAGES
from durable_agents.shell.agent.model_client import ModelCallFailed, ModelClient
from durable_agents.shell.agent.model_endpoint import ModelEndpoint
from durable_agents.shell.ground import metrics, tracing

if TYPE_CHECKING:
    from mcp.client.session import ClientRequestContext
    from mcp_types import CreateMessageRequestParams, CreateMessageResult, ErrorData
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

# The MCP specification's code for a sampling request the client's user rejected.
REFUSED_CODE = -1


def _refused(message: str) -> ErrorData:
    from mcp_types import ErrorData

    return ErrorData(code=REFUSED_CODE, message=f"sampling refused: {message}")


async def refuse_sampling(context: ClientRequestContext, params: CreateMessageRequestParams) -> ErrorData:
    """Where no grant applies (a listing, a call the ledger sends): refused, the server told."""
    return _refused(LEDGER_CALL)


def _texts(params: CreateMessageRequestParams) -> list[tuple[str, str]]:
    """The server's messages as (role, text); ValueError for any part that is not text."""
    out: list[tuple[str, str]] = []
    for message in params.messages:
        texts = []
        for part in message.content_as_list:
            if part.type != "text":
                raise ValueError(f"a sample's message carries {part.type!r} content: only text is sampled")
            texts.append(part.text)
        out.append((message.role, "\n".join(texts)))
    return out


class Sampler:
    """The sampling callback of one read-only call of ``run`` (``namespace/name``)."""

    def __init__(
        self,
        allowance: SamplingAllowance | None,
        *,
        run: str,
        endpoint: ModelEndpoint | None,
        client: ModelClient | None,
        tracer: Tracer | None = None,
    ) -> None:
        self.allowance = allowance
        self.run = run
        self.endpoint = endpoint
        self.client = client
        self.tracer = tracer or tracing.tracer()
        self.used = SampleUse()

    def _refuse(self, why: str) -> ErrorData:
        server = self.allowance.server if self.allowance else "?"
        metrics.MODEL_CALLS.labels("SamplingRefused").inc()
        log.info("%s: MCP server %r sampling refused: %s", self.run, server, why)
        return _refused(why)

    async def __call__(
        self, context: ClientRequestContext, params: CreateMessageRequestParams
    ) -> CreateMessageResult | ErrorData:
        why = refusal(self.allowance, self.used, max_tokens=params.max_tokens)
        if why is not None:
            return self._refuse(why)
        assert self.allowance is not None
        if self.endpoint is None or self.client is None:
            return self._refuse("no model endpoint is resolved for the run")
        try:
            request = sampled_request(
                self.allowance,
                system_prompt=params.system_prompt,
                messages=_texts(params),
                max_tokens=params.max_tokens,
            )
        except ValueError as err:
            return self._refuse(str(err))
        return await self._sample(self.allowance, self.endpoint, self.client, request)

    async def _sample(
        self, allowance: SamplingAllowance, endpoint: ModelEndpoint, client: ModelClient, request: Any
    ) -> CreateMessageResult | ErrorData:
        from mcp_types import CreateMessageResult, TextContent

        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "anthropic" if endpoint.protocol == ANTHROPIC_MESSAGES else "openai",
            "gen_ai.request.model": allowance.model,
            **tracing.server_attributes(endpoint.base_url),
            "durable_agents.run": self.run,
            "durable_agents.mcp.server": allowance.server,
            "durable_agents.mcp.sampling": True,
        }
        with tracing.call_span(self.tracer, f"chat {allowance.model}", SpanKind.CLIENT, attributes) as span:
            try:
                reply = await client.complete(endpoint, request)
            except ModelCallFailed as err:
                tracing.failed(span, err.reason)
                metrics.MODEL_CALLS.labels(err.reason).inc()
                # Sent: the endpoint may have counted it. Counted as a call, no tokens known.
                self.used = self.used.plus(0, 0)
                log.warning("%s: MCP server %r sample failed: %s", self.run, allowance.server, err.reason)
                return _refused(f"the run's model failed ({err.reason})")
            usage = reply.usage
            span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": usage.input_tokens,
                    "gen_ai.usage.output_tokens": usage.output_tokens,
                }
            )
        self.used = self.used.plus(usage.input_tokens, usage.output_tokens)
        metrics.MODEL_CALLS.labels("Answered").inc()
        metrics.MODEL_TOKENS.labels("input").inc(max(0, usage.input_tokens))
        metrics.MODEL_TOKENS.labels("output").inc(max(0, usage.output_tokens))
        log.info(
            "%s: MCP server %r sampled the run's model %s (%d in, %d out tokens)",
            self.run,
            allowance.server,
            reply.model or allowance.model,
            usage.input_tokens,
            usage.output_tokens,
        )
        stop = "maxTokens" if reply.finish_reason in ("length", "max_tokens") else "endTurn"
        return CreateMessageResult(
            role="assistant",
            content=TextContent(type="text", text=reply.content or ""),
            model=reply.model or allowance.model,
            stop_reason=stop,
        )


__all__ = ["REFUSED_CODE", "Sampler", "refuse_sampling"]
