"""A run of an Agent (``spec.agentRef``): the definition it pins at acceptance, and what a later
change of that definition means for it (the policy's ``freshness.definitionChanged``).

Pure: the shell reads the Agent, its ModelConfig and the prompt's text (as the run's
ServiceAccount) and hands them here. The pinned content goes into the run's checkpoint (stamped
with it), so the run uses exactly that for its whole life, even after the Agent changes or goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints
from pydantic.alias_generators import to_camel, to_snake

from durable_agents.api.v1alpha1 import (
    PINNED_PROMPT_MAX,
    AgentConfig,
    AgentSpec,
    DefinitionChangeResponse,
    ModelConfigSpec,
    ModelEndpoint,
    PlannerKind,
)
from durable_agents.core.digest import canonical_digest, canonical_json
from durable_agents.core.policy_integrity import live

# The largest pinned definition (its JSON, the prompt included): it lives in the run's checkpoint,
# within the status's room (core/limits.py; tests/unit/test_limits.py counts it).
PINNED_DEFINITION_MAX = 12 * 1024

DEFINITION_CHANGED = "DefinitionChanged"  # the condition a kept change leaves on the run

Digest = Annotated[str, StringConstraints(max_length=80)]


class PinnedDefinition(BaseModel):
    """What a run of an Agent pinned at acceptance (``checkpoint.definition``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)

    agent_ref: Annotated[str, StringConstraints(max_length=253)]
    model_ref: Annotated[str, StringConstraints(max_length=253)]
    digest: Digest
    """Over the four digests below: what approvals and `kubectl get` name."""
    agent_digest: Digest
    model_digest: Digest
    prompt_digest: Digest
    tool_set_digest: Digest
    protocol: Annotated[str, StringConstraints(max_length=32)]
    agent: dict[str, Any]
    """The run's agent, as an inline ``spec.agent`` would give it (its prompt is below)."""
    system_prompt: Annotated[str, StringConstraints(max_length=PINNED_PROMPT_MAX)]
    limits: dict[str, int] | None = None
    """The Agent's default limits, as set (its spec.limits, camelCase); the policy caps each."""

    def agent_limits(self) -> dict[str, int]:
        """The Agent's limits by :class:`AgentLimits` field name (snake_case)."""
        return {to_snake(key): value for key, value in (self.limits or {}).items()}

    approved_under: Digest | None = None
    """The definition digest the run's last re-approval was bound to (policy reapprove)."""

    def agent_config(self) -> AgentConfig:
        return AgentConfig.model_validate(self.agent)

    def current(self) -> str:
        """The digest of the definition the run stands under: the one a re-approval accepted,
        else the one it pinned."""
        return self.approved_under or self.digest


class DefinitionUnusable(ValueError):
    """The definition cannot be pinned (a prompt too large, a protocol this operator lacks)."""


def definition_digests(agent: AgentSpec, model: ModelConfigSpec, prompt: str) -> dict[str, str]:
    """The four digests a run records, and the whole definition's over them."""
    wire_agent = agent.model_dump(mode="json", by_alias=True, exclude_none=True)
    if not wire_agent.get("subAgents"):  # absent as before it existed: earlier pins keep their digest
        wire_agent.pop("subAgents", None)
    tools = {k: wire_agent.get(k, []) for k in ("tools", "mcpServers")}
    if "subAgents" in wire_agent:
        tools["subAgents"] = wire_agent["subAgents"]
    parts = {
        "agentDigest": canonical_digest(wire_agent),
        "modelDigest": canonical_digest(model.model_dump(mode="json", by_alias=True, exclude_none=True)),
        "promptDigest": canonical_digest({"systemPrompt": prompt}),
        "toolSetDigest": canonical_digest(tools),
    }
    return {**parts, "digest": canonical_digest(parts)}


