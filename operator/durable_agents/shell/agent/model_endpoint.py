"""Where a run's model answers, as the worker calls it (resolved from spec.agent.endpoint)."""

from __future__ import annotations

from dataclasses import dataclass

from durable_agents.core.agent.messages_api import OPENAI_CHAT


@dataclass(frozen=True)
class ModelEndpoint:
    """A base URL, its credential, the bound of one call and the protocol it speaks
    (openai-chat: an OpenAI-compatible base URL, …/v1; anthropic-messages: before /v1/messages)."""

    base_url: str
    api_key: str | None = None
    timeout_seconds: float = 60.0
    protocol: str = OPENAI_CHAT
