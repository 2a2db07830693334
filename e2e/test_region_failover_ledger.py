"""Region failover with the ledger: region A dies holding a run of each hard kind, B takes them on.

One operator serves region A, one serves region B (and the admission webhook). A dies (SIGKILL)
holding: (a) a payment in flight (sent, the reference system holding its answer; its first claim
not expired), (b) a payment whose outcome is unknown (its answer dropped, and the query that would
settle it unanswered), (c) a payment waiting for an approval, (d) a parent waiting on its child,
which waits for an answer. `kubectl agentrun region failover A --to B` verifies each as
docs/operate/regions.md promises: (a) is not adopted while its claim holds (listed: in flight,
claimed by A, until when); (b) is asked about once more, stays unknown, is adopted and listed; (c)
and (d) (parent and child) are adopted. Then what a person does: the query path answers again and
`kubectl agentrun reconcile` asks now; the approver approves; the child's question is answered;
after (a)'s claim expires, a second failover reconciles it by query and adopts it. Every run
completes in B, each payment applied exactly once at the reference system.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.engine import child_run_name
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.cutproxy import CutProxy
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, group, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless
from durable_agents_testkit.scrape import free_port

pytestmark = pytest.mark.local_plane("users", "webhook")

LEASE = 2
A, B = "ledger-a", "ledger-b"  # regions of this test only (other tests' regions stay out of it)
# A's dispatch timeout: its claims last 2 x 30 + 1 s, long enough for the first failover to meet
# (a) in flight however loaded the machine; the reference system holds (a)'s answer far longer.
A_DISPATCH_TIMEOUT = 30
HELD = 600.0
PLUGIN = [sys.executable, "-m", "durable_agents.kubectl.main"]
DONE = {"name": "done", "complete": {"result": "ok"}}


def payment(url: str, query_url: str, amount: int, policy: str | None = None) -> dict[str, Any]:
    pay = {
        "name": "pay",
        "effect": {
            "effect": "http.post",
            "target": {"url": f"{url}/effects", "queryUrl": f"{query_url}/effects"},
            "arguments": {"amount": amount},
        },
    }
    spec: dict[str, Any] = {
        "taskType": "payment",
        "objective": "pay once, whichever region finishes it",
        "region": A,
        "steps": [pay, DONE],
    }
    if policy:
        spec["policyRef"] = {"name": policy}
    return spec


def approvals_policy(runs: Runs) -> None:
    spec = {
        "version": "v1",
        "tiers": {"http.post": "consequential"},
        "approvalRequiredTiers": ["consequential"],
        "approvers": {"verb": "approve", "resource": "agentruns"},
        "approvalExpiry": "1h",
    }
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "payments"},
        "spec": spec,
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)


def key_of(runs: Runs, name: str) -> str:
    return idempotency_key(runs.get(name)["metadata"]["uid"], 0, "pay")


def record(runs: Runs, key: str) -> dict[str, Any]:
    out: dict[str, Any] = runs.custom.get_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "actionrecords", action_record_name(key)
    )
    return out


def record_state(runs: Runs, key: str) -> str | None:
    try:
        return str((record(runs, key).get("status") or {}).get("state") or "intent")
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def asked_in_vain(runs: Runs, key: str) -> bool:
    """The record's outcome is unknown and the system was asked about it, without an answer."""
    if record_state(runs, key) != "outcome_unknown":
        return False
    return bool((record(runs, key).get("status") or {}).get("queries", 0) >= 1)


