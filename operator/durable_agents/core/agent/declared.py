"""The tools a run's ``spec.agent`` declares, as the planner's :class:`ToolDeclaration` values.

Pure: what a person wrote in the spec, nothing fetched. MCP servers' tools are listed by the shell
(their schemas live on the server) and added to these.
"""

from __future__ import annotations

from durable_agents.api.v1alpha1.agent import AgentConfig, AgentTool
from durable_agents.core.agent.tools import (
    ToolDeclaration,
    ask_human_tool,
    await_event_tool,
    effect_tool,
    read_tool,
    sub_agent_tool,
)
from durable_agents.core.durations import parse_duration


def declared_tool(tool: AgentTool) -> ToolDeclaration:
    """One tool of the spec (the API server's CEL rule guarantees exactly one kind is set)."""
    if tool.read is not None:
        return read_tool(tool.name, tool.description, api_version=tool.read.api_version, kind=tool.read.kind)
    if tool.effect is not None:
        return effect_tool(
            tool.name,
            tool.description,
            effect=tool.effect.effect,
            target=tool.effect.target,
            parameters=tool.effect.parameters,
        )
    wait = tool.ask_human or tool.await_event
    if wait is None:
        raise ValueError(f"tool {tool.name!r} sets none of read, effect, askHuman, awaitEvent")
    expires = parse_duration(wait.expires_in) if wait.expires_in else None
    make = ask_human_tool if tool.ask_human is not None else await_event_tool
    return make(tool.name, tool.description, expires_in=expires)


def declared_tools(config: AgentConfig) -> tuple[ToolDeclaration, ...]:
    """Every tool of the spec, in the spec's order, then one per sub-agent (an Agent it may call)."""
    sub_agents = (
        sub_agent_tool(sub.tool(), sub.description, agent_ref=sub.agent_ref) for sub in config.sub_agents
    )
    return (*(declared_tool(tool) for tool in config.tools), *sub_agents)
