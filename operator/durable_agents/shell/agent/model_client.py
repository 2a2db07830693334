"""The model call: one chat-completions request through the official ``openai`` client (an
endpoint whose protocol is ``anthropic-messages`` is called by :mod:`.messages_client`).

Retries are off in the client: a failed call is a failed attempt of the run, and the run's retry
policy decides when (and whether) to call again, so a model endpoint that times out or fails is a
retry window, never a silent failure and never a hidden loop of paid calls. The client is built
once per endpoint and credential and kept (its connection pool is the expensive part).

The reply is read raw and classified here (:mod:`.model_replies`), not parsed by the SDK: the
SDK hands back an HTML page as a string and lets a JSON content type with another body raise a
``JSONDecodeError``, which used to escape as the operator's internal error. Every failure of the
endpoint is a :class:`ModelCallFailed` that names the endpoint and the kind of reply (never the
key): retried under the run's policy, never an internal-error quarantine.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when the first model call is made: the client costs ~1 s and ~16 MB
    import openai

from durable_agents.core.agent.exchange import ModelReply, ModelRequest
from durable_agents.core.agent.messages_api import ANTHROPIC_MESSAGES
from durable_agents.shell.agent.messages_client import MessagesClient
from durable_agents.shell.agent.model_endpoint import ModelEndpoint
from durable_agents.shell.agent.model_replies import (
    ModelCallFailed,
    reply_kind,
    reply_of,
    sanitized,
    shown_endpoint,
)

log = logging.getLogger(__name__)

NO_KEY = "unused"  # the client insists on a key; a local server without auth ignores it
# What ``with_raw_response.create`` asks of the client: the raw reply (the key as a bearer token is
# asked by ``security``, as ``create`` does).
_RAW = {"X-Stainless-Raw-Response": "true"}


def _failures() -> tuple[tuple[type[openai.OpenAIError], str, bool], ...]:
    """The client's exception classes, most specific first, and what each means for the run."""
    import openai

    return (
        (openai.APITimeoutError, "ModelTimeout", True),
        (openai.APIConnectionError, "ModelUnreachable", True),
        (openai.RateLimitError, "ModelRateLimited", True),
        # A wrong key is fixed in its Secret (re-read within the resolver's TTL): retryable.
        (openai.AuthenticationError, "ModelAuthFailed", True),
        (openai.PermissionDeniedError, "ModelAuthFailed", True),
        (openai.BadRequestError, "ModelRequestRefused", False),
        (openai.UnprocessableEntityError, "ModelRequestRefused", False),
        (openai.NotFoundError, "ModelNotFound", False),
        (openai.APIStatusError, "ModelError", True),
        (openai.APIResponseValidationError, "ModelReplyInvalid", True),
    )


class ModelClient:
    """Model calls for the worker: chat completions, one ``AsyncOpenAI`` per (base URL, key,
    timeout); an endpoint speaking the Messages API goes to :class:`MessagesClient`."""

    def __init__(self) -> None:
        self._clients: dict[ModelEndpoint, openai.AsyncOpenAI] = {}
        self._messages = MessagesClient()

    def _client(self, endpoint: ModelEndpoint) -> openai.AsyncOpenAI:
        import openai

        client = self._clients.get(endpoint)
        if client is None:
            client = openai.AsyncOpenAI(
                base_url=endpoint.base_url,
                api_key=endpoint.api_key or NO_KEY,
                max_retries=0,
                timeout=endpoint.timeout_seconds,
                # A redirect is not followed (the SDK's default would): it could land on a host
                # outside the policy's modelEndpoints; it reaches the run as a failed call.
                http_client=openai.DefaultAsyncHttpxClient(follow_redirects=False),
            )
            self._clients[endpoint] = client
        return client

    async def complete(self, endpoint: ModelEndpoint, request: ModelRequest) -> ModelReply:
        """One model call; :class:`ModelCallFailed` when it brought no usable answer."""
        if endpoint.protocol == ANTHROPIC_MESSAGES:
            return await self._messages.complete(endpoint, request)
        import openai
        from openai._base_client import make_request_options
        from openai.types.chat import ChatCompletion

        sent = request.body()
        try:  # the SDK wraps every transport error (a URL it refuses too) in APIConnectionError
            # ``chat.completions.with_raw_response.create(**sent)`` without its parameter transform:
            # the body is plain JSON already, and the transform's walk of every message was a
            # third of the SDK's cost per call in the model row's profile (issue 38).
            options = make_request_options(extra_headers=_RAW, security={"bearer_auth": True})
            raw: Any = await self._client(endpoint).post(
                "/chat/completions", body=sent, cast_to=ChatCompletion, options=options
            )
        except openai.OpenAIError as err:
            raise failure_of(err, endpoint) from None
        except ValueError as err:  # a header it cannot encode (a key the resolver would refuse now)
            message = (
                f"the request to {shown_endpoint(endpoint.base_url)} cannot be sent: {type(err).__name__}"
            )
            raise ModelCallFailed("ModelEndpointInvalid", message, True) from None
        response = raw.http_response
        try:  # read already (not streamed); should it be cut now, that is the endpoint's failure too
            body = await response.aread()
        except Exception as err:  # the transport's own classes are the SDK's internals
            message = f"{type(err).__name__} while reading the reply of {shown_endpoint(endpoint.base_url)}"
            raise ModelCallFailed("ModelUnreachable", message, True) from None
        return reply_of(endpoint.base_url, response.status_code, response.headers, body, endpoint.api_key)

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        await self._messages.close()


def failure_of(err: openai.OpenAIError, endpoint: ModelEndpoint) -> ModelCallFailed:
    """The run's reason for the client's exception, with the endpoint and the kind of reply named
    (a status error's body described, bounded and sanitized; never the key)."""
    import openai

    reason, retryable = "ModelError", True
    for cls, known, may_retry in _failures():
        if isinstance(err, cls):
            reason, retryable = known, may_retry
            break
    where = shown_endpoint(endpoint.base_url)
    if isinstance(err, openai.APIStatusError):
        response = err.response
        kind = reply_kind(response.headers, response.content, endpoint.api_key)
        message = f"{type(err).__name__} (HTTP {response.status_code}) from {where}: {kind}"
    elif isinstance(err, openai.APIConnectionError):  # a timeout is one too: say which limit
        text = sanitized(str(err), endpoint.api_key)
        message = f"{type(err).__name__}: {text} ({where}, timeout {endpoint.timeout_seconds:g}s)"
    else:
        message = f"{type(err).__name__} from {where}: {sanitized(str(err), endpoint.api_key)}"
    return ModelCallFailed(reason, message, retryable)


__all__ = ["ModelCallFailed", "ModelClient", "ModelEndpoint", "failure_of"]
