"""The model call: one chat-completions request, ``POST {baseUrl}/chat/completions``, sent with
aiohttp (an endpoint whose protocol is ``anthropic-messages`` is called by :mod:`.messages_client`).

The request is the core's plain JSON body and the reply is read raw and classified here
(:mod:`.model_replies`), so of the ``openai`` client only its HTTP path was left, and that path
was a fifth of the operator's CPU in the model row's profile (about 1 ms of CPU a call against
0.1 ms through aiohttp, issue 38). What the client did for this call is kept:

- no retries: a failed call is a failed attempt of the run, and the run's retry policy decides
  when (and whether) to call again; never a hidden loop of paid calls;
- redirects are not followed: one could land on a host outside the policy's ``modelEndpoints``;
- the key goes as ``Authorization: Bearer``; a key no header can carry is refused before sending;
- TLS trusts what it trusted (``httpx2.create_ssl_context``: ``SSL_CERT_FILE``/``SSL_CERT_DIR``,
  else certifi's bundle), and ``HTTPS_PROXY``/``NO_PROXY`` are honoured;
- a reply's body is read up to :data:`REPLY_MAX_BYTES`, never further (``ModelReplyTooLarge``);
- a reply with a status that is not 2xx is named by the same classes the client used
  (``AuthenticationError (HTTP 401)``), so the runs' reasons and messages read as before.

Every failure of the endpoint is a :class:`ModelCallFailed` that names the endpoint and the kind of
reply (never the key): retried under the run's policy, never an internal-error quarantine. The
endpoint's timeout bounds the whole call. One session (its connection pool) is kept per endpoint.
"""

from __future__ import annotations

import logging
import ssl
from typing import Final

import aiohttp

from durable_agents.core.agent.exchange import ModelReply, ModelRequest
from durable_agents.core.agent.messages_api import ANTHROPIC_MESSAGES
from durable_agents.shell.agent.messages_client import MessagesClient
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
from durable_agents.shell.ground import fast_json

log = logging.getLogger(__name__)

CONNECTIONS_PER_ENDPOINT: Final = 100
"""Connections kept open to one endpoint (the ``openai`` client kept 100 alive)."""

# A reply's status that is not 2xx: the name the ``openai`` client gave it, the run's reason, and
# whether the run's retry policy may try again (a refused request will not heal; a wrong key is
# fixed in its Secret, read again within the resolver's TTL).
_STATUS: Final[dict[int, tuple[str, str, bool]]] = {
    400: ("BadRequestError", "ModelRequestRefused", False),
    401: ("AuthenticationError", "ModelAuthFailed", True),
    403: ("PermissionDeniedError", "ModelAuthFailed", True),
    404: ("NotFoundError", "ModelNotFound", False),
    409: ("ConflictError", "ModelError", True),
    422: ("UnprocessableEntityError", "ModelRequestRefused", False),
    429: ("RateLimitError", "ModelRateLimited", True),
}


def status_failure(status: int) -> tuple[str, str, bool]:
    """(name, reason, retryable) of a reply whose status is not 2xx."""
    if status in _STATUS:
        return _STATUS[status]
    if status >= 500:
        return "InternalServerError", "ModelError", True
    return "APIStatusError", "ModelError", True  # a 3xx not followed, another 4xx


def _trusted() -> ssl.SSLContext:
    import httpx2  # the trust the ``openai`` client's transport had, from the same function

    return httpx2.create_ssl_context()


class ModelClient:
    """Model calls for the worker: chat completions, one session per (base URL, key, timeout);
    an endpoint speaking the Messages API goes to :class:`MessagesClient`."""

    def __init__(self) -> None:
        self._sessions: dict[ModelEndpoint, aiohttp.ClientSession] = {}
        self._messages = MessagesClient()
        self._tls: ssl.SSLContext | None = None

    def _session(self, endpoint: ModelEndpoint) -> aiohttp.ClientSession:
        session = self._sessions.get(endpoint)
        if session is None or session.closed:
            if self._tls is None:
                self._tls = _trusted()
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=CONNECTIONS_PER_ENDPOINT, ssl=self._tls),
                timeout=aiohttp.ClientTimeout(total=endpoint.timeout_seconds),
                trust_env=True,  # HTTPS_PROXY, NO_PROXY (the chart's env documents them)
            )
            self._sessions[endpoint] = session
        return session

    async def complete(self, endpoint: ModelEndpoint, request: ModelRequest) -> ModelReply:
        """One model call; :class:`ModelCallFailed` when it brought no usable answer."""
        if endpoint.protocol == ANTHROPIC_MESSAGES:
            return await self._messages.complete(endpoint, request)
        where = shown_endpoint(endpoint.base_url)
        try:  # a key no header can carry (the resolver refuses such a Secret now): never sent
            auth = f"Bearer {endpoint.api_key}".encode("ascii").decode() if endpoint.api_key else None
        except UnicodeEncodeError as err:
            message = f"the request to {where} cannot be sent: {type(err).__name__}"
            raise ModelCallFailed("ModelEndpointInvalid", message, True) from None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth is not None:
            headers["Authorization"] = auth
        url = endpoint.base_url.rstrip("/") + "/chat/completions"
        body = fast_json.packed(request.body())
        try:
            async with self._session(endpoint).post(
                url, data=body, headers=headers, allow_redirects=False
            ) as response:
                status, reply_headers = response.status, response.headers
                content = await _bounded(response, where)
        except TimeoutError:  # aiohttp's own timeouts are TimeoutErrors too
            raise ModelCallFailed(
                "ModelTimeout", _lost("APITimeoutError", "Request timed out.", endpoint), True
            ) from None
        except (aiohttp.InvalidURL, ValueError) as err:  # refused before anything was sent
            message = f"the request to {where} cannot be sent: {type(err).__name__}"
            raise ModelCallFailed("ModelEndpointInvalid", message, True) from None
        except (aiohttp.ClientError, ConnectionError, OSError) as err:
            raise ModelCallFailed(
                "ModelUnreachable", _lost("APIConnectionError", _cause(err), endpoint), True
            ) from None
        if not 200 <= status < 300:
            name, reason, retryable = status_failure(status)
            kind = reply_kind(reply_headers, content, endpoint.api_key)
            raise ModelCallFailed(reason, f"{name} (HTTP {status}) from {where}: {kind}", retryable)
        return reply_of(endpoint.base_url, status, reply_headers, content, endpoint.api_key)

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
        await self._messages.close()


async def _bounded(response: aiohttp.ClientResponse, where: str) -> bytes:
    """The reply's body, read up to :data:`REPLY_MAX_BYTES`; past it the connection is dropped."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > REPLY_MAX_BYTES:
            response.close()  # not read further, and the connection is not reused
            raise reply_too_large(response.status, where)
        chunks.append(chunk)
    return b"".join(chunks)


def _lost(name: str, text: str, endpoint: ModelEndpoint) -> str:
    """A timeout's or a lost connection's message, as the ``openai`` client worded it (its class
    and text), with the endpoint and the limit."""
    where = shown_endpoint(endpoint.base_url)
    return f"{name}: {sanitized(text, endpoint.api_key)} ({where}, timeout {endpoint.timeout_seconds:g}s)"


def _cause(err: BaseException) -> str:
    """What was lost: the client's "Connection error." and the transport's own words."""
    said = str(err)
    return (
        f"Connection error. {type(err).__name__}: {said}"
        if said
        else f"Connection error. {type(err).__name__}"
    )


__all__ = ["ModelCallFailed", "ModelClient", "ModelEndpoint", "status_failure"]
