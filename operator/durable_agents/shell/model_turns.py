"""The shell's half of a model turn: send the core's request to the run's endpoint, hand back the
answer (or why there is none) as the core's :class:`ModelAnswer`."""

from __future__ import annotations

import logging
from collections.abc import Callable

from durable_agents.core.engine import ModelAnswer, NeedModelTurn, RunSnapshot
from durable_agents.shell import metrics
from durable_agents.shell.model_client import ModelCallFailed, ModelClient, ModelEndpoint

log = logging.getLogger(__name__)

EndpointResolver = Callable[[RunSnapshot], ModelEndpoint | None]


def no_endpoint(run: RunSnapshot) -> ModelEndpoint | None:
    """The default: no run has a model endpoint (the run then fails with ModelEndpointMissing)."""
    return None


class ModelTurns:
    def __init__(self, endpoints: EndpointResolver = no_endpoint, client: ModelClient | None = None) -> None:
        self.endpoints = endpoints
        self.client = client or ModelClient()

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
        try:
            reply = await self.client.complete(endpoint, need.request)
        except ModelCallFailed as err:
            metrics.MODEL_CALLS.labels(err.reason).inc()
            log.warning("%s/%s model call failed: %s", run.namespace, run.name, err)
            return ModelAnswer(
                digest, failure_reason=err.reason, failure_message=err.message, retryable=err.retryable
            )
        metrics.MODEL_CALLS.labels("Answered").inc()
        return ModelAnswer(digest, reply=reply)
