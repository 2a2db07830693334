"""``spec.agent``: which planner drives a run and, for the ``model`` planner, its model and tools.

A person writes everything that decides WHERE an effect lands (an effect tool's ``target``, the
kinds a read tool may get, the MCP servers and the tools allowed from each); the model only fills
in arguments, which the approval digest then covers. Credentials are never inline: a Secret in the
run's namespace, read as the run's ServiceAccount.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from durable_agents.api.v1alpha1.meta import (
    DURATION_PATTERN,
    NAME_PATTERN,
    ApiModel,
    bounded_duration,
    cel,
)

TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"  # what chat-completions APIs accept as a function name
TOOL_KINDS = ("read", "effect", "askHuman", "awaitEvent")


class PlannerKind(StrEnum):
    SCRIPTED = "scripted"
    MODEL = "model"


class KeyReference(ApiModel):
    """One key of a Secret or ConfigMap in the run's namespace."""

    name: str = Field(max_length=253, pattern=NAME_PATTERN)
    key: str = Field(max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class ModelEndpoint(ApiModel):
    """An OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, a gateway)."""

    base_url: str = Field(
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description="The API's base URL, ending before /chat/completions (for example http://host/v1).",
    )
    credentials_secret_ref: KeyReference | None = Field(
        default=None, description="The API key: a key of a Secret in the run's namespace."
    )
    timeout: str = Field(
        default="60s", max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("timeout")
    )


class ReadTool(ApiModel):
    """Get an object of this kind in the run's namespace, as its ServiceAccount; the model names it."""

    api_version: str = Field(max_length=253)
    kind: str = Field(max_length=63)


class EffectTool(ApiModel):
    """An effect at a fixed target: the model supplies only arguments, checked against parameters."""

    effect: str = Field(max_length=128, pattern=r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$")
    target: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object"},
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class WaitTool(ApiModel):
    """``askHuman`` (waiting_input) or ``awaitEvent`` (waiting_external), proposed by the model."""

    expires_in: str | None = Field(
        default=None, max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("expiresIn")
    )


class AgentTool(ApiModel):
    """A tool the model may call: exactly one of read, effect, askHuman, awaitEvent."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    " + ".join(f"(has(self.{k}) ? 1 : 0)" for k in TOOL_KINDS) + " == 1",
                    "exactly one of " + ", ".join(TOOL_KINDS) + " must be set in a tool",
                )
            ]
        }
    )

    name: str = Field(pattern=TOOL_NAME_PATTERN, max_length=64)
    description: str = Field(default="", max_length=1024)
    read: ReadTool | None = None
    effect: EffectTool | None = None
    ask_human: WaitTool | None = None
    await_event: WaitTool | None = None


class McpServer(ApiModel):
    """An MCP server (streamable HTTP): its tool list is digested (a change fails a pending call);
    its annotations give a tool's tier only when the policy trusts it (spec.mcp.trustedServers)."""

    name: str = Field(max_length=32, pattern=NAME_PATTERN)
    url: str = Field(max_length=2048, pattern=r"^https?://[^\s]+$")
    tools: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list,
        max_length=64,
        description="The tools the model may call (empty: every tool the server lists).",
    )
    timeout: str = Field(
        default="30s", max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("timeout")
    )
    query_tools: dict[str, Annotated[str, Field(max_length=64)]] = Field(
        default_factory=dict,
        max_length=64,
        description=(
            "For a consequential tool, a read-only tool of this server that says whether a call "
            "applied: called with {idempotencyKey}, it answers {applied: true|false}. Without one, "
            "a call whose answer was lost waits for `kubectl agentrun reconcile`."
        ),
    )


class AgentConfig(ApiModel):
    """The planner; model, prompt and toolSet are recorded and checked on resume (policy runtime)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.planner != 'model' || (has(self.endpoint) && has(self.model) "
                    "&& has(self.systemPrompt))",
                    "the model planner needs endpoint, model and systemPrompt",
                ),
            ]
        }
    )

    planner: PlannerKind = PlannerKind.SCRIPTED
    model: str | None = Field(default=None, min_length=1, max_length=253)
    prompt: str | None = Field(default=None, min_length=1, max_length=253)
    tool_set: str | None = Field(default=None, min_length=1, max_length=253)
    endpoint: ModelEndpoint | None = None
    system_prompt: KeyReference | None = Field(
        default=None, description="The system prompt: a key of a ConfigMap in the run's namespace."
    )
    tools: list[AgentTool] = Field(default_factory=list, max_length=32)
    mcp_servers: list[McpServer] = Field(default_factory=list, max_length=8)
