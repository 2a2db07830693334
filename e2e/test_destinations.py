"""Issue 32, item 7: where effects may go. A policy's ``spec.destinations`` lists the URL prefixes
its runs' effects, MCP servers and model endpoints may name.

Real API server, the operator as a separate process, the reference system, model server and MCP
server, each counting what reaches it. Every destination refused here is REACHABLE (the counting
server listens there), so a send that slipped through would be counted:

- webhook on: a run naming an effect URL, an MCP server or a model endpoint outside the list is
  refused at admission naming the field; so are a URL with userinfo and a policy entry that does
  not parse; a URL that differs from an allowed one only by case, default port and dot segments
  is admitted (dry run).
- webhook off, the same runs created stamped as the webhook would (forged past admission): the
  dispatcher refuses the effect (its ActionRecord fails ``DestinationNotAllowed``) and the worker
  refuses the model planner's endpoint and MCP server before any listing or call; each server
  counts 0.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from e2e.test_agent import agent_namespace, agent_spec, model
from e2e.test_agent_recovery import FAST_CLAIMS, LEASE
from e2e.test_authority import webhook_off
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within
from durable_agents_testkit.mcpserver import McpServerThread
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

__all__ = ["agent_namespace", "model"]  # the fixtures, as test_agent.py defines them

POLICY = "narrow"


@pytest.fixture
def tickets() -> Iterator[McpServerThread]:
    with McpServerThread() as server:
        yield server


def policy_body(destinations: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": POLICY},
        # No approval: an allowed effect would be sent at once, so a refusal is what stops it.
        "spec": {"version": "1", "approvalRequiredTiers": [], "destinations": destinations},
    }


def narrow(
    refsystem: ReferenceSystemThread, model: ModelServerThread, tickets: McpServerThread
) -> dict[str, Any]:
    """Allowed: the reference system's /allowed, the MCP server's /other path, the model server as
    127.0.0.1. Each run below names a reachable neighbour of these."""
    return {
        "effects": {"http.post": [f"{refsystem.url}/allowed"]},
        "mcpServers": [tickets.url.rsplit("/", 1)[0] + "/other"],
        "modelEndpoints": [model.base_url],
    }


def effect_run(refsystem: ReferenceSystemThread) -> dict[str, Any]:
    pay = {"effect": "http.post", "target": {"url": f"{refsystem.url}/effects"}, "arguments": {"n": 1}}
    return {
        "taskType": "e2e",
        "objective": "pay outside the allowlist",
        "policyRef": {"name": POLICY},
        "steps": [{"name": "pay", "effect": pay}, {"name": "done", "complete": {}}],
    }


def model_run(model: ModelServerThread, refsystem: ReferenceSystemThread, base_url: str) -> dict[str, Any]:
    spec = agent_spec(model, refsystem)
    spec["policyRef"] = {"name": POLICY}
    spec["agent"]["tools"] = [t for t in spec["agent"]["tools"] if "effect" not in t]
    spec["agent"]["endpoint"]["baseUrl"] = base_url
    return spec


def runs_outside(
    refsystem: ReferenceSystemThread, model: ModelServerThread, tickets: McpServerThread
) -> dict[str, tuple[dict[str, Any], str]]:
    """Each run naming one reachable destination outside the list, and the field a refusal names."""
    mcp = model_run(model, refsystem, model.base_url)
    mcp["agent"]["mcpServers"] = [{"name": "tickets", "url": tickets.url}]
    # localhost is another host than the allowed 127.0.0.1, though it reaches the same server.
    elsewhere = model.base_url.replace("127.0.0.1", "localhost")
    return {
        "effect": (effect_run(refsystem), "spec.steps[0].effect.target.url"),
        "mcp": (mcp, "spec.agent.mcpServers[0].url"),
        "model": (model_run(model, refsystem, elsewhere), "spec.agent.endpoint.baseUrl"),
    }


def create_policy(custom: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", body)


def refused(create: Callable[[], Any]) -> str:
    """The API server's refusal of ``create`` (the webhook's message)."""
    with pytest.raises(client.ApiException) as caught:
        create()
    assert caught.value.status in (403, 422), caught.value.body
    return str(caught.value.body)


def assert_nothing_sent(
    refsystem: ReferenceSystemThread, model: ModelServerThread, tickets: McpServerThread
) -> None:
    assert refsystem.counts() == {}, f"an effect reached the reference system: {refsystem.counts()}"
    assert model.calls()["total"] == 0, f"the model server was called: {model.calls()}"
    assert tickets.http_requests() == 0, "the MCP server was contacted"


@pytest.mark.local_plane("webhook")
def test_destinations_outside_the_allowlist_are_refused_at_admission_with_the_field(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    tickets: McpServerThread,
) -> None:
    start_operator("webhook", LEASE, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    runs.await_webhook()
    custom = runs.custom
    # An allowlist entry that does not parse: refused naming the entry.
    bad = policy_body({"effects": {"http.post": ["https://ok.example/"]}, "mcpServers": ["http://[::1/mcp"]})
    message = refused(lambda: create_policy(custom, agent_namespace, bad))
    assert "spec.destinations.mcpServers[0]" in message, message
    create_policy(custom, agent_namespace, policy_body(narrow(refsystem, model, tickets)))

    for kind, (spec, field) in runs_outside(refsystem, model, tickets).items():
        message = refused(
            lambda spec=spec, kind=kind: runs.create(spec, name=f"outside-{kind}", stamped=False)
        )
        assert field in message, (kind, message)
        assert "is not in AgentPolicy" in message, (kind, message)
        assert "spec.destinations" in message, (kind, message)

    # Userinfo in front of an allowed host: refused, naming what is wrong.
    spec = effect_run(refsystem)
    host = refsystem.url.split("://", 1)[1]
    spec["steps"][0]["effect"]["target"]["url"] = f"http://{host}@127.0.0.2:1/allowed"
    message = refused(lambda: runs.create(spec, name="userinfo", stamped=False))
    assert "spec.steps[0].effect.target.url" in message, message
    assert "userinfo" in message, message

    # The allowed prefix spelled otherwise (case, dot segments, a query): one destination, admitted.
    spec = effect_run(refsystem)
    spelled = refsystem.url.replace("http://", "HTTP://") + "/allowed/./pay/../pay?x=1"
    spec["steps"][0]["effect"]["target"]["url"] = spelled
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": "spelled"},
        "spec": spec,
    }
    made = custom.create_namespaced_custom_object(
        GROUP, VERSION, agent_namespace, "agentruns", body, dry_run="All"
    )
    assert made["spec"]["createdBy"]["stamp"], "admitted and stamped"
    assert_nothing_sent(refsystem, model, tickets)


@pytest.mark.local_plane("webhook")
def test_destinations_forged_past_admission_are_never_sent(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    tickets: McpServerThread,
) -> None:
    op = start_operator("webhook", LEASE, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    runs.await_webhook()
    create_policy(runs.custom, agent_namespace, policy_body(narrow(refsystem, model, tickets)))
    webhook_off(kube, runs, op)
    start_operator("no-webhook", LEASE)
    outside = runs_outside(refsystem, model, tickets)
    for kind, (spec, _) in outside.items():
        runs.create(spec, name=f"forged-{kind}")  # stamped as the webhook would have: past admission
    for kind, (_, field) in outside.items():
        done = runs.wait_state(f"forged-{kind}", "failed", "completed", timeout=Within.RUN)
        outcome = done["status"]["outcome"]
        assert done["status"]["state"] == "failed", (kind, outcome)
        assert field in outcome["message"], (kind, outcome)
        assert "not in AgentPolicy" in outcome["message"], (kind, outcome)
    # The engine refused the effect before its intent: nothing to approve, dispatch or reconcile.
    effect = runs.get("forged-effect")["status"]["outcome"]
    assert effect["reason"] == "DestinationNotAllowed", effect
    listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, agent_namespace, "actionrecords")
    assert listed["items"] == [], "an intent was committed"
    assert_nothing_sent(refsystem, model, tickets)


@pytest.mark.parametrize("point", ["waiting", "after:2"])
def test_a_policy_narrowed_under_a_live_run_stops_its_send(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    namespace: str,
    refsystem: ReferenceSystemThread,
    point: str,
) -> None:
    """Admitted under a list that allowed its effect; the policy narrows (a new version):

    - ``waiting``: while the run waits for approval; once approved, the engine refuses the effect
      before any intent (or, its cache not yet updated, the dispatcher refuses the intent);
    - ``after:2``: after the approved intent is committed, before it is sent (the operator acting
      on the approval dies right after the intent's write); the next operator's dispatcher reads
      the narrowed policy and fails the record ``DestinationNotAllowed``.

    Either way 0 sent."""
    wide = policy_body({"effects": {"http.post": [f"{refsystem.url}/"]}})
    wide["spec"].update(
        approvalRequiredTiers=["consequential"], tiers={"http.post": "consequential"}, version="wide"
    )
    wide["spec"]["freshness"] = {"policyChanged": "immaterial"}  # the approval still binds
    create_policy(runs.custom, namespace, wide)
    first = start_operator("first", LEASE, **FAST_CLAIMS)
    name = runs.create(effect_run(refsystem))
    request = runs.wait_state(name, "waiting_approval", timeout=Within.RUN)["status"]["approvalRequest"]
    if point != "waiting":
        first.kill()
        assert first.wait_exit(0) == -signal.SIGKILL
    approve = {"approvals": {request["requestId"]: {"digest": request["digest"], "decision": "approve"}}}
    if point != "waiting":
        runs.patch_spec(name, approve)
        victim = start_operator("victim", LEASE, DURABLE_AGENTS_TEST_KILL_AT=point, **FAST_CLAIMS)
        assert victim.wait_killed(Within.RUN) == -signal.SIGKILL
        pending = runs.get(name)["status"]["checkpoint"]["pendingActions"]
        assert [p["effect"] for p in pending] == ["http.post"], "the approved intent is committed"
        assert refsystem.counts() == {}, "sent before the policy narrowed"
    # a merge patch, as kubectl apply sends: no resourceVersion the operator's writes could move
    narrowed = {
        "spec": {
            "version": "narrow",
            "destinations": {"effects": {"http.post": [f"{refsystem.url}/allowed"]}},
        }
    }
    runs.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", POLICY, narrowed)
    if point == "waiting":
        runs.patch_spec(name, approve)
    else:
        start_operator("rescuer", LEASE, **FAST_CLAIMS)
    done = runs.wait_state(name, "failed", "completed", timeout=Within.RUN)
    assert done["status"]["state"] == "failed", done["status"].get("outcome")
    if point == "waiting":
        # The engine refuses before an intent once its policy cache has the new version; an approval
        # acted on before the watch delivered it commits the intent, and the dispatcher (which reads
        # the policy fresh) refuses it: either way, named, and nothing sent.
        outcome = done["status"]["outcome"]
        assert "DestinationNotAllowed" in f"{outcome['reason']} {outcome['message']}", outcome
    else:
        [record] = records_of(runs, namespace)
        status = record["status"]
        assert (status["state"], status["reason"]) == ("failed", "DestinationNotAllowed"), status
        assert "ActionRecord spec.target.url" in status["message"], status
        assert "spec.destinations.effects['http.post']" in status["message"], status
    assert refsystem.counts() == {}, "the effect reached the reference system"


def records_of(runs: Runs, namespace: str) -> list[dict[str, Any]]:
    listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "actionrecords")
    return list(listed["items"])
