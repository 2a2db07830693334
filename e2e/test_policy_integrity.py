"""A policy's integrity and its deletion (issue 32 items 3 and 5), against a real API server,
operator processes and, where marked, the operator's admission webhook.

- One version names one content: a change of rules under an unchanged ``spec.version`` is refused
  at admission, naming the field; an old version is never brought back with other rules; an
  identical re-apply (a GitOps sync) is accepted and writes nothing. With the webhook off, the
  operator does not use such a policy: its runs wait, nothing is sent, until a new version.
- A policy that live runs use cannot be deleted (the refusal names the runs and the total) until
  they end, unless an on-call person with the verb ``force-delete`` marks it first: then it is
  deleted and its runs are quarantined ``PolicyDeleted``, nothing sent. With the webhook off, a
  policy deleted without review leaves its runs waiting (``PolicyNotFound``), nothing sent.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.policy_integrity import FORCE_DELETE, FORCE_DELETE_BY, FORCE_DELETE_STAMP
from durable_agents.kubectl import main as kubectl_plugin
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, written_by_clients

LEASE = 2
FORGED_STAMP = "test-key-1:" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="
APPROVED = {"tiers": {"http.post": "consequential"}, "approvalRequiredTiers": ["consequential"]}
FREE = {"tiers": {"http.post": "reversible"}, "approvalRequiredTiers": []}


def put_policy(runs: Runs, name: str, version: str, api: client.ApiClient | None = None, **rules: Any) -> Any:
    """Create the policy, or replace its spec (a merge patch of the whole spec, as an apply does)."""
    custom = client.CustomObjectsApi(api) if api is not None else runs.custom
    spec = {"version": version, **rules}
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }
    try:
        return custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)
    except client.ApiException as err:
        if err.status != 409:
            raise
    current = custom.get_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", name)
    dropped = {key: None for key in current["spec"] if key not in spec}
    return custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", name, {"spec": {**dropped, **spec}}
    )


def get_policy(runs: Runs, name: str) -> dict[str, Any]:
    out: dict[str, Any] = runs.custom.get_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", name
    )
    return out


def delete_policy(runs: Runs, name: str, api: client.ApiClient | None = None) -> None:
    custom = client.CustomObjectsApi(api) if api is not None else runs.custom
    custom.delete_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", name)


def refused(call: Callable[[], Any]) -> str:
    """The admission webhook's refusal (403); fails if the call was accepted."""
    with pytest.raises(client.ApiException) as err:
        call()
    assert err.value.status == 403, err.value.body
    return str(err.value.body)


def pay_after_asking(url: str, policy: str) -> dict[str, Any]:
    """Ask (the run waits for an answer), then a consequential http.post, then complete."""
    return {
        "taskType": "payment",
        "objective": "pay the invoice once confirmed",
        "policyRef": {"name": policy},
        "steps": [
            {"name": "confirm", "ask": {"question": "pay?"}},
            {
                "name": "pay",
                "effect": {
                    "effect": "http.post",
                    "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
                    "arguments": {"amount": 120},
                },
            },
            {"name": "done", "complete": {"result": "paid"}},
        ],
    }


def asking(policy: str) -> dict[str, Any]:
    return {
        "taskType": "e2e",
        "objective": "ask, then finish",
        "policyRef": {"name": policy},
        "steps": [{"name": "confirm", "ask": {"question": "go on?"}}, {"name": "done", "complete": {}}],
    }


def policy_known(op: OperatorProcess, runs: Runs, name: str, version: str) -> None:
    eventually(
        lambda: op.logged(f"AgentPolicy {runs.namespace}/{name} version {version} known"),
        Within.COMMIT,
        f"the operator to know policy {name} {version}",
    )


