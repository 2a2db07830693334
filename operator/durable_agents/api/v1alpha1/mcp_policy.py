"""AgentPolicy's ``spec.mcp``: how far an MCP server's word counts, what it may ask of the run, and
which of its tools the platform team trusts as idempotent."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from durable_agents.api.v1alpha1.meta import DURATION_PATTERN, ApiModel, cel


class TrustedMcpServer(ApiModel):
    """An MCP server whose tool annotations this policy believes (``readOnlyHint``,
    ``destructiveHint``), named by the URL the operator calls: the name a run gives a server is the
    run author's, the URL is where the call lands."""

    url: str = Field(
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description="The server's endpoint, exactly as runs name it in spec.agent.mcpServers[].url.",
    )
    tools: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list,
        max_length=64,
        description="The tools whose annotations are believed (empty: every tool of this server).",
    )


class McpSamplingGrant(ApiModel):
    """An MCP server that may sample the run's model (``sampling/createMessage``) while a read-only
    call of the run is open, named by the URL the operator calls. Each sample is a model call of
    the run: the run's model definition, counted against its model-call and token limits."""

    url: str = Field(
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description="The server's endpoint, exactly as runs name it in spec.agent.mcpServers[].url.",
    )
    max_tokens: int = Field(
        default=1024,
        ge=1,
        le=32768,
        description=(
            "The most tokens one sample may ask for (its maxTokens); a request asking for more is "
            "refused, and the server told."
        ),
    )
    max_requests_per_call: int = Field(
        default=4,
        ge=1,
        le=16,
        description="Samples one tool call may ask for; the next is refused, and the server told.",
    )


class IdempotentMcpTools(ApiModel):
    """Tools of one MCP server the platform team trusts as idempotent (the same call under the
    same idempotency key applies once, however often it is sent), named by the URL the operator
    calls, as ``trustedServers``. Only this lets a call lost while held open be sent again."""

    url: str = Field(
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description="The server's endpoint, exactly as runs name it in spec.agent.mcpServers[].url.",
    )
    tools: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        min_length=1,
        max_length=64,
        description="The tools trusted as idempotent, each named (no wildcard: never a whole server).",
    )


HOLD_OPEN_DEFAULT = "10m"
HOLD_OPEN_MAX = "1h"


class McpPolicy(ApiModel):
    """How far an MCP server's word about its own tools counts, and what it may ask of the run."""

    trusted_servers: list[TrustedMcpServer] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Servers whose annotations may lower a tool below consequential (readOnlyHint: read-only, "
            "called between commits without approval; destructiveHint false: reversible). An MCP "
            "tool with no tier in `tiers` (mcp:<server>/<tool>) on a server not listed here is "
            "consequential whatever it says about itself: approved, ledgered, sent with an "
            "idempotency key. A tier is fixed when the call is proposed; no later listing lowers it."
        ),
    )
    sampling: list[McpSamplingGrant] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Servers that may sample the run's model during a read-only call. Every other "
            "sampling/createMessage request is refused (a JSON-RPC error the server is told; the "
            "run goes on)."
        ),
    )
    hold_open: str = Field(
        default=HOLD_OPEN_DEFAULT,
        max_length=32,
        pattern=DURATION_PATTERN,
        description=(
            "How long an approved call whose server asks for input while the call is open "
            "(elicitation/create, protocol 2025-11-25) is held open for a person's answer; past "
            f"it the server is told `cancel`. At most {HOLD_OPEN_MAX}."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(f"duration(self) <= duration('{HOLD_OPEN_MAX}')", f"must be at most {HOLD_OPEN_MAX}")
            ]
        },
    )
    idempotent_tools: list[IdempotentMcpTools] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Tools trusted as idempotent. An approved call of one of them, lost while held open for "
            "a person's answer (an operator restart, protocol 2025-11-25), is sent again under the "
            "same idempotency key (its server asks again) instead of becoming outcome_unknown. The "
            "policy is read when the call is found lost. Any other lost call stays outcome_unknown."
        ),
    )
