"""The model call: one chat-completions request through the official ``openai`` client.

Retries are off in the client: a failed call is a failed attempt of the run, and the run's retry
policy decides when (and whether) to call again, so a model endpoint that times out or fails is a
retry window, never a silent failure and never a hidden loop of paid calls. The client is built
once per endpoint and credential and kept (its connection pool is the expensive part).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when the first model call is made: the client costs ~1 s and ~16 MB
    import openai

from durable_agents.core.agent.exchange import ModelReply, ModelRequest, ToolCall, Usage

log = logging.getLogger(__name__)

NO_KEY = "unused"  # the client insists on a key; a local server without auth ignores it


@dataclass(frozen=True)
class ModelEndpoint:
    """Where a run's model answers: an OpenAI-compatible base URL (…/v1) and its credential."""

    base_url: str
    api_key: str | None = None
    timeout_seconds: float = 60.0


class ModelCallFailed(Exception):
    """The model did not answer usably. ``reason`` is a run outcome reason; ``retryable`` says
    whether the run's retry policy may try again (a refused request or a bad key will not heal)."""

    def __init__(self, reason: str, message: str, retryable: bool) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message[:1024]
        self.retryable = retryable


def _failures() -> tuple[tuple[type[openai.OpenAIError], str, bool], ...]:
    """The client's exception classes, most specific first, and what each means for the run."""
    import openai

    return (
        (openai.APITimeoutError, "ModelTimeout", True),
        (openai.APIConnectionError, "ModelUnreachable", True),
        (openai.RateLimitError, "ModelRateLimited", True),
        (openai.AuthenticationError, "ModelAuthFailed", False),
        (openai.PermissionDeniedError, "ModelAuthFailed", False),
        (openai.BadRequestError, "ModelRequestRefused", False),
        (openai.UnprocessableEntityError, "ModelRequestRefused", False),
        (openai.NotFoundError, "ModelNotFound", False),
        (openai.APIStatusError, "ModelError", True),
        (openai.APIResponseValidationError, "ModelReplyInvalid", True),
    )


class ModelClient:
    """Chat completions for the worker; one ``AsyncOpenAI`` per (base URL, key, timeout)."""

    def __init__(self) -> None:
        self._clients: dict[ModelEndpoint, openai.AsyncOpenAI] = {}

    def _client(self, endpoint: ModelEndpoint) -> openai.AsyncOpenAI:
        import openai

        client = self._clients.get(endpoint)
        if client is None:
            client = openai.AsyncOpenAI(
                base_url=endpoint.base_url,
                api_key=endpoint.api_key or NO_KEY,
                max_retries=0,
                timeout=endpoint.timeout_seconds,
            )
            self._clients[endpoint] = client
        return client

    async def complete(self, endpoint: ModelEndpoint, request: ModelRequest) -> ModelReply:
        """One model call; :class:`ModelCallFailed` when it brought no usable answer."""
        import openai

        try:
            completion = await self._client(endpoint).chat.completions.create(**request.body())
        except openai.OpenAIError as err:
            failed = failure_of(err)
            if failed.reason in ("ModelTimeout", "ModelUnreachable"):  # say which endpoint, what limit
                failed = ModelCallFailed(
                    failed.reason,
                    f"{failed.message} ({endpoint.base_url}, timeout {endpoint.timeout_seconds:g}s)",
                    failed.retryable,
                )
            raise failed from err
        return reply_of(completion.model_dump(mode="json"))

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


def failure_of(err: openai.OpenAIError) -> ModelCallFailed:
    for kind, reason, retryable in _failures():
        if isinstance(err, kind):
            status = getattr(err, "status_code", None)
            where = f" (HTTP {status})" if status else ""
            return ModelCallFailed(reason, f"{type(err).__name__}{where}: {err}", retryable)
    return ModelCallFailed("ModelError", f"{type(err).__name__}: {err}", True)


def reply_of(completion: Mapping[str, Any]) -> ModelReply:
    """The core's view of a chat completion (its first choice); refuses a reply without one."""
    choices = completion.get("choices") or []
    if not choices:
        raise ModelCallFailed("ModelReplyInvalid", "the reply has no choices", True)
    choice = choices[0]
    message = choice.get("message") or {}
    calls = tuple(
        ToolCall(
            id=str(call.get("id") or ""),
            name=str((call.get("function") or {}).get("name") or ""),
            arguments_text=str((call.get("function") or {}).get("arguments") or ""),
        )
        for call in message.get("tool_calls") or ()
        if call.get("type", "function") == "function"
    )
    usage = completion.get("usage") or {}
    return ModelReply(
        model=str(completion.get("model") or ""),
        content=message.get("content"),
        tool_calls=calls,
        finish_reason=choice.get("finish_reason"),
        usage=Usage(
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
        ),
    )
