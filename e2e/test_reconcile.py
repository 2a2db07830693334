"""A person reconciles an action whose outcome is unknown (``kubectl agentrun reconcile``).

The reference system drops (or fails) the one send, and the action's query endpoint is a loopback
port nothing listens on: every query is unknown, as for a system that cannot be asked by key (an
MCP tool). Real users (client certificates), RBAC made by the test, and the operator's admission
webhook; then the second line: the same answer written with the webhook off is never acted on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents.core.sealed_values import outcome_label
from durable_agents.kubectl import reconcile as kubectl_reconcile
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import unsealed
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, group, rule
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

LEASE = 2
KUBECTL_AGENTRUN = (sys.executable, "-m", "durable_agents.kubectl.main")
APPLIED = ("--applied", "--reason", "receipt in the bank statement")
VERB_REFUSED = "missing RBAC permission verb 'approve' on resource 'agentruns'"


@pytest.fixture
def people(kube: KubeEnv, plane: LocalControlPlane, namespace: str) -> dict[str, client.ApiClient]:
    """alice may approve (and so reconcile); bob may edit runs and read their actions, no more."""
    roles = {
        "approver": ["get", "list", "create", "patch", "approve"],
        "editor": ["get", "list", "create", "patch"],
    }
    for role, verbs in roles.items():
        rules = [
            rule(GROUP, "agentruns", *verbs),
            rule(GROUP, "actionrecords", "get", "list"),
            rule("", "serviceaccounts", "use"),
            rule(GROUP, "agentpolicies", "use"),  # the runs they create name a policy
        ]
        grant(kube, namespace, group(f"{role}s"), rules, name=f"agentrun-{role}")
    return {"alice": kube.user_client("alice", ["approvers"]), "bob": kube.user_client("bob", ["editors"])}


def policy(runs: Runs) -> None:
    """A consequential http.post; who may approve the run's actions may reconcile them."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "payments"},
        "spec": {
            "version": "v1",
            "tiers": {"http.post": "consequential"},
            "approvalRequiredTiers": [],
            "approvers": {"verb": "approve", "resource": "agentruns"},
        },
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)


def payment(url: str) -> dict[str, Any]:
    """Paid through the reference system; asked about at a port where nothing answers."""
    unanswered = f"http://127.0.0.1:{free_port()}/effects"
    return {
        "taskType": "payment",
        "objective": "pay the invoice",
        "policyRef": {"name": "payments"},
        "steps": [
            {
                "name": "pay",
                "effect": {
                    "effect": "http.post",
                    "target": {"url": f"{url}/effects", "queryUrl": unanswered},
                    "arguments": {"amount": 120, "currency": "EUR"},
                },
            },
            {"name": "done", "complete": {"result": "paid"}},
        ],
    }


def record(runs: Runs, name: str) -> dict[str, Any]:
    out: dict[str, Any] = runs.custom.get_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "actionrecords", name
    )
    return out


def key_of(runs: Runs, run: str) -> str:
    return idempotency_key(runs.get(run)["metadata"]["uid"], 0, "pay")


def stuck(runs: Runs, run: str, queries: int = 2) -> tuple[str, dict[str, Any]]:
    """The run's action once it is outcome_unknown and asked about ``queries`` times, unanswered."""
    name = action_record_name(key_of(runs, run))

    def unknown() -> dict[str, Any] | None:
        try:
            status = record(runs, name).get("status") or {}
        except client.ApiException:
            return None
        if status.get("state") == "outcome_unknown" and status.get("queries", 0) >= queries:
            return status
        return None

    status = eventually(unknown, Within.COMMIT, f"ActionRecord {name} to stay outcome_unknown, queried")
    runs.wait_state(run, "waiting_external", timeout=Within.COMMIT)  # the run waits for its action
    return name, status


def refused_for(api: client.ApiClient, runs: Runs, run: str, action: str, applied: bool = True) -> str:
    with pytest.raises(kubectl_reconcile.ReconcileError) as err:
        kubectl_reconcile.reconcile(client.CustomObjectsApi(api), runs.namespace, run, action, applied)
    return str(err.value)


