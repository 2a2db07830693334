"""Approvals bound to a digest, authority by RBAC, revalidation of material facts.

Real users (client certificates with chosen groups), RBAC objects made by the test, and the
operator's admission webhook (failurePolicy Fail) in front of every AgentRun write.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, group, rule
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless

LEASE = 2
pytestmark = pytest.mark.local_plane("users", "webhook")


@pytest.fixture
def people(kube: KubeEnv, plane: LocalControlPlane, namespace: str) -> dict[str, client.ApiClient]:
    """alice and carol may approve; bob may edit runs but not approve."""
    roles = {
        "approver": ["get", "list", "create", "patch", "approve"],
        "editor": ["get", "list", "create", "patch"],
    }
    for role, verbs in roles.items():
        # Creating a run acts as its ServiceAccount, under the policy it names: allowed to use both.
        rules = [
            rule(GROUP, "agentruns", *verbs),
            rule("", "serviceaccounts", "use"),
            rule(GROUP, "agentpolicies", "use"),
        ]
        grant(kube, namespace, group(f"{role}s"), rules, name=f"agentrun-{role}")
    return {
        "alice": kube.user_client("alice", ["approvers"]),
        "carol": kube.user_client("carol", ["approvers"]),
        "bob": kube.user_client("bob", ["editors"]),
    }


def policy(runs: Runs, version: str = "v1", **freshness: Any) -> None:
    spec: dict[str, Any] = {
        "version": version,
        "tiers": {"http.post": "consequential"},
        "approvalRequiredTiers": ["consequential"],
        "approvers": {
            "verb": "approve",
            "resource": "agentruns",
            "fourEyes": freshness.pop("four_eyes", False),
        },
        "approvalExpiry": freshness.pop("expiry", "1h"),
        "freshness": {"evidenceChanged": "reapprove", "policyChanged": "reapprove", **freshness},
    }
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "payments"},
        "spec": spec,
    }
    try:
        runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)
    except client.ApiException as err:
        if err.status != 409:
            raise
        runs.custom.patch_namespaced_custom_object(
            GROUP, VERSION, runs.namespace, "agentpolicies", "payments", {"spec": spec}
        )


def policy_known(op: OperatorProcess, runs: Runs, version: str) -> None:
    """Wait until ``op`` has taken in ``version`` of the policy: its policy cache logs each version
    it learns (the dispatcher's cache logs the same line, but only when it verifies an intent)."""
    eventually(
        lambda: op.logged(f"AgentPolicy {runs.namespace}/payments version {version} known"),
        Within.COMMIT,
        f"the operator to know policy {version}",
    )


def payment(url: str, read: str | None = None) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    if read:
        steps.append(
            {
                "name": "read-limits",
                "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": read}},
            }
        )
    steps += [
        {
            "name": "pay",
            "effect": {
                "effect": "http.post",
                "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
                "arguments": {"amount": 120, "currency": "EUR"},
            },
        },
        {"name": "done", "complete": {"result": "paid"}},
    ]
    return {
        "taskType": "payment",
        "objective": "pay the invoice",
        "policyRef": {"name": "payments"},
        "steps": steps,
    }


def decide(
    api: client.ApiClient,
    runs: Runs,
    name: str,
    request_id: str,
    digest: str,
    decision: str = "approve",
    **extra: Any,
) -> dict[str, Any]:
    patch = {"spec": {"approvals": {request_id: {"digest": digest, "decision": decision, **extra}}}}
    out: dict[str, Any] = client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentruns", name, patch
    )
    return out


def refused(api: client.ApiClient, runs: Runs, name: str, request_id: str, digest: str, **extra: Any) -> str:
    with pytest.raises(client.ApiException) as err:
        decide(api, runs, name, request_id, digest, **extra)
    # 403/422: refused by the webhook or the schema; 500: the webhook is unreachable (fail closed).
    assert err.value.status in (403, 422, 500), err.value.body
    return str(err.value.body)


def pending(runs: Runs, name: str) -> dict[str, Any]:
    run = runs.wait_state(name, "waiting_approval", timeout=60)
    request: dict[str, Any] = run["status"]["approvalRequest"]
    return request


