"""``Agent`` and ``ModelConfig``: an agent a platform team defines once, and the model it uses.

An AgentRun names an Agent by ``spec.agentRef`` (a name in the run's namespace: a reference to
another namespace cannot be written). At acceptance the operator resolves the Agent, its
ModelConfig and its system prompt, and pins their content and digests in the run's checkpoint:
the run uses exactly that for its whole life, whatever later happens to the definitions
(``freshness.definitionChanged`` of the run's policy says what a change means).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from durable_agents.api.v1alpha1.agent import AgentTool, KeyReference, McpServer, ModelProtocol, SubAgent
from durable_agents.api.v1alpha1.agentpolicy import AgentLimitsSpec
from durable_agents.api.v1alpha1.meta import (
    API_VERSION,
    DURATION_PATTERN,
    NAME_PATTERN,
    ApiModel,
    bounded_duration,
    cel,
)

# The largest system prompt a run pins (inline or from a ConfigMap): it lives in the run's
# checkpoint, inside the status's room (docs/reference/limits.md).
PINNED_PROMPT_MAX = 8192


class ModelConfigSpec(ApiModel):
    """A model endpoint several Agents share."""

    base_url: str = Field(
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description=(
            "The API's base URL: for openai-chat, ending before /chat/completions; for "
            "anthropic-messages, before /v1/messages."
        ),
    )
    model: str = Field(min_length=1, max_length=253)
    """The model's name at the endpoint; recorded in each run that uses it."""
    protocol: ModelProtocol = ModelProtocol.OPENAI_CHAT
    """The protocol the endpoint speaks: openai-chat (default) or anthropic-messages."""
    accepts_images: bool | None = Field(
        default=None,
        description=(
            "Whether the model takes images: true gives it the small images of MCP tool results "
            "as images (a user message after the results); absent or false, only their "
            "description (type and size)."
        ),
    )
    credentials_secret_ref: KeyReference | None = Field(
        default=None,
        description="The API key: a key of a Secret in the namespace, read as each run's ServiceAccount.",
    )
    timeout: str = Field(
        default="60s", max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("timeout")
    )
    """How long one model call may take."""


class SystemPrompt(ApiModel):
    """The system prompt: inline text, or a key of a ConfigMap in the namespace (exactly one)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.inline) != has(self.configMapKeyRef)",
                    "exactly one of inline and configMapKeyRef must be set",
                )
            ]
        }
    )

    inline: str | None = Field(default=None, min_length=1, max_length=PINNED_PROMPT_MAX)
    """The prompt's text."""
    config_map_key_ref: KeyReference | None = None
    """A key of a ConfigMap in the namespace, read as each run's ServiceAccount at acceptance."""


class AgentSpec(ApiModel):
    """What an agent is: its model, prompt and tools. Runs pin it at acceptance."""

    model_ref: str = Field(max_length=253, pattern=NAME_PATTERN)
    """The ModelConfig (in this namespace) the agent calls."""
    system_prompt: SystemPrompt
    """The system prompt (at most 8192 characters: a run pins it in its checkpoint)."""
    tools: list[AgentTool] = Field(default_factory=list, max_length=32)
    """The tools the model may call."""
    mcp_servers: list[McpServer] = Field(default_factory=list, max_length=8)
    """MCP servers whose tools the model may call."""
    sub_agents: list[SubAgent] = Field(default_factory=list, max_length=8)
    """Other Agents the model may call as tools: each call is a child AgentRun of that Agent,
    owned by the run, with the run's ServiceAccount and policy; the child's final answer comes
    back as the call's result. Depth and fan-out are bounded by the policy's agentLimits."""
    prompt: str | None = Field(default=None, min_length=1, max_length=253)
    """An ID of the prompt's version, for people and the policy's runtime.prompts (unset: the
    pinned prompt's digest)."""
    tool_set: str | None = Field(default=None, min_length=1, max_length=253)
    """An ID of the tool set's version, for the policy's runtime.toolSets (unset: none)."""
    limits: AgentLimitsSpec | None = None
    """The agent's default limits (model calls, tokens, tool calls, ...): the run's policy's
    agentLimits caps each (the lower of the two applies); unset fields: the policy's, else the
    operator's defaults."""


class Agent(ApiModel):
    """An agent a platform team defines once; runs name it by spec.agentRef and pin it."""

    api_version: Literal["durable-agents.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["Agent"] = "Agent"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: AgentSpec


class ModelConfig(ApiModel):
    """A model endpoint, its protocol and credentials, that Agents name by spec.modelRef."""

    api_version: Literal["durable-agents.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["ModelConfig"] = "ModelConfig"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ModelConfigSpec


AGENT_PLURAL = "agents"
MODEL_CONFIG_PLURAL = "modelconfigs"