def pin(name: str, agent: AgentSpec, model: ModelConfigSpec, prompt: str) -> PinnedDefinition:
    """The definition a run of Agent ``name`` pins. :class:`DefinitionUnusable` says why not."""
    if len(prompt) > PINNED_PROMPT_MAX:
        raise DefinitionUnusable(
            f"the system prompt of Agent {name!r} has {len(prompt)} characters; a run pins at most "
            f"{PINNED_PROMPT_MAX} (it is kept in the run's checkpoint)"
        )
    digests = definition_digests(agent, model, prompt)
    config = AgentConfig(
        planner=PlannerKind.MODEL,
        model=model.model,
        prompt=agent.prompt or digests["promptDigest"][:253],
        tool_set=agent.tool_set,
        endpoint=ModelEndpoint(
            base_url=model.base_url,
            credentials_secret_ref=model.credentials_secret_ref,
            timeout=model.timeout,
            protocol=model.protocol,
            accepts_images=model.accepts_images,
        ),
        tools=agent.tools,
        mcp_servers=agent.mcp_servers,
        sub_agents=agent.sub_agents,
    )
    pinned = PinnedDefinition.model_validate(
        {
            **digests,
            "agentRef": name,
            "modelRef": agent.model_ref,
            "protocol": model.protocol.value,
            "agent": config.model_dump(mode="json", by_alias=True, exclude_none=True),
            "systemPrompt": prompt,
            "limits": agent.limits.model_dump(by_alias=True, exclude_none=True) or None
            if agent.limits
            else None,
        }
    )
    size = len(canonical_json(pinned.model_dump(mode="json", by_alias=True, exclude_none=True)))
    if size > PINNED_DEFINITION_MAX:
        raise DefinitionUnusable(
            f"the definition of Agent {name!r} (its tools, MCP servers and prompt) takes {size} bytes; "
            f"a run pins at most {PINNED_DEFINITION_MAX} (it is kept in the run's checkpoint)"
        )
    return pinned


@dataclass(frozen=True)
class DefinitionNow:
    """The run's Agent as it is now: its digest, or None when it (or its model) is gone; with
    ``why`` when it cannot be read whole (then nothing is concluded)."""

    digest: str | None
    why: str = ""


@dataclass(frozen=True)
class DefinitionChange:
    """A pinned definition that no longer is the Agent's, and what the policy says to do."""

    response: DefinitionChangeResponse
    message: str


def definition_change(
    pinned: PinnedDefinition | None, now: DefinitionNow | None, response: DefinitionChangeResponse
) -> DefinitionChange | None:
    """What applies to a run that pinned ``pinned`` now that its Agent is ``now``, or None when
    nothing changed (or nothing is known: no pin, nothing read)."""
    if pinned is None or now is None or now.why or now.digest == pinned.current():
        return None
    what = (
        f"Agent {pinned.agent_ref!r} (or its ModelConfig {pinned.model_ref!r}) was deleted"
        if now.digest is None
        else f"Agent {pinned.agent_ref!r} changed: pinned {pinned.current()}, now {now.digest}"
    )
    if response is DefinitionChangeResponse.KEEP:
        return DefinitionChange(response, f"{what}; the run keeps its pinned definition (policy: keep)")
    if response is DefinitionChangeResponse.FAIL:
        return DefinitionChange(response, f"{what}; the run fails (policy: fail)")
    if now.digest is None:  # nothing to re-approve under: a deleted definition ends the run
        return DefinitionChange(
            DefinitionChangeResponse.FAIL, f"{what}; nothing to re-approve under (policy: reapprove)"
        )
    return DefinitionChange(
        response, f"{what}; pending consequential work needs a new approval (policy: reapprove)"
    )


def pinned_of(raw_checkpoint: Any) -> PinnedDefinition | None:
    """The definition a stored checkpoint pinned, or None (none, or not readable: the checkpoint's
    own loading says why)."""
    if not isinstance(raw_checkpoint, Mapping) or not isinstance(raw_checkpoint.get("definition"), Mapping):
        return None
    try:
        return PinnedDefinition.model_validate(raw_checkpoint["definition"])
    except ValueError:
        return None


def definition_users(
    runs: Iterable[Mapping[str, Any]], kind: str, name: str, agents_of_model: Iterable[str] = ()
) -> list[str]:
    """The non-terminal runs (sorted names) that use the Agent or ModelConfig ``name`` (``kind``):
    runs of the Agent; for a ModelConfig, runs that pinned it and runs of ``agents_of_model``
    (the Agents that name it, for runs that did not pin yet)."""
    agents = set(agents_of_model)

    def uses(run: Mapping[str, Any]) -> bool:
        ref = (run.get("spec") or {}).get("agentRef")
        if kind == "Agent":
            return ref == name
        pinned = pinned_of((run.get("status") or {}).get("checkpoint"))
        return (pinned.model_ref == name) if pinned is not None else ref in agents

    return sorted(
        str((run.get("metadata") or {}).get("name") or "") for run in runs if live(run) and uses(run)
    )


def sub_agent_cycle(name: str, calls: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle of sub-agent calls through Agent ``name`` (``calls``: each Agent's subAgents, by
    name; ``name``'s as it is to be written), as the path from ``name`` back to it; None if none.
    A run of such an Agent would refuse the call that closes the cycle (``SubAgentCycle``)."""
    seen: set[str] = set()
    stack: list[tuple[str, list[str]]] = [(name, [name])]
    while stack:
        agent, path = stack.pop()
        for callee in calls.get(agent, ()):
            if callee == name:
                return [*path, callee]
            if callee not in seen:
                seen.add(callee)
                stack.append((callee, [*path, callee]))
    return None