def test_an_approver_approves_and_the_action_runs_once_under_their_identity(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    webhook_operator()
    name = runs.create(payment(refsystem.url))
    request = pending(runs, name)
    assert request["requestId"] == "pay-1"
    assert request["policyVersion"] == "v1"
    assert refsystem.counts() == {}, "nothing is dispatched before the approval"
    # The patch claims to come from someone else: the webhook stamps the real user.
    decided = decide(
        people["alice"],
        runs,
        name,
        request["requestId"],
        request["digest"],
        approver={"username": "mallory", "groups": ["system:masters"]},
    )
    stamped = decided["spec"]["approvals"]["pay-1"]["approver"]
    assert stamped["username"] == "alice"
    assert "approvers" in stamped["groups"]
    done = runs.wait_state(name, "completed", timeout=60)
    assert len(refsystem.counts()) == 1
    assert list(refsystem.counts().values()) == [1]
    approvals = done["status"]["checkpoint"]["approvals"]
    assert [(a["requestId"], a["decision"], a["decidedBy"]) for a in approvals] == [
        ("pay-1", "approved", "alice")
    ]
    assert done["status"]["checkpoint"]["toolCalls"][0]["outcome"] == "succeeded"
    events = [h["event"] for h in assert_history_is_gapless(done)]
    assert events.count("approval_decided") == 1
    # The identity cannot be changed afterwards.
    with pytest.raises(client.ApiException) as err:
        runs.patch_spec(
            name,
            {
                "approvals": {
                    "pay-1": {
                        "digest": request["digest"],
                        "decision": "approve",
                        "approver": {"username": "eve"},
                    }
                }
            },
        )
    assert err.value.status in (403, 422)


def test_refusals_name_the_reason_and_the_run_stays_waiting(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    webhook_operator()
    name = runs.create(payment(refsystem.url))
    request = pending(runs, name)
    message = refused(people["bob"], runs, name, request["requestId"], request["digest"])
    assert "missing RBAC permission verb 'approve' on resource 'agentruns'" in message
    message = refused(people["alice"], runs, name, request["requestId"], "sha256:" + "0" * 64)
    assert "wrong digest" in message
    message = refused(people["alice"], runs, name, "pay-7", request["digest"])
    assert "unknown approval request 'pay-7'" in message
    assert runs.state(name) == "waiting_approval"
    assert refsystem.counts() == {}


def test_an_expired_request_is_refused(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs, expiry="3s")
    op = webhook_operator()
    name = runs.create(payment(refsystem.url))
    request = pending(runs, name)
    op.stop()
    # Only the webhook now (no run workers), so the run stays parked past its expiry.
    webhook_operator("webhook-only", DURABLE_AGENTS_WORKERS="0")
    eventually(
        lambda: runs.get(name)["status"]["approvalRequest"]["expiresAt"] < _now(),
        Within.MOMENT,
        "the request to expire",
    )

    def answered() -> str | None:
        # The API server learns of the new webhook's address through a watch: until then the
        # call may still go to the stopped operator's port (a 500, fail closed). Asked again.
        message = refused(people["alice"], runs, name, request["requestId"], request["digest"])
        return None if "failed calling webhook" in message else message

    message = eventually(answered, Within.COMMIT, "the new webhook to answer")
    assert f"approval request '{request['requestId']}' expired" in message


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_duplicate_and_racing_approvals_make_one_transition(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    webhook_operator()
    name = runs.create(payment(refsystem.url))
    request = pending(runs, name)
    results: dict[str, dict[str, Any]] = {}

    def approve(who: str) -> None:
        results[who] = decide(people[who], runs, name, request["requestId"], request["digest"])

    threads = [threading.Thread(target=approve, args=(who,)) for who in ("alice", "carol")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The later of the two is a duplicate: it returns the current state and changes nothing.
    recorded = runs.get(name)["spec"]["approvals"]["pay-1"]["approver"]["username"]
    assert recorded in ("alice", "carol")
    assert {r["spec"]["approvals"]["pay-1"]["approver"]["username"] for r in results.values()} == {recorded}
    again = decide(people[recorded], runs, name, request["requestId"], request["digest"])
    assert again["spec"]["approvals"]["pay-1"] == runs.get(name)["spec"]["approvals"]["pay-1"]
    done = runs.wait_state(name, "completed", timeout=60)
    assert [h["event"] for h in done["status"]["history"]].count("approval_decided") == 1
    assert list(refsystem.counts().values()) == [1]


def test_evidence_changed_during_the_wait_asks_for_a_new_approval(
    kube: KubeEnv,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
    readable_configmap: str,
) -> None:
    policy(runs)
    webhook_operator()
    name = runs.create(payment(refsystem.url, read=readable_configmap))
    first = pending(runs, name)
    assert first["evidence"] == ["evidence-0-read-limits"]
    client.CoreV1Api(kube.api).patch_namespaced_config_map(
        readable_configmap, runs.namespace, {"data": {"maxSurge": "90%"}}
    )
    decide(people["alice"], runs, name, first["requestId"], first["digest"])
    second = eventually(
        lambda: (
            (runs.get(name)["status"].get("approvalRequest") or {}).get("requestId") == "pay-2"
            and runs.get(name)["status"]["approvalRequest"]
        ),
        Within.TAKEOVER,
        "a new approval request after the evidence changed",
    )
    assert "evidence changed during the wait: ConfigMap/settings" in second["policyReason"]
    assert refsystem.counts() == {}, "the action must not run on stale evidence"
    decide(people["alice"], runs, name, second["requestId"], second["digest"])
    done = runs.wait_state(name, "completed", timeout=60)
    assert [h["event"] for h in done["status"]["history"]].count("reapproval_required") == 1
    assert list(refsystem.counts().values()) == [1]


def test_policy_changed_during_the_wait_is_handled_as_the_policy_says(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs, version="v1")
    op = webhook_operator()
    reapproved = runs.create(payment(refsystem.url), name="reapproved")
    request = pending(runs, reapproved)
    policy(runs, version="v2")  # a GitOps pipeline rolls out a new version (policyChanged: reapprove)
    # The decision must find the operator knowing v2 (else it is decided under v1, a race the test
    # would lose or win by chance).
    policy_known(op, runs, "v2")
    decide(people["alice"], runs, reapproved, request["requestId"], request["digest"])
    second = eventually(
        lambda: (
            (runs.get(reapproved)["status"].get("approvalRequest") or {}).get("policyVersion") == "v2"
            and runs.get(reapproved)["status"]["approvalRequest"]
        ),
        Within.TAKEOVER,
        "a new request under policy v2",
    )
    assert "policy changed from v1 to v2" in second["policyReason"]
    assert refsystem.counts() == {}

    # The same change, with a policy that calls it immaterial: the first approval still binds.
    policy(runs, version="v3", policyChanged="immaterial")
    policy_known(op, runs, "v3")
    immaterial = runs.create(payment(refsystem.url), name="immaterial")
    request = pending(runs, immaterial)
    assert request["policyVersion"] == "v3"
    policy(runs, version="v4", policyChanged="immaterial")
    policy_known(op, runs, "v4")
    decide(people["alice"], runs, immaterial, request["requestId"], request["digest"])
    done = runs.wait_state(immaterial, "completed", timeout=60)
    assert [h["event"] for h in done["status"]["history"]].count("reapproval_required") == 0


def test_with_the_webhook_down_approvals_are_refused(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    op = webhook_operator()
    name = runs.create(payment(refsystem.url))
    request = pending(runs, name)
    op.stop()
    message = refused(people["alice"], runs, name, request["requestId"], request["digest"])
    assert "failed calling webhook" in message
    assert "approvals" not in runs.get(name)["spec"]


def test_four_eyes_the_creator_cannot_approve(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs, four_eyes=True)
    webhook_operator()
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": "by-carol"},
        "spec": {**payment(refsystem.url), "createdBy": {"username": "someone-else"}},
    }
    created = client.CustomObjectsApi(people["carol"]).create_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentruns", body
    )
    assert created["spec"]["createdBy"]["username"] == "carol", (
        "the creator is stamped, not taken from the client"
    )
    request = pending(runs, "by-carol")
    message = refused(people["carol"], runs, "by-carol", request["requestId"], request["digest"])
    assert "four-eyes policy: 'carol' created this run" in message
    decide(people["alice"], runs, "by-carol", request["requestId"], request["digest"])
    runs.wait_state("by-carol", "completed", timeout=60)


def test_kubectl_agentrun_approve(
    plane: LocalControlPlane,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    webhook_operator()
    name = runs.create(payment(refsystem.url))
    pending(runs, name)
    alice = plane.write_user_kubeconfig("alice", ["approvers"])
    env = {**os.environ, "KUBECONFIG": str(alice)}
    plugin = [sys.executable, "-m", "durable_agents.kubectl.main"]
    shown = subprocess.run(
        [*plugin, "status", name, "-n", runs.namespace], env=env, capture_output=True, text=True, check=True
    )
    assert "request ID:  pay-1" in shown.stdout
    request = runs.get(name)["status"]["approvalRequest"]  # the request alice reviewed
    assert f"--request pay-1 --digest {request['digest']}" in shown.stdout, "status prints the pinned command"
    unpinned = subprocess.run(
        [*plugin, "approve", name, "-n", runs.namespace], env=env, capture_output=True, text=True
    )
    assert unpinned.returncode == 1, "a decision without the request and digest reviewed is not sent"
    assert f"kubectl agentrun approve {name} -n {runs.namespace} --request pay-1 --digest " in unpinned.stderr
    assert "approvals" not in runs.get(name)["spec"], "nothing was sent"
    pinned = ["--request", "pay-1", "--digest", request["digest"]]
    out = subprocess.run(
        [*plugin, "approve", name, "-n", runs.namespace, *pinned], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "approve sent for request pay-1 (http.post)" in out.stdout
    done = runs.wait_state(name, "completed", timeout=60)
    assert done["spec"]["approvals"]["pay-1"]["approver"]["username"] == "alice"
    assert list(refsystem.counts().values()) == [1]
