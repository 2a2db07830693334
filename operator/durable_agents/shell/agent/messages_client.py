"""The model call for an endpoint speaking the Anthropic Messages API, through the ``anthropic``
client; the twin of :mod:`.model_client` (chat completions), with the same rules:

- retries off in the client (a failed call is a failed attempt of the run, retried under its
  policy's windows), the endpoint's timeout bounding each call, redirects not followed;
- the request is the core's, translated by :mod:`durable_agents.core.agent.messages_api` (its
  digest, the model and the prompt and tool-set digests are recorded as for chat completions);
- the reply is read raw and classified by :mod:`.model_replies`: every failure of the endpoint
  (a body that is not JSON, 401, 500, 529 overloaded, a timeout) is a :class:`ModelCallFailed`
  naming the endpoint and the kind of reply, never the key, never an internal error;
- a reply's body, an error's too, is read up to :data:`.model_replies.REPLY_MAX_BYTES`, never
  further (``ModelReplyTooLarge``): the client reads a body whole before it hands it over, so the
  bound sits under it (:mod:`.bounded_body`, from its HTTP client's response hook). No encoding is asked
  for (``Accept-Encoding: identity``) and a reply encoded anyway is refused unread
  (``ModelReplyInvalid``): decoded, a few KiB on the wire can be gigabytes.

The key from the run's Secret goes as ``x-api-key``, the header the Messages API reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import httpx2

if TYPE_CHECKING:  # imported at the first call of such an endpoint, as the openai client is
    import anthropic

from durable_agents.core.agent.exchange import ModelReply, ModelRequest
from durable_agents.core.agent.messages_api import ANTHROPIC_MESSAGES, MAX_TOKENS, messages_body
from durable_agents.shell.agent.bounded_body import bound_body, encoding_of, unencoded
from durable_agents.shell.agent.model_endpoint import ModelEndpoint
from durable_agents.shell.agent.model_replies import (
    REPLY_MAX_BYTES,
    ModelCallFailed,
    reply_kind,
    reply_of,
    reply_too_large,
    sanitized,
    shown_endpoint,
)

NO_KEY = "unused"  # the client insists on a key; a local server without auth ignores it


def bounding_hook(where: str) -> Callable[[httpx2.Response], Awaitable[None]]:
    """The HTTP client's response hook: it runs before the body is read."""

    async def bound(response: httpx2.Response) -> None:
        coding = encoding_of(response)
        if coding is not None:
            message = (
                f"HTTP {response.status_code} from {where}: the reply is encoded"
                f" ({sanitized(coding, None)}) though none was asked for: not decoded, its size"
                " could not be bounded"
            )
            raise ModelCallFailed("ModelReplyInvalid", message, True)
        status = response.status_code
        bound_body(response, REPLY_MAX_BYTES, lambda: reply_too_large(status, where))

    return bound


def _failures() -> tuple[tuple[type[anthropic.AnthropicError], str, bool], ...]:
    """The client's exception classes, most specific first, and what each means for the run."""
    import anthropic

    return (
        (anthropic.APITimeoutError, "ModelTimeout", True),
        (anthropic.APIConnectionError, "ModelUnreachable", True),
        (anthropic.RateLimitError, "ModelRateLimited", True),
        (anthropic.OverloadedError, "ModelOverloaded", True),  # 529: the API's own "busy"
        (anthropic.AuthenticationError, "ModelAuthFailed", True),  # fixed in the Secret: retryable
        (anthropic.PermissionDeniedError, "ModelAuthFailed", True),
        (anthropic.BadRequestError, "ModelRequestRefused", False),
        (anthropic.UnprocessableEntityError, "ModelRequestRefused", False),
        (anthropic.NotFoundError, "ModelNotFound", False),
        (anthropic.APIStatusError, "ModelError", True),
        (anthropic.APIResponseValidationError, "ModelReplyInvalid", True),
    )


class MessagesClient:
    """Messages API calls for the worker; one ``AsyncAnthropic`` per (base URL, key, timeout)."""

    def __init__(self) -> None:
        self._clients: dict[ModelEndpoint, anthropic.AsyncAnthropic] = {}

    def _client(self, endpoint: ModelEndpoint) -> anthropic.AsyncAnthropic:
        import anthropic

        client = self._clients.get(endpoint)
        if client is None:
            client = anthropic.AsyncAnthropic(
                base_url=endpoint.base_url,
                api_key=endpoint.api_key or NO_KEY,
                max_retries=0,
                timeout=endpoint.timeout_seconds,
                default_headers=unencoded({}),  # what is counted is what is kept
                # A redirect could land outside the policy's modelEndpoints: not followed.
                http_client=anthropic.DefaultAsyncHttpxClient(
                    follow_redirects=False,
                    event_hooks={"response": [bounding_hook(shown_endpoint(endpoint.base_url))]},
                ),
            )
            self._clients[endpoint] = client
        return client

    async def complete(self, endpoint: ModelEndpoint, request: ModelRequest) -> ModelReply:
        """One model call; :class:`ModelCallFailed` when it brought no usable answer."""
        import anthropic

        sent = messages_body(request, request.max_tokens or MAX_TOKENS)
        try:
            raw = await self._client(endpoint).messages.with_raw_response.create(**sent)
        except anthropic.AnthropicError as err:
            if isinstance(err.__cause__, ModelCallFailed):  # the body's bound, under the client
                raise err.__cause__ from None
            raise failure_of(err, endpoint) from None
        except ValueError as err:  # a header it cannot encode
            message = (
                f"the request to {shown_endpoint(endpoint.base_url)} cannot be sent: {type(err).__name__}"
            )
            raise ModelCallFailed("ModelEndpointInvalid", message, True) from None
        response = raw.http_response
        try:
            body = await response.aread()
        except Exception as err:  # the transport's own classes are the SDK's internals
            message = f"{type(err).__name__} while reading the reply of {shown_endpoint(endpoint.base_url)}"
            raise ModelCallFailed("ModelUnreachable", message, True) from None
        return reply_of(
            endpoint.base_url,
            response.status_code,
            response.headers,
            body,
            endpoint.api_key,
            ANTHROPIC_MESSAGES,
        )

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


def failure_of(err: anthropic.AnthropicError, endpoint: ModelEndpoint) -> ModelCallFailed:
    """The run's reason for the client's exception, naming the endpoint and the kind of reply."""
    import anthropic

    reason, retryable = "ModelError", True
    for cls, known, may_retry in _failures():
        if isinstance(err, cls):
            reason, retryable = known, may_retry
            break
    where = shown_endpoint(endpoint.base_url)
    if isinstance(err, anthropic.APIStatusError):
        response = err.response
        kind = reply_kind(response.headers, response.content, endpoint.api_key)
        message = f"{type(err).__name__} (HTTP {response.status_code}) from {where}: {kind}"
    elif isinstance(err, anthropic.APIConnectionError):  # a timeout is one too: say which limit
        text = sanitized(str(err), endpoint.api_key)
        message = f"{type(err).__name__}: {text} ({where}, timeout {endpoint.timeout_seconds:g}s)"
    else:
        message = f"{type(err).__name__} from {where}: {sanitized(str(err), endpoint.api_key)}"
    return ModelCallFailed(reason, message, retryable)
