"""The model planner on the operator's path: a run driven by the reference model server.

Real API server, the operator as a separate process (its own user, the chart's RBAC), the
reference model server and the reference authoritative system on loopback. The run's prompt is a
ConfigMap and its API key a Secret, both read as the run's ServiceAccount.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from e2e import test_reconcile
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.agent_facts import prompt_digest
from durable_agents.kubectl import reconcile as kubectl_reconcile
from durable_agents.shell.effects.mcp import NO_QUERY
from durable_agents_testkit.agent_sample import API_KEY, install_sample, sample_of, script
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.mcpserver import McpServerThread
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless

# Users who may (alice) and may not (bob) approve, and an operator with its webhook: as there.
people = test_reconcile.people


@pytest.fixture
def model() -> Iterator[ModelServerThread]:
    with ModelServerThread(script(), api_key=API_KEY) as server:
        yield server


@pytest.fixture
def agent_namespace(kube: KubeEnv, namespace: str) -> str:
    """The sample's prompt, key Secret, policy and RBAC (the run's account reads exactly those)."""
    install_sample(kube.api, namespace)
    return namespace


def agent_spec(
    model: ModelServerThread, refsystem: ReferenceSystemThread, protocol: str = "openai-chat"
) -> dict[str, Any]:
    spec: dict[str, Any] = sample_of("AgentRun")["spec"]
    spec["agent"]["endpoint"].update(baseUrl=model.base_url_for(protocol), protocol=protocol)
    for tool in spec["agent"]["tools"]:
        if "effect" in tool:
            tool["effect"]["target"] = {
                "url": f"{refsystem.url}/effects",
                "queryUrl": f"{refsystem.url}/effects",
            }
    return spec


def approve(runs: Runs, name: str, unsent: Callable[[], dict[str, int]] | None = None) -> dict[str, Any]:
    """Approve the request the run waits on; `unsent` is checked empty before the approval is
    written (after it, the operator may apply the effect before the test looks)."""
    run = runs.wait_state(name, "waiting_approval", timeout=60)
    request: dict[str, Any] = run["status"]["approvalRequest"]
    if unsent is not None:
        assert unsent() == {}, "nothing is sent before the approval"
    runs.patch_spec(
        name, {"approvals": {request["requestId"]: {"digest": request["digest"], "decision": "approve"}}}
    )
    return request


@pytest.mark.parametrize("protocol", ["openai-chat", "anthropic-messages"])
def test_a_model_driven_run_reads_proposes_waits_for_approval_and_acts_once(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    protocol: str,
) -> None:
    op = start_operator("agent")
    name = runs.create(agent_spec(model, refsystem, protocol))
    request = approve(runs, name, unsent=refsystem.counts)
    proposal = request["proposal"]
    assert (proposal["tool"], proposal["turn"]) == ("refund", 1), "the approver sees the model's call"
    assert "durable-agents.io/sealed" in proposal["reason"], "the model's words are sealed"
    done = runs.wait_state(name, "completed", timeout=90)
    assert list(refsystem.counts().values()) == [1], "the approved call is applied exactly once"
    facts = done["status"]["checkpoint"]["agent"]
    assert [t["tool"] for t in facts["turns"]] == ["read_limits", "refund"]
    assert facts["model"] == sample_of("AgentRun")["spec"]["agent"]["model"]
    assert facts["modelCallsTotal"] == 3
    # A unit of work the worker could not commit (its region or shard lost on a loaded machine)
    # is decided again: its model calls are repeated, never recorded twice (the recovery tests
    # bound the repeats).
    assert model.calls()["total"] >= 3
    assert set(model.calls()["byProtocol"]) == {protocol}, "every call spoke the endpoint's protocol"
    # The same identifiers are recorded whatever the protocol: the model, the prompt's and the
    # tool set's digests (the prompt the server received is the sample's, as the system prompt).
    system = model.calls()["requests"][0]["messages"][0]
    assert system["role"] == "system"
    assert "refund" in system["content"].lower()
    assert facts["promptDigest"] == prompt_digest(system["content"])
    assert facts["toolSetDigest"].startswith("sha256:")
    assert facts["usageTotal"]["inputTokens"] > 0
    assert request["requestId"] == "agent-1-1"  # step agent-1, attempt 1
    events = [h["event"] for h in assert_history_is_gapless(done)]
    assert events.count("approval_decided") == 1
    # The operator's status writes leave the status one field in managedFields (atomic), not a
    # field set as large as the status (tests/integration/test_crds_api.py).
    written = [m for m in done["metadata"]["managedFields"] if m.get("subresource") == "status"]
    assert [m["fieldsV1"] for m in written] == [{"f:status": {}}]
    assert not op.logged("Traceback")


TICKETS_SCRIPT: dict[str, Any] = {
    "model": "scripted-refunds",
    "rules": [
        {
            "when": {"notCalled": ["lookup_ticket"]},
            "content": "Let me look at the ticket.",
            "toolCalls": [{"name": "lookup_ticket", "arguments": {"id": "T-101"}}],
        },
        {
            "when": {
                "called": ["lookup_ticket"],
                "notCalled": ["close_ticket"],
                "lastToolResultContains": "VPN",
            },
            "content": "The ticket is about VPN drops, fixed by the new gateway: closing it.",
            "toolCalls": [
                {"name": "close_ticket", "arguments": {"id": "T-101", "resolution": "new gateway"}}
            ],
        },
        {"when": {"called": ["close_ticket"]}, "content": "Closed T-101."},
    ],
}


def mcp_spec(
    model: ModelServerThread, refsystem: ReferenceSystemThread, tickets: McpServerThread, **server: Any
) -> dict[str, Any]:
    model.set_script(TICKETS_SCRIPT)
    spec = agent_spec(model, refsystem)
    spec["agent"]["tools"] = []
    tools = ["lookup_ticket", "close_ticket"]
    spec["agent"]["mcpServers"] = [{"name": "tickets", "url": tickets.url, "tools": tools, **server}]
    return spec


def trust_lookups(runs: Runs, tickets: McpServerThread) -> None:
    """The sample policy trusts the ticket server's word that lookup_ticket is read-only (an
    untrusted server's tools are all consequential, see e2e/test_agent_mcp_trust.py)."""
    trusted = {"trustedServers": [{"url": tickets.url, "tools": ["lookup_ticket"]}]}
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "refunds", {"spec": {"mcp": trusted}}
    )


