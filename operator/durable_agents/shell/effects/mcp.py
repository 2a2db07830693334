"""``mcp.call``: a consequential call of a tool on an MCP server, through the action ledger.

target: ``{"server": <name in spec.agent>, "url": <streamable HTTP endpoint>, "tool": <name>}``,
written by the model planner from the run's spec (the model only supplies the arguments). The
idempotency key travels in the call's ``_meta`` (``durable-agents.io/idempotency-key``).

A result is applied (a tool error is the tool's definite answer: failed); a call that was never
sent (server unreachable, tool not listed) is a definite failure; a call sent without an answer
is unknown. MCP has no standard query by idempotency key: a server may declare one per tool
(``spec.agent.mcpServers[].queryTools``, carried as ``target.queryTool``); without it the query
answers unknown and the action stays ``outcome_unknown`` until a person reconciles it
(``kubectl agentrun reconcile``).
"""

from __future__ import annotations

from durable_agents.api.v1alpha1 import ActionTier
from durable_agents.shell.agent.mcp_tools import McpCallUnknown, McpError, bounded_content, call_tool
from durable_agents.shell.effects.base import (
    Action,
    Applied,
    DispatchResult,
    EffectContext,
    Failed,
    NotApplied,
    QueryResult,
    Unknown,
)

NO_QUERY = "NoQueryByKey"


class McpCall:
    name = "mcp.call"
    tier = ActionTier.CONSEQUENTIAL
    reversible = False
    compensation: str | None = None

    async def dispatch(self, ctx: EffectContext, action: Action) -> DispatchResult:
        url, tool = action.target.get("url"), action.target.get("tool")
        if not isinstance(url, str) or not isinstance(tool, str):
            return Failed("InvalidTarget", "mcp.call needs target.url and target.tool")
        try:
            result = await call_tool(
                url, tool, action.arguments, idempotency_key=action.key, timeout=ctx.timeout
            )
        except McpCallUnknown as err:
            return Unknown("McpCallUnknown", str(err))
        except McpError as err:  # not sent: unreachable, or the tool is not listed
            return Failed(type(err).__name__, str(err))
        if result.is_error:
            return Failed("McpToolError", f"{tool} answered an error: {str(result.content)[:512]}")
        return Applied({"tool": tool, "content": bounded_content(result.content)})

    async def query(self, ctx: EffectContext, action: Action) -> QueryResult:
        url, query = action.target.get("url"), action.target.get("queryTool")
        if isinstance(url, str) and isinstance(query, str):
            return await self._ask(ctx, url, query, action.key)
        return Unknown(
            NO_QUERY,
            f"MCP has no query by idempotency key: ask the server's owner whether "
            f"{action.target.get('tool')!r} applied key {action.key}, then "
            "`kubectl agentrun reconcile RUN --action NAME --applied|--not-applied`",
        )

    async def _ask(self, ctx: EffectContext, url: str, query: str, key: str) -> QueryResult:
        """The server's own query tool: ``{"idempotencyKey": key}`` -> ``{"applied": bool}``."""
        try:
            result = await call_tool(
                url, query, {"idempotencyKey": key}, idempotency_key=None, timeout=ctx.timeout
            )
        except McpError as err:
            return Unknown(type(err).__name__, str(err))
        applied = result.content.get("applied") if isinstance(result.content, dict) else None
        if result.is_error or not isinstance(applied, bool):
            return Unknown("QueryUnanswered", f"{query} gave no applied: true|false for key {key}")
        return (
            Applied({"tool": query, "content": bounded_content(result.content)}) if applied else NotApplied()
        )
