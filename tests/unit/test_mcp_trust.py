"""The MCP trust rules: a server's hints are claims, believed only where the policy trusts that
server for that tool; a call's tier, once recorded, is never lowered."""

from __future__ import annotations

import pytest

from durable_agents.api.v1alpha1 import ActionTier, AgentPolicySpec
from durable_agents.core.agent.mcp_trust import hinted_tier, mcp_call_tier, mcp_trust, trusts

pytestmark = pytest.mark.unit

READ_ONLY, REVERSIBLE, CONSEQUENTIAL = ActionTier.READ_ONLY, ActionTier.REVERSIBLE, ActionTier.CONSEQUENTIAL
URL = "http://tickets.tools.svc/mcp"


def test_hints_claim_read_only_reversible_or_consequential() -> None:
    assert hinted_tier(read_only=True, destructive=True) is READ_ONLY
    assert hinted_tier(read_only=False, destructive=False) is REVERSIBLE
    assert hinted_tier(read_only=False, destructive=True) is CONSEQUENTIAL


@pytest.mark.parametrize("hinted", [READ_ONLY, REVERSIBLE, CONSEQUENTIAL])
def test_an_untrusted_servers_hint_never_lowers_a_tool_below_consequential(hinted: ActionTier) -> None:
    assert mcp_call_tier(policy_tier=None, hinted=hinted, trusted=False) is CONSEQUENTIAL


@pytest.mark.parametrize("hinted", [READ_ONLY, REVERSIBLE, CONSEQUENTIAL])
def test_a_trusted_servers_hint_decides(hinted: ActionTier) -> None:
    assert mcp_call_tier(policy_tier=None, hinted=hinted, trusted=True) is hinted


@pytest.mark.parametrize("trusted", [True, False])
def test_the_policys_tier_for_the_tool_decides_over_any_hint(trusted: bool) -> None:
    assert mcp_call_tier(policy_tier=READ_ONLY, hinted=CONSEQUENTIAL, trusted=trusted) is READ_ONLY
    assert mcp_call_tier(policy_tier=CONSEQUENTIAL, hinted=READ_ONLY, trusted=trusted) is CONSEQUENTIAL


@pytest.mark.parametrize("now", [READ_ONLY, REVERSIBLE, CONSEQUENTIAL])
def test_a_recorded_tier_is_never_lowered_only_raised(now: ActionTier) -> None:
    """Whatever a later listing or policy says, a proposal recorded consequential stays so."""
    assert (
        mcp_call_tier(policy_tier=now, hinted=READ_ONLY, trusted=True, recorded=CONSEQUENTIAL)
        is CONSEQUENTIAL
    )
    assert mcp_call_tier(policy_tier=now, hinted=READ_ONLY, trusted=True, recorded=READ_ONLY) is now


def test_trust_is_by_the_url_the_call_goes_to_and_by_tool() -> None:
    policy = AgentPolicySpec.model_validate(
        {
            "version": "v1",
            "mcp": {
                "trustedServers": [
                    {"url": URL, "tools": ["lookup_ticket"]},
                    {"url": "http://search/mcp"},
                ]
            },
        }
    )
    trust = mcp_trust(policy)
    assert trusts(trust, URL, "lookup_ticket")
    assert not trusts(trust, URL, "close_ticket"), "only the tools listed"
    assert trusts(trust, "http://search/mcp", "anything"), "no tools listed: every tool"
    assert not trusts(trust, "http://evil/mcp", "lookup_ticket"), "another URL is another server"


def test_nothing_is_trusted_by_default() -> None:
    assert mcp_trust(None) == {}
    assert mcp_trust(AgentPolicySpec.model_validate({"version": "v1"})) == {}


def test_a_server_listed_twice_is_trusted_for_both_entries_tools() -> None:
    twice = {"trustedServers": [{"url": URL, "tools": ["a"]}, {"url": URL, "tools": ["b"]}]}
    trust = mcp_trust(AgentPolicySpec.model_validate({"version": "v1", "mcp": twice}))
    assert (trusts(trust, URL, "a"), trusts(trust, URL, "b"), trusts(trust, URL, "c")) == (True, True, False)
    every = {"trustedServers": [{"url": URL, "tools": ["a"]}, {"url": URL}]}
    assert trusts(mcp_trust(AgentPolicySpec.model_validate({"version": "v1", "mcp": every})), URL, "c")