def test_mcp_tools_a_read_is_called_freely_a_consequential_call_is_approved_and_applied_once(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    with McpServerThread() as tickets:
        trust_lookups(runs, tickets)
        start_operator("agent-mcp")
        name = runs.create(mcp_spec(model, refsystem, tickets))
        request = approve(runs, name, unsent=tickets.counts)
        assert request["effect"] == "mcp.call"
        assert request["target"] == {"server": "tickets", "url": tickets.url, "tool": "close_ticket"}
        assert request["proposal"]["tool"] == "close_ticket"
        done = runs.wait_state(name, "completed", timeout=90)
        counts = tickets.counts()
        assert list(counts.values()) == [1], f"applied exactly once under one key: {counts}"
        (key,) = counts
        assert tickets.ticket("T-101")["status"] == "closed"
        facts = done["status"]["checkpoint"]["agent"]
        assert [(t["tool"], t["outcome"]) for t in facts["turns"]] == [
            ("lookup_ticket", "succeeded"),
            ("close_ticket", "succeeded"),
        ]
        # The model was told the read-only call's answer (the ticket's title), from the facts.
        asked = model.calls()["requests"]
        assert any("VPN drops hourly" in str(body) for body in asked)
        records = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
        assert [r["spec"]["idempotencyKey"] for r in records["items"]] == [key], "the ledger's key was sent"


def test_an_mcp_call_whose_answer_was_lost_is_reconciled_by_the_servers_query_tool(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    """The server applies the call and drops the connection: the outcome is unknown, the ledger
    asks the tool the server declared as its query by key, and does not send the call again."""
    with McpServerThread() as tickets:
        tickets.inject("drop_after_apply")
        trust_lookups(runs, tickets)
        start_operator("agent-mcp-query")
        spec = mcp_spec(model, refsystem, tickets, queryTools={"close_ticket": "ticket_closure_status"})
        name = runs.create(spec)
        approve(runs, name)
        runs.wait_state(name, "completed", timeout=90)
        assert list(tickets.counts().values()) == [1], (
            "applied once: the lost answer was not a reason to resend"
        )
        [record] = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")[
            "items"
        ]
        assert record["spec"]["target"]["queryTool"] == "ticket_closure_status"
        assert record["status"]["state"] == "succeeded"
        assert record["status"]["queries"] >= 1, "the outcome came from the query, not the dropped answer"


@pytest.mark.local_plane("users", "webhook")
def test_an_mcp_call_whose_answer_was_lost_waits_for_a_person_to_reconcile_it(
    kube: KubeEnv,
    webhook_operator: Callable[..., OperatorProcess],
    people: dict[str, client.ApiClient],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    """No query tool declared: MCP cannot be asked by key, so the action stays outcome_unknown
    (asked again, paced) until someone who may approve says what happened."""
    with McpServerThread() as tickets:
        tickets.inject("drop_after_apply")
        trust_lookups(runs, tickets)
        webhook_operator("agent-mcp-reconcile")
        name = runs.create(mcp_spec(model, refsystem, tickets))
        approve(runs, name)

        def unknown() -> dict[str, Any] | None:
            items = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
            status = (items["items"] or [{}])[0].get("status") or {}
            stuck = status.get("state") == "outcome_unknown" and status.get("queries", 0) >= 1
            return items["items"][0] if stuck else None

        record = eventually(unknown, Within.RUN, "the MCP call's outcome to stay unknown, queried")
        assert record["status"]["reason"] == NO_QUERY
        assert list(tickets.counts().values()) == [1], "applied once; the answer was lost"
        assert runs.state(name) == "waiting_external", "the run waits for its action"
        action = record["metadata"]["name"]
        with pytest.raises(kubectl_reconcile.ReconcileError) as refused:
            kubectl_reconcile.reconcile(
                client.CustomObjectsApi(people["bob"]), runs.namespace, name, action, True
            )
        assert "missing RBAC permission verb 'approve' on resource 'agentruns'" in str(refused.value)
        said = kubectl_reconcile.reconcile(
            client.CustomObjectsApi(people["alice"]),
            runs.namespace,
            name,
            action,
            True,
            "ticket shows closed",
        )
        assert f"action {action} attempt 1 reconciled as applied" in said
        runs.wait_state(name, "completed", timeout=Within.RUN)
        assert list(tickets.counts().values()) == [1], "reconciled as applied: never sent again"