def plugin(kube: KubeEnv, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    return subprocess.run([*PLUGIN, *args], env=env, capture_output=True, text=True, timeout=240)


def failover(
    kube: KubeEnv, runs: Runs, reason: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`kubectl agentrun region failover A --to B --wait`, and the RegionFailover it made."""
    before = {f["metadata"]["name"] for f in failovers(runs)}
    out = plugin(kube, "region", "failover", A, "--to", B, "--reason", reason, "--wait", "--timeout", "180")
    (made,) = [f for f in failovers(runs) if f["metadata"]["name"] not in before]
    return out, made


def failovers(runs: Runs) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = runs.custom.list_cluster_custom_object(GROUP, VERSION, "regionfailovers")[
        "items"
    ]
    return [f for f in items if f["spec"]["from"] == A]


def ours(entries: list[dict[str, Any]], runs: Runs, field: str = "name") -> list[str]:
    return sorted(e[field] for e in entries or [] if e["namespace"] == runs.namespace)


def test_failover_meets_the_ledger_in_flight_unknown_approval_and_child_and_completes_once(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    ns = runs.namespace
    approvals_policy(runs)
    # The runs' ServiceAccount starts the child run (made AS that account).
    children = [rule(GROUP, "agentruns", "get", "create", "patch"), rule("", "serviceaccounts", "use")]
    grant(kube, ns, service_account("default", ns), children, name="start-children")
    approver = [rule(GROUP, "agentruns", "get", "list", "patch", "approve")]
    grant(kube, ns, group("approvers"), approver, name="agentrun-approver")
    alice = client.CustomObjectsApi(kube.user_client("alice", ["approvers"]))

    # B serves the admission webhook (every write below passes through it); A does the work.
    b = start_operator("b0", LEASE, DURABLE_AGENTS_REGION=B, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    runs.await_webhook(Within.TAKEOVER)
    a = start_operator(
        "a0", LEASE, DURABLE_AGENTS_REGION=A, DURABLE_AGENTS_DISPATCH_TIMEOUT=str(A_DISPATCH_TIMEOUT)
    )

    # (b)'s queries go through a proxy that is cut: its outcome stays unknown until it is restored.
    with CutProxy(refsystem.port) as queries:
        queries.cut()
        # (b) makes the first send of the test: it meets the dropped answer (applied, no reply).
        refsystem.inject("drop_after_apply")
        unknown = runs.create(payment(refsystem.url, f"http://127.0.0.1:{queries.port}", 2), "unknown")
        unknown_key = key_of(runs, unknown)
        approval = runs.create(payment(refsystem.url, refsystem.url, 3, policy="payments"), "approval")
        ask = {"name": "ask", "ask": {"question": "which one?"}}
        sub = {"name": "sub", "child": {"taskType": "sub", "objective": "o", "steps": [ask, DONE]}}
        # A second child, started only after the parent's adoption: by B, so it is B's.
        later = {"name": "later", "child": {"taskType": "sub", "objective": "o", "steps": [DONE]}}
        parent = runs.create(
            {"taskType": "t", "objective": "o", "region": A, "steps": [sub, later, DONE]}, "parent"
        )
        child = child_run_name(parent, "sub")

        eventually(
            lambda: asked_in_vain(runs, unknown_key),
            Within.RUN,
            "(b)'s outcome to be unknown, and A's query about it unanswered",
        )
        runs.wait_state(approval, "waiting_approval", timeout=Within.RUN)
        runs.wait_state(parent, "waiting_external", timeout=Within.RUN)
        runs.wait_state(child, "waiting_input", timeout=Within.RUN)
        # The child is its parent's region's, whichever deployment's webhook admitted it.
        assert runs.get(child)["spec"]["region"] == A

        # (a) last, so that its claim is young: sent, applied, its answer held by the system.
        # The next send is (a)'s (nothing else sends before the approval): its answer is held.
        refsystem.inject("slow", delay=HELD)
        in_flight = runs.create(payment(refsystem.url, refsystem.url, 1), "in-flight")
        in_flight_key = key_of(runs, in_flight)
        eventually(lambda: refsystem.applied(in_flight_key) == 1, Within.COMMIT, "(a) to reach the system")
        a.kill()  # region A is gone, holding all of them
        claim = record(runs, in_flight_key)
        claimed_until = datetime.fromisoformat(
            claim["spec"]["firstClaim"]["expiresAt"].replace("Z", "+00:00")
        )
        assert record_state(runs, in_flight_key) == "intent"  # sent under A's first claim, no answer
        assert refsystem.counts() == {in_flight_key: 1, unknown_key: 1}

        # --- the first failover: everything but the action in flight ----------------------------
        out, first = failover(kube, runs, "region A is gone")
        assert datetime.now(UTC) < claimed_until, "the failover ran while (a)'s claim held"
        assert out.returncode == 2, f"some runs stay with A: exit 2\n{out.stdout}\n{out.stderr}"
        status = first["status"]
        assert status["phase"] == "Completed", status
        assert ours(status["adopted"], runs) == sorted([unknown, approval, parent, child]), status
        ((left, why),) = [(r["name"], r["reason"]) for r in status["notAdopted"] if r["namespace"] == ns]
        assert left == in_flight, status
        assert f"action {action_record_name(in_flight_key)} is in flight: claimed by {a.identity}" in why
        assert ours(status.get("unknownOutcomes") or [], runs, "action") == [action_record_name(unknown_key)]
        assert "Unknown outcomes (1)" in out.stdout, out.stdout
        assert action_record_name(unknown_key) in out.stdout, out.stdout
        assert "Not adopted (1)" in out.stdout, out.stdout
        assert "is in flight" in out.stdout, out.stdout
        # Nothing was sent again while verifying; (a) stays A's, untouched.
        assert refsystem.counts() == {in_flight_key: 1, unknown_key: 1}
        assert record_state(runs, unknown_key) == "outcome_unknown"
        assert (runs.get(in_flight)["status"].get("ownership") or {}).get("region") != B

        # --- what a person does: (b) asked again once the system answers --------------------------
        queries.restore()
        asked = plugin(kube, "reconcile", unknown, "-n", ns, "--wait", "60s")
        assert asked.returncode == 0, f"{asked.stdout}\n{asked.stderr}"
        # (c) approved; (d)'s child answered: B finishes all three.
        request = runs.get(approval)["status"]["approvalRequest"]
        decision = {"digest": request["digest"], "decision": "approve"}
        alice.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            ns,
            "agentruns",
            approval,
            {"spec": {"approvals": {request["requestId"]: decision}}},
        )
        runs.patch_spec(child, {"answers": {"ask": "this one"}})
        for name in (unknown, approval, child, parent):
            done = runs.wait_state(name, "completed", timeout=Within.RUN)
            adopted_by_b(done, first["metadata"]["name"], b)
        # The child the adopted parent started in B is B's from its creation: no failover moved it.
        born_in_b = runs.get(child_run_name(parent, "later"))
        assert born_in_b["spec"]["region"] == B
        assert born_in_b["status"]["state"] == "completed"
        assert {h["holder"] for h in assert_history_is_gapless(born_in_b)} == {b.identity}
        assert not (born_in_b["status"].get("ownership") or {}).get("adoptedFrom")

    settled = record(runs, unknown_key)["status"]
    assert settled["state"] == "succeeded", settled
    assert settled["queries"] >= 2, settled  # A's, the failover's, then the answer: never sent again
    assert settled["attempts"] == 1, settled
    approval_key = key_of(runs, approval)

    # --- (a), once its claim has expired: reconciled by query first, then adopted -----------------
    eventually(
        lambda: datetime.now(UTC) > claimed_until,
        Within.TAKEOVER + A_DISPATCH_TIMEOUT * 2,
        "(a)'s claim to expire",
    )
    out, second = failover(kube, runs, "region A is still gone; (a)'s claim expired")
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    status = second["status"]
    assert ours(status["adopted"], runs) == [in_flight], status
    assert not [r for r in status.get("notAdopted") or [] if r["namespace"] == ns], status
    assert not ours(status.get("unknownOutcomes") or [], runs, "action"), status
    done = runs.wait_state(in_flight, "completed", timeout=Within.RUN)
    adopted_by_b(done, second["metadata"]["name"], b)
    settled = record(runs, in_flight_key)["status"]
    # Applied by A's one send; the system was asked, never sent to again.
    assert settled["state"] == "succeeded", settled
    assert settled["queries"] >= 1, settled
    assert settled["attempts"] == 1, settled

    counts = refsystem.counts()
    assert counts == {in_flight_key: 1, unknown_key: 1, approval_key: 1}, counts
    assert refsystem.duplicates() == []


def adopted_by_b(done: dict[str, Any], failover_name: str, b: OperatorProcess) -> None:
    """The run was adopted by this failover, and B did all it did after its adoption."""
    name = done["metadata"]["name"]
    ownership = done["status"]["ownership"]
    assert (ownership["region"], ownership["adoptedFrom"], ownership["failover"]) == (B, A, failover_name)
    holders = [h["holder"] for h in assert_history_is_gapless(done)]
    first_b = holders.index(b.identity)
    assert set(holders[first_b:]) == {b.identity}, (name, holders)
