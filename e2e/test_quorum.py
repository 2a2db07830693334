"""Quorum approvals: a policy asks for N distinct approvers; one rejection decides.

Real users (client certificates; approvers bound by name, so the stuck check can count them), the
operator's admission webhook in front of every AgentRun write, the reference system counting what
is applied. With the webhook off, decisions written straight into the spec (stamped for one person
under several keys, by the creator under four-eyes, forged, or not stamped) must not reach the
quorum: the operator's second line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION, Identity
from durable_agents.core.request_stamps import stamps
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import TEST_KIT_USER, session_keyring
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless

LEASE = 2
FORGED_STAMP = "test-key-1:" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="
pytestmark = pytest.mark.local_plane("users", "webhook")
APPROVER = [
    rule(GROUP, "agentruns", "get", "list", "patch", "approve"),
    rule(GROUP, "agentpolicies", "use"),
]


@pytest.fixture
def people(kube: KubeEnv, namespace: str) -> dict[str, client.ApiClient]:
    """alice and carol may approve (each bound by name); bob may patch runs but not approve."""
    for who in ("alice", "carol"):
        grant(kube, namespace, who, APPROVER, name=f"approver-{who}")
    grant(kube, namespace, "bob", rule(GROUP, "agentruns", "get", "patch"), name="editor-bob")
    return {who: kube.user_client(who, []) for who in ("alice", "carol", "bob", "dave")}


def policy(runs: Runs, quorum: int, *, four_eyes: bool = False) -> None:
    spec = {
        "version": "v1",
        "tiers": {"http.post": "consequential"},
        "approvalRequiredTiers": ["consequential"],
        "approvalExpiry": "1h",
        "allowedDecisions": ["approve", "reject"],
        "approvers": {"quorumByTier": {"consequential": quorum}, "fourEyes": four_eyes},
    }
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentPolicy", "metadata": {"name": "payments"}}
    runs.custom.create_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", {**body, "spec": spec}
    )


def payment(url: str) -> dict[str, Any]:
    return {
        "taskType": "payment",
        "objective": "pay the invoice",
        "policyRef": {"name": "payments"},
        "steps": [
            {
                "name": "pay",
                "effect": {
                    "effect": "http.post",
                    "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
                    "arguments": {"amount": 120, "currency": "EUR"},
                },
            },
            {"name": "done", "complete": {"result": "paid"}},
        ],
    }


def decide(
    api: client.ApiClient,
    runs: Runs,
    name: str,
    key: str,
    digest: str,
    decision: str = "approve",
    **extra: Any,
) -> dict[str, Any]:
    patch = {"spec": {"approvals": {key: {"digest": digest, "decision": decision, **extra}}}}
    out: dict[str, Any] = client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentruns", name, patch
    )
    return out


def refused(api: client.ApiClient, runs: Runs, name: str, key: str, digest: str, **extra: Any) -> str:
    """The refusal's message (the webhook's or the schema's); fails if the decision was taken."""
    with pytest.raises(client.ApiException) as err:
        decide(api, runs, name, key, digest, **extra)
    assert err.value.status in (403, 422), err.value.body
    body = err.value.body
    return str(json.loads(body).get("message", body) if isinstance(body, str) else body)


def pending(runs: Runs, name: str) -> dict[str, Any]:
    request: dict[str, Any] = runs.wait_state(name, "waiting_approval", timeout=60)["status"][
        "approvalRequest"
    ]
    return request


def shown(runs: Runs, name: str) -> list[tuple[str, str]]:
    request = runs.get(name)["status"].get("approvalRequest") or {}
    return [(vote["approver"], vote["key"]) for vote in request.get("approvedBy") or []]


