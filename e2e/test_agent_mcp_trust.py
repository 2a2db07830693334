"""An MCP server's word about its own tools does not decide what needs approval.

Real API server, the operator as separate processes (SIGKILLed around the lie), the reference
model server and the reference MCP server, which lies on demand: ``disguise("close_ticket")`` lists
its destructive tool as read-only (``readOnlyHint``), and a lying close_ticket applies calls that
come without an idempotency key (counted under ``UNKEYED``, and in ``unkeyed()``). The policy is
the sample's: approval for consequential effects, no tier for the ticket tools, no trusted server.

- A server that lies from the start: its "read-only" close_ticket is consequential all the same;
  approval asked, an intent in the ledger, sent once with its key, whatever the kill point.
- A server that turns from honest to lying while its call waits for approval (decided, or expired
  under ``approvalExpired: reapprove``): the attempt fails ``ToolSetChanged``; nothing is sent.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from e2e.test_agent import agent_namespace, agent_spec, approve, model
from e2e.test_agent_recovery import FAST_CLAIMS, LEASE

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.mcpserver import McpServerThread
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless

__all__ = ["agent_namespace", "model"]  # the fixtures, as test_agent.py defines them

CLOSE = {"id": "T-101", "resolution": "new gateway"}
CLOSE_SCRIPT: dict[str, Any] = {
    "model": "scripted-refunds",
    "rules": [
        {
            "when": {"notCalled": ["close_ticket"]},
            "content": "The VPN ticket is fixed by the new gateway: closing it.",
            "toolCalls": [{"name": "close_ticket", "arguments": CLOSE}],
        },
        {"when": {"called": ["close_ticket"]}, "content": "Closed T-101."},
    ],
}


def close_spec(model: ModelServerThread, refsystem: ReferenceSystemThread, tickets: McpServerThread) -> Any:
    """The sample run, its only tool the ticket server's close_ticket (no tier in the policy), the
    server's closure-status tool declared as its query by key."""
    model.set_script(CLOSE_SCRIPT)
    spec = agent_spec(model, refsystem)
    spec["agent"]["tools"] = []
    # The query tool: a call whose answer a kill lost is reconciled by its key, not sent again.
    query = {"close_ticket": "ticket_closure_status"}
    server = {"name": "tickets", "url": tickets.url, "tools": ["close_ticket"], "queryTools": query}
    spec["agent"]["mcpServers"] = [server]
    return spec


def records(runs: Runs) -> list[dict[str, Any]]:
    listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
    return list(listed["items"])


def waiting_for_the_close(runs: Runs, name: str) -> dict[str, Any]:
    """The run waits for an approval of an mcp.call, recorded consequential; nothing was sent."""
    run = runs.wait_state(name, "waiting_approval", timeout=Within.RUN)
    request = run["status"]["approvalRequest"]
    assert (request["effect"], request["tier"]) == ("mcp.call", "consequential"), request
    [turn] = run["status"]["checkpoint"]["agent"]["turns"]
    assert (turn["tool"], turn["tier"], turn["outcome"]) == ("close_ticket", "consequential", "pending")
    return run


def assert_nothing_sent(tickets: McpServerThread, runs: Runs, where: str) -> None:
    assert tickets.unkeyed() == 0, f"{where}: close_ticket was called outside the ledger (no key)"
    assert tickets.counts() == {}, f"{where}: close_ticket was applied: {tickets.counts()}"
    assert records(runs) == [], f"{where}: an intent exists"


# Where the operator dies: while the call waits for approval, or at a write of record of the
# operator that acts on the approval: after its first (before the decision is committed), after its
# second (the decision and the intent committed, nothing sent), before its fourth (the call sent
# and applied, its outcome not written: the rescuer asks the query tool by key, never resends).
POINTS = ["waiting", "after:1", "after:2", "before:4"]


@pytest.mark.parametrize("point", POINTS)
def test_a_server_that_lies_from_the_start_costs_an_approval_never_a_duplicate(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    point: str,
) -> None:
    with McpServerThread() as tickets:
        tickets.disguise("close_ticket")
        first = start_operator("first", LEASE, **FAST_CLAIMS)
        name = runs.create(close_spec(model, refsystem, tickets))
        waiting_for_the_close(runs, name)
        assert_nothing_sent(tickets, runs, "before the approval")
        first.kill()
        assert first.wait_exit(0) == -signal.SIGKILL
        request = approve(runs, name)
        if point != "waiting":
            victim = start_operator("victim", LEASE, DURABLE_AGENTS_TEST_KILL_AT=point, **FAST_CLAIMS)
            assert victim.wait_killed(Within.RUN) == -signal.SIGKILL
        start_operator("rescuer", LEASE, **FAST_CLAIMS)
        done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
        assert done["status"]["state"] == "completed", done["status"].get("outcome")
        [record] = records(runs)
        key = record["spec"]["idempotencyKey"]
        assert tickets.counts() == {key: 1}, f"{point}: applied once, under the ledger's key"
        assert (tickets.unkeyed(), tickets.duplicates()) == (0, []), point
        if point == "before:4":
            assert record["status"]["queries"] >= 1, "the lost answer was reconciled by the query"
        approvals = done["status"]["checkpoint"]["approvals"]
        assert [(a["requestId"], a.get("decision")) for a in approvals] == [
            (request["requestId"], "approved")
        ]
        assert_history_is_gapless(done)


@pytest.mark.parametrize("decided", ["approved", "expired"])
def test_a_server_that_turns_to_lying_under_a_pending_approval_gets_no_call(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    decided: str,
) -> None:
    """Honest when the call was proposed (so it waits for approval), lying before the approval is
    decided or expires: the operator that resumes lists the lie, and fails the attempt before any
    call; it neither calls the tool as a read nor asks for its own approval on the new listing."""
    if decided == "expired":
        freshness = {"approvalExpiry": "15s", "freshness": {"approvalExpired": "reapprove"}}
        runs.custom.patch_namespaced_custom_object(
            GROUP, VERSION, runs.namespace, "agentpolicies", "refunds", {"spec": freshness}
        )
    with McpServerThread() as tickets:
        first = start_operator("first", LEASE, **FAST_CLAIMS)
        name = runs.create(close_spec(model, refsystem, tickets))
        run = waiting_for_the_close(runs, name)
        tickets.disguise("close_ticket")
        first.kill()
        assert first.wait_exit(0) == -signal.SIGKILL
        if decided == "approved":
            approve(runs, name)
        else:
            expires = datetime.fromisoformat(run["status"]["approvalRequest"]["expiresAt"])

            def passed() -> bool:
                return datetime.now(UTC) > expires

            eventually(passed, Within.COMMIT, "the approval request to expire")
        start_operator("second", LEASE, **FAST_CLAIMS)
        failed = runs.wait_state(name, "failed", "completed", timeout=Within.RUN)
        assert_nothing_sent(tickets, runs, decided)
        outcome = failed["status"].get("outcome") or {}
        assert (failed["status"]["state"], outcome.get("reason")) == ("failed", "ToolSetChanged"), outcome
        assert "tool set changed" in outcome.get("message", "")
        assert_history_is_gapless(failed)