def kubectl(kube: KubeEnv, *args: str, stdin: str) -> str:
    binary = Path(os.environ["DURABLE_AGENTS_BIN_DIR"]) / "kubectl"
    done = subprocess.run(
        [str(binary), "--kubeconfig", str(kube.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=Within.COMMIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.local_plane("webhook")
def test_content_under_one_version_cannot_change_and_an_identical_reapply_writes_nothing(
    kube: KubeEnv, webhook_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    op = webhook_operator()
    manifest = (
        f"apiVersion: {GROUP}/{VERSION}\nkind: AgentPolicy\nmetadata:\n  name: payments\n"
        f"  namespace: {runs.namespace}\nspec:\n  version: v1\n  approvalRequiredTiers: [consequential]\n"
        "  tiers:\n    http.post: consequential\n"
    )
    kubectl(kube, "apply", "--server-side", "--field-manager=gitops", "-f", "-", stdin=manifest)
    first = get_policy(runs, "payments")
    policy_known(op, runs, "payments", "v1")

    # A GitOps sync applies the same manifest again: reviewed, accepted, and nothing is written.
    kubectl(kube, "apply", "--server-side", "--field-manager=gitops", "-f", "-", stdin=manifest)
    put_policy(runs, "payments", "v1", **APPROVED)  # and a plain update with the same content
    again = get_policy(runs, "payments")
    # (the operator writes the policy's status meanwhile: the object as clients wrote it is compared)
    assert written_by_clients(again) == written_by_clients(first)
    assert again["metadata"]["generation"] == first["metadata"]["generation"] == 1

    # The same version with other rules: refused, naming the field; nothing changes.
    why = refused(lambda: put_policy(runs, "payments", "v1", **FREE))
    assert "spec.version" in why, why
    assert "'v1'" in why, why
    loosened = manifest.replace("[consequential]", "[]")
    with pytest.raises(AssertionError, match=r"spec\.version"):
        kubectl(kube, "apply", "--server-side", "--field-manager=gitops", "-f", "-", stdin=loosened)
    assert written_by_clients(get_policy(runs, "payments")) == written_by_clients(first)

    # A new version may carry new rules; the old version is never reused with other rules.
    put_policy(runs, "payments", "v2", **FREE)
    policy_known(op, runs, "payments", "v2")
    why = refused(lambda: put_policy(runs, "payments", "v1", **FREE, approvalExpiry="5m"))
    assert "spec.version" in why, why
    assert "'v1'" in why, why
    # ... but rolling back to v1 as it was is a rollback, accepted.
    put_policy(runs, "payments", "v1", **APPROVED)
    assert get_policy(runs, "payments")["spec"]["approvalRequiredTiers"] == ["consequential"]


def test_the_operator_does_not_use_a_version_reused_with_other_content(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    """Webhook off (an admin edits the rules under the same version): the second line holds."""
    put_policy(runs, "payments", "v1", **APPROVED)
    op = start_operator("second-line", LEASE)
    policy_known(op, runs, "payments", "v1")
    name = runs.create(pay_after_asking(refsystem.url, "payments"))
    runs.wait_state(name, "waiting_input", timeout=Within.COMMIT)

    put_policy(runs, "payments", "v1", **FREE)  # no approval any more, same version label
    eventually(
        lambda: op.logged(f"AgentPolicy {runs.namespace}/payments not used: spec.version"),
        Within.COMMIT,
        "the operator to refuse the policy's reused version",
    )
    runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    runs.wait_event(name, "PolicyVersionConflict")  # it says it waits for a usable version
    assert runs.state(name) == "waiting_input", "the answer is not taken in without a usable policy"
    assert refsystem.counts() == {}, "nothing is sent under a version that names other content"

    put_policy(runs, "payments", "v2", **FREE)  # the same loosened rules, under a new version
    done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
    assert done["status"]["state"] == "completed", done["status"].get("outcome")
    assert list(refsystem.counts().values()) == [1], "sent once, under v2"


@pytest.mark.local_plane("webhook")
def test_a_policy_in_use_cannot_be_deleted_until_its_runs_end(
    webhook_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    put_policy(runs, "ops", "v1", **FREE)
    put_policy(runs, "unused", "v1", **FREE)
    webhook_operator()
    first, second = runs.create(asking("ops"), name="first"), runs.create(asking("ops"), name="second")
    for name in (first, second):
        runs.wait_state(name, "waiting_input", timeout=Within.COMMIT)

    why = refused(lambda: delete_policy(runs, "ops"))
    assert "used by 2 run(s) that have not ended: first, second;" in why, why
    assert "force-delete" in why, why
    delete_policy(runs, "unused")  # a policy no live run uses goes at once

    runs.patch_spec(first, {"answers": {"confirm": "yes"}})
    runs.wait_state(first, "completed", timeout=Within.COMMIT)
    why = refused(lambda: delete_policy(runs, "ops"))
    assert "used by 1 run(s) that have not ended: second;" in why, why

    runs.patch_spec(second, {"answers": {"confirm": "yes"}})
    runs.wait_state(second, "completed", timeout=Within.COMMIT)
    delete_policy(runs, "ops")
    with pytest.raises(client.ApiException) as gone:
        get_policy(runs, "ops")
    assert gone.value.status == 404


@pytest.mark.local_plane("users", "webhook")
def test_a_forced_deletion_quarantines_its_runs_and_nothing_is_sent(
    kube: KubeEnv,
    plane: LocalControlPlane,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    ns = runs.namespace
    edit = ["get", "list", "patch", "delete"]
    grant(kube, ns, "bob", [rule(GROUP, "agentpolicies", *edit)])
    grant(kube, ns, "oncall", [rule(GROUP, "agentpolicies", *edit, "force-delete")])
    bob, oncall = kube.user_client("bob", []), kube.user_client("oncall", [])
    put_policy(runs, "payments", "v1", **APPROVED)
    webhook_operator()
    names = [runs.create(pay_after_asking(refsystem.url, "payments"), name=n) for n in ("pay-a", "pay-b")]
    for name in names:
        runs.patch_spec(name, {"answers": {"confirm": "yes"}})
        runs.wait_state(name, "waiting_approval", timeout=Within.COMMIT)

    why = refused(lambda: delete_policy(runs, "payments", api=oncall))
    assert "pay-a, pay-b" in why, why
    mark = {"metadata": {"annotations": {FORCE_DELETE: "INC-7: the approver group is gone"}}}

    def annotate(api: client.ApiClient) -> Any:
        return client.CustomObjectsApi(api).patch_namespaced_custom_object(
            GROUP, VERSION, ns, "agentpolicies", "payments", mark
        )

    forged = {"metadata": {"annotations": {FORCE_DELETE_STAMP: FORGED_STAMP}}}
    # A stamp written by hand (no mark): the webhook drops it.
    client.CustomObjectsApi(oncall).patch_namespaced_custom_object(
        GROUP, VERSION, ns, "agentpolicies", "payments", forged
    )
    assert FORCE_DELETE_STAMP not in (get_policy(runs, "payments")["metadata"].get("annotations") or {})
    why = refused(lambda: annotate(bob))
    assert "user 'bob' may not force-delete agentpolicies/payments" in why, why
    # On call: kubectl agentrun policy force-delete marks the policy, then deletes it.
    oncall_config = str(plane.write_user_kubeconfig("oncall", []))
    reason = "INC-7: the approver group is gone"
    command = [
        "policy",
        "force-delete",
        "payments",
        "--reason",
        reason,
        "-n",
        ns,
        "--kubeconfig",
        oncall_config,
    ]
    assert kubectl_plugin.main(command) == 0
    with pytest.raises(client.ApiException) as gone:
        get_policy(runs, "payments")
    assert gone.value.status == 404

    for name in names:
        run = runs.wait_state(name, "quarantined", timeout=Within.COMMIT)
        outcome = run["status"]["outcome"]
        assert outcome["reason"] == "PolicyDeleted", outcome
        assert "AgentPolicy 'payments' was force-deleted (INC-7" in outcome["message"], outcome
        runs.wait_event(name, "PolicyDeleted")
    assert refsystem.counts() == {}, "nothing is sent without the policy"
    records = runs.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "actionrecords")["items"]
    assert records == [], "not even intended"

    # Without its policy a quarantined run can still be canceled; once the policy is back (its v1
    # rules as they were), a retried run resumes under it and waits for its approval again.
    admin = ["-n", ns, "--kubeconfig", str(kube.kubeconfig)]
    assert kubectl_plugin.main(["cancel", "pay-b", "--reason", "not without its policy", *admin]) == 0
    runs.wait_state("pay-b", "canceled", timeout=Within.COMMIT)
    put_policy(runs, "payments", "v1", **APPROVED)
    assert kubectl_plugin.main(["retry", "pay-a", *admin]) == 0
    runs.wait_state("pay-a", "waiting_approval", timeout=Within.COMMIT)
    assert refsystem.counts() == {}


def test_a_policy_deleted_without_review_leaves_its_runs_waiting(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    """Webhook off: the deletion is not reviewed, and a force-delete mark written by hand (a
    forged stamp) is not honoured: the run is neither quarantined nor acts without its policy."""
    put_policy(runs, "ops", "v1", **FREE)
    op = start_operator("unreviewed", LEASE)
    name = runs.create(pay_after_asking(refsystem.url, "ops"))
    runs.wait_state(name, "waiting_input", timeout=Within.COMMIT)
    marks = {FORCE_DELETE: "by hand", FORCE_DELETE_BY: "oncall", FORCE_DELETE_STAMP: FORGED_STAMP}
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "ops", {"metadata": {"annotations": marks}}
    )
    delete_policy(runs, "ops")
    eventually(
        lambda: op.logged(f"AgentPolicy {runs.namespace}/ops: force-delete mark not honoured"),
        Within.COMMIT,
        "the operator to refuse the unstamped mark",
    )
    eventually(
        lambda: op.logged(f"AgentPolicy {runs.namespace}/ops deleted"),
        Within.COMMIT,
        "the operator to see the policy deleted",
    )
    runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    runs.wait_event(name, "PolicyNotFound")  # it says it waits for its policy
    assert runs.state(name) == "waiting_input"
    assert refsystem.counts() == {}, "nothing is sent without the policy"

    put_policy(runs, "ops", "v1", **FREE)  # re-created as it was
    done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
    assert done["status"]["state"] == "completed", done["status"].get("outcome")
    assert list(refsystem.counts().values()) == [1]


def test_the_dispatcher_holds_an_intent_whose_runs_policy_is_gone(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    """An intent committed under the policy, then the policy deleted (webhook off) before any
    send: the dispatcher, reading the policy fresh, holds it (neither sent nor failed) until the
    policy is back, then sends it once."""
    put_policy(runs, "ops", "v1", **FREE)
    worker = start_operator("worker", LEASE, DURABLE_AGENTS_DISPATCHER="off")
    policy_known(worker, runs, "ops", "v1")
    name = runs.create(pay_after_asking(refsystem.url, "ops"))
    runs.wait_state(name, "waiting_input", timeout=Within.COMMIT)
    runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    runs.wait_state(name, "waiting_external", timeout=Within.COMMIT)
    listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
    (record,) = [item["metadata"]["name"] for item in listed["items"]]

    delete_policy(runs, "ops")
    dispatcher = start_operator("dispatcher", LEASE, DURABLE_AGENTS_WORKERS="0")
    eventually(
        lambda: (
            dispatcher.logged(f"{runs.namespace}/{record} held back") and dispatcher.logged("PolicyMissing")
        ),
        Within.COMMIT,
        "the dispatcher to hold the intent of a run whose policy is gone",
    )
    assert refsystem.counts() == {}, "nothing is sent without the run's policy"
    held = runs.custom.get_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords", record)
    assert (held.get("status") or {}).get("state") not in ("failed", "succeeded"), held.get("status")

    put_policy(runs, "ops", "v1", **FREE)
    eventually(lambda: list(refsystem.counts().values()) == [1], Within.RUN, "the intent sent once")
