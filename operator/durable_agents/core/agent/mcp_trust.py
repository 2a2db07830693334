"""How much an MCP server's word about its own tools counts: the tier of an MCP call.

A tool's annotations (``readOnlyHint``, ``destructiveHint``) are the server's claims about itself;
the MCP specification tells clients to treat them as untrusted unless the server is trusted. So:

* a tier the policy gives the tool (``tiers: {"mcp:<server>/<tool>": …}``) decides;
* else the server's hints decide, but only for a server the policy trusts for that tool
  (``spec.mcp.trustedServers``, by URL);
* else the call is consequential: approved where the policy says, an intent in the ledger, sent
  with an idempotency key. A server that lies costs an approval, never a duplicate.

And a call's tier is fixed when the model's proposal is recorded (the checkpoint's turn keeps it):
whatever a later listing or policy says, it is never lowered, so a call waiting for approval
cannot turn into one that needs none. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from durable_agents.api.v1alpha1 import ActionTier, AgentPolicySpec

_RANK: Final[Mapping[ActionTier, int]] = {
    ActionTier.READ_ONLY: 0,
    ActionTier.REVERSIBLE: 1,
    ActionTier.CONSEQUENTIAL: 2,
}

McpTrust = Mapping[str, frozenset[str]]
"""Trusted servers: URL -> the tools whose annotations are believed (empty: every tool)."""


def hinted_tier(*, read_only: bool, destructive: bool) -> ActionTier:
    """The tier a tool's annotations claim: read-only, else destructive (the MCP default) is
    consequential, else reversible."""
    if read_only:
        return ActionTier.READ_ONLY
    return ActionTier.CONSEQUENTIAL if destructive else ActionTier.REVERSIBLE


def mcp_trust(policy: AgentPolicySpec | None) -> McpTrust:
    """The servers a policy trusts, by URL (none without a policy)."""
    if policy is None:
        return {}
    trust: dict[str, frozenset[str]] = {}
    for server in policy.mcp.trusted_servers:
        tools = frozenset(server.tools)
        held = trust.get(server.url)
        # Listed twice: every tool if either entry says so, else both entries' tools.
        trust[server.url] = frozenset() if held == frozenset() or not tools else (held or tools) | tools
    return trust


def trusts(trust: McpTrust, url: str, tool: str) -> bool:
    """Whether the policy believes ``tool``'s annotations on the server at ``url``."""
    tools = trust.get(url)
    return tools is not None and (not tools or tool in tools)


def highest(tiers: Iterable[ActionTier]) -> ActionTier:
    return max(tiers, key=lambda tier: _RANK[tier])


def mcp_call_tier(
    *,
    policy_tier: ActionTier | None,
    hinted: ActionTier,
    trusted: bool,
    recorded: ActionTier | None = None,
) -> ActionTier:
    """The tier of one MCP call: the policy's, else the hint of a trusted server, else
    consequential; never below ``recorded``, the tier fixed when the call was proposed."""
    if policy_tier is not None:
        tier = policy_tier
    elif trusted:
        tier = hinted
    else:
        tier = ActionTier.CONSEQUENTIAL
    return tier if recorded is None else highest((tier, recorded))


__all__ = ["McpTrust", "highest", "hinted_tier", "mcp_call_tier", "mcp_trust", "trusts"]


def trusted_idempotent(policy: AgentPolicySpec | None, url: str, tool: str) -> bool:
    """Whether ``policy`` trusts ``tool`` on the server at ``url`` as idempotent
    (``spec.mcp.idempotentTools``): by exact URL and tool name, each named; no policy, no trust.
    Only such a call, lost while held open, may be sent again under its key."""
    if policy is None or not url or not tool:
        return False
    return any(entry.url == url and tool in entry.tools for entry in policy.mcp.idempotent_tools)