@pytest.mark.local_plane("users", "webhook")
def test_an_unknown_outcome_waits_for_a_person_who_may_approve(
    kube: KubeEnv,
    plane: LocalControlPlane,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    webhook_operator()
    refsystem.inject("drop_after_apply", times=1)  # applied, and the answer is lost
    run = runs.create(payment(refsystem.url))
    action, status = stuck(runs, run)
    key = key_of(runs, run)
    assert refsystem.counts() == {key: 1}
    assert status["attempts"] == 1

    assert VERB_REFUSED in refused_for(people["bob"], runs, run, action)
    assert "reconciliations" not in runs.get(run)["spec"]

    alice = plane.write_user_kubeconfig("alice", ["approvers"])
    out = subprocess.run(
        [*KUBECTL_AGENTRUN, "reconcile", run, "-n", runs.namespace, "--action", action, *APPLIED],
        env={**os.environ, "KUBECONFIG": str(alice)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert f"action {action} attempt 1 reconciled as applied" in out.stdout
    entry = runs.get(run)["spec"]["reconciliations"][action]
    assert entry["reconciler"]["username"] == "alice"
    assert "approvers" in entry["reconciler"]["groups"]

    done = runs.wait_state(run, "completed", timeout=Within.RUN)
    assert refsystem.counts() == {key: 1}, "reconciled as applied: never sent again"
    settled = record(runs, action)["status"]
    assert (settled["state"], settled["attempts"], settled["reason"]) == ("succeeded", 1, "ReconciledApplied")
    assert "reconciled as applied by 'alice'" in settled["message"]
    outcome = unsealed(done, settled["outcome"], outcome_label(action))
    assert outcome == {"reconciledBy": "alice", "reason": "receipt in the bank statement"}
    # Done is done: a second answer for it is refused, whoever gives it.
    message = refused_for(people["alice"], runs, run, action, applied=False)
    assert "is 'succeeded': only an action whose outcome is unknown is reconciled" in message


@pytest.mark.local_plane("users", "webhook")
def test_not_applied_sends_it_again_with_the_same_key(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    webhook_operator()
    refsystem.inject("error_before_apply", times=1)  # a 500, and nothing applied
    run = runs.create(payment(refsystem.url))
    action, _ = stuck(runs, run)
    assert refsystem.counts() == {}
    alice = client.CustomObjectsApi(people["alice"])

    def patched(key: str, **entry: Any) -> str:
        patch = {"spec": {"reconciliations": {key: entry}}}
        with pytest.raises(client.ApiException) as err:
            alice.patch_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentruns", run, patch)
        assert err.value.status == 403, err.value.body
        return str(err.value.body)

    assert "answers for attempt 2, but ActionRecord" in patched(action, applied=False, attempt=2)
    missing = "act-" + "0" * 40
    assert f"there is no ActionRecord {missing!r}" in patched(missing, applied=False, attempt=1)

    said = kubectl_reconcile.reconcile(alice, runs.namespace, run, action, False, "not in the ledger")
    assert said.endswith(f"action {action} attempt 1 reconciled as not applied (it will be sent again)")
    runs.wait_state(run, "completed", timeout=Within.RUN)
    assert refsystem.counts() == {key_of(runs, run): 1}, "sent again with the same key, applied once"
    settled = record(runs, action)["status"]
    assert (settled["state"], settled["attempts"]) == ("succeeded", 2)
    messages = [e.message for e in runs.wait_event(action, "Reconciled")]
    assert any(
        "reconciled as not applied by 'alice'" in message and "dispatching again" in message
        for message in messages
    ), messages


def test_without_the_webhook_an_answer_written_by_hand_is_never_acted_on(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    policy(runs)
    start_operator("no-webhook", LEASE)  # no DURABLE_AGENTS_WEBHOOK_PORT: nothing stamps
    refsystem.inject("drop_after_apply", times=1)
    run = runs.create(payment(refsystem.url))
    action, _ = stuck(runs, run)
    claimed = {"applied": True, "attempt": 1, "reason": "trust me", "reconciler": {"username": "alice"}}
    runs.patch_spec(run, {"reconciliations": {action: claimed}}, stamped=False)

    def warned() -> str | None:
        for event in runs.events(run):
            if event.reason == "ReconciliationNotActedOn" and event.type == "Warning":
                return str(event.message)
        return None

    message = eventually(warned, Within.RUN, "a Warning Event saying the answer is not acted on")
    assert f"spec.reconciliations['{action}']" in message
    assert "carries no stamp of the operator's admission webhook" in message
    asked = record(runs, action)["status"]["queries"]
    # It keeps asking the authoritative system (at most a minute apart), and nothing else changes.
    eventually(
        lambda: record(runs, action)["status"]["queries"] > asked + 1, Within.RUN, "the queries to go on"
    )
    status = record(runs, action)["status"]
    assert (status["state"], status["attempts"]) == ("outcome_unknown", 1)
    assert runs.state(run) == "waiting_external"
    assert refsystem.counts() == {key_of(runs, run): 1}


@pytest.mark.local_plane("users", "webhook")
def test_an_answer_written_with_the_webhook_off_does_not_block_the_approver(
    kube: KubeEnv,
    plane: LocalControlPlane,
    start_operator: Callable[..., OperatorProcess],
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    """Issue 30, item 2: with the webhook off, someone with ``patch`` answers for the action; the
    operator refuses it (``refusedRequests``). Once the webhook is back, the approver's answer,
    through the plugin people run, is taken, and the run settles."""
    policy(runs)
    no_webhook = start_operator("no-webhook", LEASE)  # no DURABLE_AGENTS_WEBHOOK_PORT: nothing stamps
    refsystem.inject("drop_after_apply", times=1)  # applied, and the answer is lost
    run = runs.create(payment(refsystem.url))
    action, _ = stuck(runs, run)
    claimed = {"applied": False, "attempt": 1, "reason": "trust me", "reconciler": {"username": "mallory"}}
    runs.patch_spec(run, {"reconciliations": {action: claimed}}, stamped=False)

    def refused() -> dict[str, Any] | None:
        for entry in (runs.get(run).get("status") or {}).get("refusedRequests") or []:
            if (entry["field"], entry["key"]) == ("reconciliations", action):
                return dict(entry)
        return None

    forged = eventually(
        refused, Within.RUN, "the hand-written answer to be refused in status.refusedRequests"
    )
    assert forged["reason"] == "Unstamped"
    assert "carries no stamp of the operator's admission webhook" in forged["message"]
    assert record(runs, action)["status"]["state"] == "outcome_unknown", "never acted on"

    no_webhook.stop()
    webhook_operator()
    alice = plane.write_user_kubeconfig("alice", ["approvers"])
    out = subprocess.run(
        [*KUBECTL_AGENTRUN, "reconcile", run, "-n", runs.namespace, "--action", action, *APPLIED],
        env={**os.environ, "KUBECONFIG": str(alice)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert f"action {action} attempt 1 reconciled as applied" in out.stdout
    entries = runs.get(run)["spec"]["reconciliations"]
    assert entries[action]["reconciler"] == {"username": "mallory"}, "the hand-written entry stays"
    assert entries[f"{action}.1"]["reconciler"]["username"] == "alice", "the answer under the next key"

    done = runs.wait_state(run, "completed", timeout=Within.RUN)
    assert refsystem.counts() == {key_of(runs, run): 1}, "reconciled as applied: never sent again"
    settled = record(runs, action)["status"]
    assert (settled["state"], settled["attempts"], settled["reason"]) == ("succeeded", 1, "ReconciledApplied")
    assert "reconciled as applied by 'alice'" in settled["message"]
    still = [
        entry
        for entry in done["status"].get("refusedRequests") or []
        if (entry["field"], entry["key"]) == ("reconciliations", action)
    ]
    assert [(entry["reason"], entry["message"]) for entry in still] == [(forged["reason"], forged["message"])]