def test_two_distinct_approvers_are_needed_and_the_action_is_applied_once(
    plane: LocalControlPlane,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs, 2)
    webhook_operator()
    name = runs.create(payment(refsystem.url))
    request = pending(runs, name)
    digest = request["digest"]
    assert (request["quorum"], request.get("approvedBy", [])) == (2, [])

    # Bad input, refused with a clear message before anything is decided.
    upper = "sha256:" + digest.removeprefix("sha256:").upper()
    assert "sha256:[0-9a-f]{64}" in refused(people["alice"], runs, name, "pay-1", upper)
    assert "sha256:[0-9a-f]{64}" in refused(people["alice"], runs, name, "pay-1", digest[:-1])
    message = refused(people["alice"], runs, name, "pay-1", digest, reason="fine\x1b[2J")
    assert "spec.approvals.pay-1.reason" in message
    assert "1024" in refused(people["alice"], runs, name, "pay-1", digest, reason="x" * 1025)
    assert "unknown approval request 'pay-7'" in refused(people["alice"], runs, name, "pay-7", digest)
    assert "missing RBAC permission verb 'approve'" in refused(people["bob"], runs, name, "pay-1", digest)

    decide(people["alice"], runs, name, "pay-1", digest, reason="checked the invoice\n\tand the amount")
    eventually(lambda: shown(runs, name) == [("alice", "pay-1")], Within.COMMIT, "alice's approval shown")
    run = runs.get(name)
    assert run["status"]["state"] == "waiting_approval", "one approval of two: still waiting"
    assert refsystem.counts() == {}, "nothing applied before the quorum"
    alice = plane.write_user_kubeconfig("alice", [])
    status = subprocess.run(
        [sys.executable, "-m", "durable_agents.kubectl.main", "status", name, "-n", runs.namespace],
        env={**os.environ, "KUBECONFIG": str(alice)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "  approvals:   1 of 2 (alice); missing 1" in status.stdout, status.stdout

    # The same person again, under the next key: refused naming the earlier one.
    message = refused(people["alice"], runs, name, "pay-1.2", digest)
    assert "'alice' already decided approval request 'pay-1' (under 'pay-1')" in message
    # An existing key is never overwritten (append-only), whoever tries.
    message = refused(people["carol"], runs, name, "pay-1", digest, decision="reject")
    assert "cannot be changed or withdrawn once given" in message

    decide(people["carol"], runs, name, "pay-1.2", digest)
    done = runs.wait_state(name, "completed", timeout=60)
    assert list(refsystem.counts().values()) == [1], "applied exactly once"
    assert refsystem.duplicates() == []
    record = done["status"]["checkpoint"]["approvals"][0]
    assert (record["decision"], record["decidedBy"], record["approvedBy"]) == (
        "approved",
        "carol",
        ["alice", "carol"],
    )
    events = [h["event"] for h in assert_history_is_gapless(done)]
    assert events.count("approval_decided") == 1
    # Decided: a late decision is refused, naming the keys that decided it.
    message = refused(people["carol"], runs, name, "pay-1.3", digest)
    assert "approval request 'pay-1' is already decided (under 'pay-1', 'pay-1.2')" in message


def test_one_rejection_ends_a_quorum_request(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs, 2)
    webhook_operator()
    name = runs.create(payment(refsystem.url))
    digest = pending(runs, name)["digest"]
    decide(people["alice"], runs, name, "pay-1", digest)
    eventually(lambda: shown(runs, name) == [("alice", "pay-1")], Within.COMMIT, "alice's approval shown")
    decide(people["carol"], runs, name, "pay-1.2", digest, "reject", reason="wrong amount")
    ended = runs.wait_state(name, "failed", timeout=60)
    assert ended["status"]["outcome"]["reason"] == "ApprovalRejected"
    assert "carol rejected pay-1" in ended["status"]["outcome"]["message"]
    assert refsystem.counts() == {}


def test_a_quorum_more_than_the_approvers_is_stuck_no_approver(
    kube: KubeEnv,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs, 3)
    webhook_operator(DURABLE_AGENTS_STUCK_CHECK_SECONDS="1")
    name = runs.create(payment(refsystem.url))
    pending(runs, name)

    def stuck(value: str) -> dict[str, Any] | None:
        conditions = runs.get(name)["status"].get("conditions") or []
        found = next((c for c in conditions if c["type"] == "Stuck"), None)
        return found if found is not None and found["status"] == value else None

    condition = eventually(lambda: stuck("True"), Within.COMMIT, "the run to be Stuck")
    assert condition["reason"] == "NoApprover"
    assert "needs 3 more approval(s) (quorum 3) and only 2 other person(s)" in condition["message"]
    assert "(alice, carol)" in condition["message"]
    # A third approver bound: no longer stuck.
    grant(kube, runs.namespace, "dave", APPROVER, name="approver-dave")
    eventually(lambda: stuck("False"), Within.COMMIT, "the Stuck condition to clear")


def _stamped(runs: Runs, name: str, key: str, who: Identity, digest: str) -> dict[str, Any]:
    """A decision as the mutating webhook would stamp it for ``who`` (a real stamp)."""
    old = runs.get(name)
    entry = {"digest": digest, "decision": "approve"}
    new = {**old, "spec": {**old["spec"], "approvals": {**old["spec"].get("approvals", {}), key: entry}}}
    out: dict[str, Any] = stamps("UPDATE", new, old, who, datetime.now(UTC), session_keyring())["approvals"][
        key
    ]
    return out


def test_with_the_webhook_off_one_person_under_many_keys_does_not_make_a_quorum(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    """No webhook at all: an admin writes decisions straight into the spec. alice's decision,
    really stamped, under three keys; the creator's, really stamped (four-eyes); carol's, with a
    forged stamp; dave's, unstamped. None of that is a second approver."""
    policy(runs, 2, four_eyes=True)
    start_operator("no-webhook", LEASE)
    name = runs.create(payment(refsystem.url))
    digest = pending(runs, name)["digest"]
    alice = Identity(username="alice")
    for key in ("pay-1", "pay-1.2", "pay-1.3"):
        runs.patch_spec(name, {"approvals": {key: _stamped(runs, name, key, alice, digest)}}, stamped=False)
    creator = _stamped(runs, name, "pay-1.4", TEST_KIT_USER, digest)
    runs.patch_spec(name, {"approvals": {"pay-1.4": creator}}, stamped=False)
    forged = {**_stamped(runs, name, "pay-1.5", Identity(username="carol"), digest), "stamp": FORGED_STAMP}
    runs.patch_spec(name, {"approvals": {"pay-1.5": forged}}, stamped=False)
    unstamped = {"digest": digest, "decision": "approve", "approver": {"username": "dave"}}
    runs.patch_spec(name, {"approvals": {"pay-1.6": unstamped}}, stamped=False)

    def refusals() -> dict[str, str]:
        return {r["key"]: r["reason"] for r in runs.get(name)["status"].get("refusedRequests") or []}

    expected = {"pay-1.4": "FourEyes", "pay-1.5": "StampInvalid", "pay-1.6": "Unstamped"}
    eventually(lambda: refusals() == expected, Within.COMMIT, f"the refusals {expected}")
    eventually(lambda: shown(runs, name) == [("alice", "pay-1")], Within.COMMIT, "alice counted once")
    run = runs.get(name)
    assert run["status"]["state"] == "waiting_approval", "one person under three keys is one approval"
    assert [a.get("decision") for a in run["status"]["checkpoint"]["approvals"]] == [None]
    assert refsystem.counts() == {}

    # A second person, really stamped: the quorum is reached, the action applied once.
    carol = _stamped(runs, name, "pay-1.7", Identity(username="carol"), digest)
    runs.patch_spec(name, {"approvals": {"pay-1.7": carol}}, stamped=False)
    done = runs.wait_state(name, "completed", timeout=60)
    assert done["status"]["checkpoint"]["approvals"][0]["approvedBy"] == ["alice", "carol"]
    assert list(refsystem.counts().values()) == [1]
