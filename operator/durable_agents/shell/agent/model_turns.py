"""The shell's half of a model turn: send the core's request to the run's endpoint, hand back the
answer (or why there is none) as the core's :class:`ModelAnswer`.

Each call is a ``chat {model}`` span (GenAI semantic conventions, see :mod:`.tracing`): the model,
the tokens and the finish reason, never the messages."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from opentelemetry.trace import SpanKind

from durable_agents.core.agent.messages_api import ANTHROPIC_MESSAGES
from durable_agents.core.engine import ModelAnswer, NeedModelTurn, RunSnapshot
from durable_agents.shell.agent.model_client import ModelCallFailed, ModelClient, ModelEndpoint
from durable_agents.shell.ground import metrics, tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

EndpointResolver = Callable[[RunSnapshot], ModelEndpoint | None]


def no_endpoint(run: RunSnapshot) -> ModelEndpoint | None:
    """The default: no run has a model endpoint (the run then fails with ModelEndpointMissing)."""
    return None


class ModelTurns:
    def __init__(
        self,
        endpoints: EndpointResolver = no_endpoint,
        client: ModelClient | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.client = client or ModelClient()
        self.tracer = tracer or tracing.tracer()

    async def answer(self, run: RunSnapshot, need: NeedModelTurn) -> ModelAnswer:
        digest = need.request.digest()
        endpoint = self.endpoints(run)
        if endpoint is None:
            return ModelAnswer(
                digest,
                failure_reason="ModelEndpointMissing",
                failure_message=f"no model endpoint is resolved for {run.namespace}/{run.name}",
                retryable=False,
            )
        model = need.request.model
        attributes = {
            "gen_ai.operation.name": "chat",
            # an OpenAI-compatible chat-completions API, or the Anthropic Messages API
            "gen_ai.provider.name": "anthropic" if endpoint.protocol == ANTHROPIC_MESSAGES else "openai",
            "gen_ai.request.model": model,
            **tracing.server_attributes(endpoint.base_url),
            "durable_agents.run": f"{run.namespace}/{run.name}",
            "durable_agents.step": need.step_index,
        }
        with tracing.call_span(self.tracer, f"chat {model}", SpanKind.CLIENT, attributes) as span:
            try:
                reply = await self.client.complete(endpoint, need.request)
            except ModelCallFailed as err:
                tracing.failed(span, err.reason)
                metrics.MODEL_CALLS.labels(err.reason).inc()
                log.warning("%s/%s model call failed: %s", run.namespace, run.name, err)
                return ModelAnswer(
                    digest, failure_reason=err.reason, failure_message=err.message, retryable=err.retryable
                )
            span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": reply.usage.input_tokens,
                    "gen_ai.usage.output_tokens": reply.usage.output_tokens,
                }
            )
            if reply.model:
                span.set_attribute("gen_ai.response.model", reply.model)
            if reply.finish_reason:
                span.set_attribute("gen_ai.response.finish_reasons", (reply.finish_reason,))
        metrics.MODEL_CALLS.labels("Answered").inc()
        metrics.MODEL_TOKENS.labels("input").inc(max(0, reply.usage.input_tokens))
        metrics.MODEL_TOKENS.labels("output").inc(max(0, reply.usage.output_tokens))
        return ModelAnswer(digest, reply=reply)
