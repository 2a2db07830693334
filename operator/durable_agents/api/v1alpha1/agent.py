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
    """What proposes a run's steps: its script (scripted) or a model (model)."""

    SCRIPTED = "scripted"
    MODEL = "model"


class ModelProtocol(StrEnum):
    """The API a model endpoint speaks."""

    OPENAI_CHAT = "openai-chat"
    ANTHROPIC_MESSAGES = "anthropic-messages"


class KeyReference(ApiModel):
    """One key of a Secret or ConfigMap in the run's namespace."""

    name: str = Field(max_length=253, pattern=NAME_PATTERN)
    """The Secret's or ConfigMap's name."""
    key: str = Field(max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """The key in its data."""


class ModelEndpoint(ApiModel):
    """A model endpoint: OpenAI-compatible chat completions (OpenAI, vLLM, Ollama, a gateway) or
    the Anthropic Messages API, as ``protocol`` says."""

    base_url: str = Field(
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description=(
            "The API's base URL: for openai-chat, ending before /chat/completions (for example "
            "http://host/v1); for anthropic-messages, before /v1/messages (for example "
            "https://api.anthropic.com)."
        ),
    )
    protocol: ModelProtocol = Field(
        default=ModelProtocol.OPENAI_CHAT,
        description=(
            "The API the endpoint speaks: openai-chat (chat completions, the default) or "
            "anthropic-messages (the Anthropic Messages API). The run records the same model, "
            "prompt and tool-set identifiers either way."
        ),
    )
    credentials_secret_ref: KeyReference | None = Field(
        default=None, description="The API key: a key of a Secret in the run's namespace."
    )
    accepts_images: bool | None = Field(
        default=None,
        description=(
            "Whether the model takes images: true gives it the small images of MCP tool results "
            "as images (a user message after the results); absent or false, only their "
            "description (type and size)."
        ),
    )
    timeout: str = Field(
        default="60s", max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("timeout")
    )
    """How long one model call may take."""


class ReadTool(ApiModel):
    """Get an object of this kind in the run's namespace, as its ServiceAccount; the model names it."""

    api_version: str = Field(max_length=253)
    """The API version of the kind the tool reads (for example v1)."""
    kind: str = Field(max_length=63)
    """The kind the tool reads (for example ConfigMap)."""


class EffectTool(ApiModel):
    """An effect at a fixed target: the model supplies only arguments, checked against parameters."""

    effect: str = Field(max_length=128, pattern=r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$")
    """The effect plugin that performs the call (http.post, kubernetes.apply or an installed one)."""
    target: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """Where the effect lands, in the plugin's terms: fixed here, never chosen by the model."""
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object"},
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    """The JSON Schema of the arguments the model supplies (shown to the model, checked on each
    call)."""


class WaitTool(ApiModel):
    """``askHuman`` (waiting_input) or ``awaitEvent`` (waiting_external), proposed by the model."""

    expires_in: str | None = Field(
        default=None, max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("expiresIn")
    )
    """How long to wait (at most 8760h) before the run expires; unset: the policy's waitExpiries."""


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
    """The function name the model calls it by."""
    description: str = Field(default="", max_length=1024)
    """What the tool does, told to the model."""
    read: ReadTool | None = None
    """Read an object of one kind in the run's namespace, named by the model."""
    effect: EffectTool | None = None
    """Perform an effect at a fixed target with the model's arguments (through the action ledger)."""
    ask_human: WaitTool | None = None
    """Ask a person the model's question and wait for the answer (waiting_input)."""
    await_event: WaitTool | None = None
    """Wait for the external event the model names (waiting_external)."""


class SubAgent(ApiModel):
    """Another Agent (in the run's namespace) the model may call as a tool: each call is a child
    AgentRun of that Agent, owned by the run, under the run's ServiceAccount and policy."""

    agent_ref: str = Field(max_length=253, pattern=NAME_PATTERN)
    """The Agent the child run is a run of."""
    tool_name: str | None = Field(default=None, pattern=TOOL_NAME_PATTERN, max_length=64)
    """The function name the model calls it by (unset: the Agent's name, with - kept)."""
    description: str = Field(default="", max_length=1024)
    """What the sub-agent does, told to the model."""

    def tool(self) -> str:
        """The tool's name as the model sees it."""
        return self.tool_name or self.agent_ref.replace(".", "_")[:64]


class McpHeader(ApiModel):
    """An HTTP header sent with every request to an MCP server, its value from a Secret."""

    name: str = Field(max_length=128, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
    """The header's name (for example X-Api-Key)."""
    secret_key_ref: KeyReference = Field(
        description=(
            "The header's value: a key of a Secret in the run's namespace, read as the run's "
            "ServiceAccount before every request (a rotated value is used by the next one)."
        )
    )


class McpTls(ApiModel):
    """How the operator verifies an https MCP server's certificate."""

    ca_config_map_ref: KeyReference | None = Field(
        default=None,
        description=(
            "PEM CA certificates that verify the server (instead of the system's): a key of a "
            "ConfigMap in the run's namespace, read as the run's ServiceAccount."
        ),
    )


class McpServer(ApiModel):
    """An MCP server (streamable HTTP): its tool list is digested (a change fails a pending call);
    its annotations give a tool's tier only when the policy trusts it (spec.mcp.trustedServers)."""

    name: str = Field(max_length=32, pattern=NAME_PATTERN)
    """The server's name in this run: its tools are named mcp:<name>/<tool> in the policy's tiers."""
    url: str = Field(max_length=2048, pattern=r"^https?://[^\s]+$")
    """The server's endpoint (streamable HTTP)."""
    bearer_token_secret_ref: KeyReference | None = Field(
        default=None,
        description=(
            "A token sent as `Authorization: Bearer <token>`: a key of a Secret in the run's "
            "namespace, read as the run's ServiceAccount before every request (a rotated token is "
            "used by the next one). Never logged, traced or recorded."
        ),
    )
    headers: list[McpHeader] = Field(
        default_factory=list,
        max_length=16,
        description="More headers sent with every request, each value from a Secret key.",
    )
    tls: McpTls | None = None
    """TLS options for an https URL (a CA bundle)."""
    tools: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list,
        max_length=64,
        description="The tools the model may call (empty: every tool the server lists).",
    )
    timeout: str = Field(
        default="30s", max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("timeout")
    )
    """How long one request to the server (listing tools, a call) may take."""
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
    """scripted: the run's spec.steps; model: a model proposes each step (needs endpoint, model
    and systemPrompt)."""
    model: str | None = Field(default=None, min_length=1, max_length=253)
    """The model's name at the endpoint; recorded, and checked on resume against the policy's
    runtime.models."""
    prompt: str | None = Field(default=None, min_length=1, max_length=253)
    """An ID of the prompt's version; recorded, and checked on resume against runtime.prompts."""
    tool_set: str | None = Field(default=None, min_length=1, max_length=253)
    """An ID of the tool set's version; recorded, and checked on resume against runtime.toolSets."""
    endpoint: ModelEndpoint | None = None
    """The model's chat-completions endpoint (model planner)."""
    system_prompt: KeyReference | None = Field(
        default=None, description="The system prompt: a key of a ConfigMap in the run's namespace."
    )
    tools: list[AgentTool] = Field(default_factory=list, max_length=32)
    """The tools the model may call, declared here."""
    mcp_servers: list[McpServer] = Field(default_factory=list, max_length=8)
    """MCP servers whose tools the model may call."""
    sub_agents: list[SubAgent] = Field(default_factory=list, max_length=8)
    """Agents the model may call as tools (each call a child run; see the Agents page)."""
