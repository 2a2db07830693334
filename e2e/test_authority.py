"""Authority the operator can verify: each request needs its own RBAC verb, requests are
append-only whatever the patch, a run acts as a ServiceAccount only if its creator may ``use``
it, and the operator acts only on what its own admission webhook stamped.

Real users (client certificates with chosen groups), RBAC made by the test, the operator as the
chart's identity. "Webhook off" is the configuration a user can get wrong: the operator runs
without ``DURABLE_AGENTS_WEBHOOK_PORT`` and its webhook configurations are gone, so an admin
writes fields straight into the spec, a hand-written ``approver`` and a forged ``stamp``
included. The operator's second line must hold then: nothing is acted on, and the run says why.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.authority import CREATION_SKEW
from durable_agents.kubectl import main as kubectl_plugin
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import unsealed
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless

LEASE = 2
FORGED_STAMP = "test-key-1:" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="
HAND_WRITTEN = {"username": "alice", "groups": ["approvers"]}


def on_runs(*verbs: str) -> dict[str, Any]:
    return {"apiGroups": [GROUP], "resources": ["agentruns"], "verbs": ["get", "list", *verbs]}


@pytest.fixture
def people(kube: KubeEnv, plane: LocalControlPlane, namespace: str) -> dict[str, client.ApiClient]:
    """alice approves; bob may create and patch runs but holds none of the custom verbs; erin
    creates runs as the ServiceAccount ``default`` only."""
    grant(kube, namespace, "alice", [on_runs("patch", "approve")])
    grant(kube, namespace, "bob", [on_runs("create", "patch")])
    use_default = rule("", "serviceaccounts", "use", names=["default"])
    grant(kube, namespace, "erin", [on_runs("create", "patch", "answer"), use_default])
    return {name: kube.user_client(name, []) for name in ("alice", "bob", "erin")}


@pytest.fixture
def deployer(kube: KubeEnv, namespace: str, readable_configmap: str) -> str:
    """A ServiceAccount that may read the ConfigMap (so a run acting as it would read it)."""
    reads = rule("", "configmaps", "get", names=[readable_configmap])
    grant(kube, namespace, service_account("deployer", namespace), reads, name="deployer-reads")
    return "deployer"


def policy(runs: Runs) -> None:
    spec = {
        "version": "v1",
        "tiers": {"http.post": "consequential"},
        "approvalRequiredTiers": ["consequential"],
        "approvalExpiry": "1h",
    }
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "payments"},
        "spec": spec,
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)


def payment(url: str, **spec: Any) -> dict[str, Any]:
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
                    "arguments": {"amount": 120},
                },
            },
            {"name": "done", "complete": {"result": "paid"}},
        ],
        **spec,
    }


def asking() -> dict[str, Any]:
    return {
        "taskType": "e2e",
        "objective": "ask, then finish",
        "steps": [{"name": "confirm", "ask": {"question": "go on?"}}, {"name": "done", "complete": {}}],
    }


def patch(api: client.ApiClient, runs: Runs, name: str, body: Any, content_type: str | None = None) -> Any:
    kwargs: dict[str, Any] = {"_content_type": content_type} if content_type else {}
    if content_type == "application/apply-patch+yaml":
        kwargs.update(field_manager="e2e-apply", force=True)
    return client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentruns", name, body, **kwargs
    )


def refused(call: Callable[[], Any]) -> str:
    """The API server's refusal message (the webhook's or the schema's); fails if it was accepted."""
    with pytest.raises(client.ApiException) as err:
        call()
    assert err.value.status in (403, 422), err.value.body
    body = err.value.body
    return str(json.loads(body).get("message", body) if isinstance(body, str) else body)


def webhook_off(kube: KubeEnv, runs: Runs, op: OperatorProcess) -> None:
    """The webhook is not installed: its operator stopped and its configurations deleted."""
    op.stop()
    api = client.AdmissionregistrationV1Api(kube.api)
    name = f"durable-agents-{runs.namespace}"
    api.delete_mutating_webhook_configuration(name)
    api.delete_validating_webhook_configuration(name)

    def unintercepted() -> bool:
        try:  # a dry-run write that only succeeds once no webhook intercepts it any more
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "AgentRun",
                "metadata": {"name": "p"},
                "spec": asking(),
            }
            made = runs.custom.create_namespaced_custom_object(
                GROUP, VERSION, runs.namespace, "agentruns", body, dry_run="All"
            )
        except client.ApiException:
            return False
        return "createdBy" not in made["spec"]

    eventually(unintercepted, Within.COMMIT, "the API server to stop calling the webhook")


def assert_withdrawal_refused(message: str, field: str) -> None:
    """Refused by the API server's own rules (the first line, there with the webhook or without)
    or by the webhook (which names the key too): either way the message names the field."""
    assert f"spec.{field}" in message, message
    assert "withdrawn" in message, message


def refusal_events(runs: Runs, name: str) -> list[str]:
    return [e.message for e in runs.events(name) if e.reason == "RequestRefused"]


@pytest.mark.local_plane("users", "webhook")
def test_with_the_webhook_each_request_needs_its_own_verb(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    webhook_operator()
    paying = runs.create(payment(refsystem.url), name="paying")
    request = runs.wait_state(paying, "waiting_approval")["status"]["approvalRequest"]
    assert request["serviceAccount"] == "default", "the request shows whom the effect runs as"
    parked = runs.create(asking(), name="parked")
    runs.wait_state(parked, "waiting_input")
    bob, ns = people["bob"], runs.namespace

    decision = {"spec": {"approvals": {"pay-1": {"digest": request["digest"], "decision": "approve"}}}}
    message = refused(lambda: patch(bob, runs, paying, decision))
    assert f"user 'bob' may not approve agentruns/paying in namespace '{ns}': needs verb 'approve'" in message
    message = refused(
        lambda: patch(bob, runs, paying, {"spec": {"cancellations": {"c1": {"scope": "task"}}}})
    )
    assert f"user 'bob' may not cancel agentruns/paying in namespace '{ns}': needs verb 'cancel'" in message
    message = refused(lambda: patch(bob, runs, paying, {"spec": {"retryQuarantine": "t1"}}))
    assert "may not retry agentruns/paying" in message
    assert "needs verb 'retry'" in message
    message = refused(lambda: patch(bob, runs, parked, {"spec": {"answers": {"confirm": "yes"}}}))
    assert "may not answer agentruns/parked" in message
    assert "needs verb 'answer'" in message
    message = refused(lambda: patch(bob, runs, parked, {"spec": {"events": {"window": "open"}}}))
    assert "needs verb 'answer'" in message

    # Creating a run acts as its ServiceAccount: erin may use "default" only, bob none.
    created = client.CustomObjectsApi(people["erin"]).create_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        "agentruns",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AgentRun",
            "metadata": {"name": "by-erin"},
            "spec": asking(),
        },
    )
    assert created["spec"]["createdBy"]["username"] == "erin"
    assert created["spec"]["createdBy"]["stamp"]
    runs.wait_state("by-erin", "waiting_input")
    for who, name in (("erin", "as-deployer"), ("bob", "by-bob")):
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AgentRun",
            "metadata": {"name": name},
            "spec": {**asking(), "serviceAccountName": "deployer" if who == "erin" else "default"},
        }
        message = refused(
            lambda body=body, who=who: client.CustomObjectsApi(people[who]).create_namespaced_custom_object(
                GROUP, VERSION, ns, "agentruns", body
            )
        )
        sa = body["spec"]["serviceAccountName"]
        assert (
            f"user {who!r} may not use serviceaccounts/{sa} in namespace '{ns}': needs verb 'use'" in message
        )

    # Nothing moved, nothing was applied; the holders of the verbs go on.
    assert runs.state(paying) == "waiting_approval"
    assert runs.state(parked) == "waiting_input"
    assert refsystem.counts() == {}
    patch(people["erin"], runs, "by-erin", {"spec": {"answers": {"confirm": "yes"}}})
    patch(people["alice"], runs, paying, decision)
    runs.wait_state(paying, "completed")
    runs.wait_state("by-erin", "completed")
    assert list(refsystem.counts().values()) == [1]


@pytest.mark.local_plane("users", "webhook")
def test_with_the_webhook_requests_are_append_only_whatever_the_patch(
    kube: KubeEnv,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    webhook_operator()
    admin = kube.api
    name = runs.create(asking(), name="answered")
    runs.wait_state(name, "waiting_input")
    runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    answers = {"spec": {"answers": {"confirm": "yes"}}}

    merge_null = refused(lambda: patch(admin, runs, name, {"spec": {"answers": None}}))
    assert_withdrawal_refused(merge_null, "answers")
    key_null = refused(lambda: patch(admin, runs, name, {"spec": {"answers": {"confirm": None}}}))
    assert_withdrawal_refused(key_null, "answers")
    json_remove = refused(
        lambda: patch(
            admin, runs, name, [{"op": "remove", "path": "/spec/answers"}], "application/json-patch+json"
        )
    )
    assert_withdrawal_refused(json_remove, "answers")
    replace = [{"op": "replace", "path": "/spec/answers/confirm", "value": "no"}]
    json_replace = refused(lambda: patch(admin, runs, name, replace, "application/json-patch+json"))
    assert "spec.answers" in json_replace
    assert "cannot be changed" in json_replace

    # Server-side apply: the manager that applied the answer applies again without it.
    applied = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRun", "metadata": {"name": "applied"}}
    runs.create(asking(), name="applied")
    runs.wait_state("applied", "waiting_input")
    patch(admin, runs, "applied", {**applied, **answers}, "application/apply-patch+yaml")
    message = refused(
        lambda: patch(admin, runs, "applied", {**applied, "spec": {}}, "application/apply-patch+yaml")
    )
    assert_withdrawal_refused(message, "answers")

    paying = runs.create(payment(refsystem.url), name="paying")
    request = runs.wait_state(paying, "waiting_approval")["status"]["approvalRequest"]
    patch(
        people["alice"],
        runs,
        paying,
        {"spec": {"approvals": {"pay-1": {"digest": request["digest"], "decision": "approve"}}}},
    )
    message = refused(lambda: patch(admin, runs, paying, {"spec": {"approvals": None}}))
    assert_withdrawal_refused(message, "approvals")
    message = refused(
        lambda: patch(
            admin, runs, paying, [{"op": "remove", "path": "/spec/approvals"}], "application/json-patch+json"
        )
    )
    assert_withdrawal_refused(message, "approvals")
    done = runs.wait_state(paying, "completed")
    assert done["spec"]["approvals"]["pay-1"]["approver"]["username"] == "alice"
    assert list(refsystem.counts().values()) == [1]
    stored = runs.get(name)
    answer = stored["spec"]["answers"]["confirm"]
    assert answer != "yes"  # sealed by the webhook, and still the one given
    assert unsealed(stored, answer, "answers/confirm") == "yes"


@pytest.mark.local_plane("users", "webhook")
def test_with_the_webhook_off_nothing_unstamped_is_acted_on_and_a_stamped_decision_still_works(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    first = webhook_operator("with-webhook")
    paying = runs.create(payment(refsystem.url), name="paying")
    request = runs.wait_state(paying, "waiting_approval")["status"]["approvalRequest"]
    eventually(lambda: not runs.leases(), Within.COMMIT, "the run's Lease to be released")
    webhook_off(kube, runs, first)
    start_operator("no-webhook", LEASE)

    # An admin writes a decision with a hand-written approver and a forged stamp.
    forged = {
        "digest": request["digest"],
        "decision": "approve",
        "approver": HAND_WRITTEN,
        "decidedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "stamp": FORGED_STAMP,
    }
    runs.patch_spec(paying, {"approvals": {"pay-1": forged}}, stamped=False)
    # Without the webhook, the API server's own rules still keep requests append-only.
    assert_withdrawal_refused(
        refused(lambda: runs.patch_spec(paying, {"approvals": None}, stamped=False)), "approvals"
    )
    asked_again = eventually(
        lambda: (
            (runs.get(paying)["status"].get("approvalRequest") or {}).get("requestId") == "pay-2"
            and runs.get(paying)
        ),
        Within.COMMIT,
        "the run to refuse the forged decision and ask again",
    )
    status = asked_again["status"]
    assert status["state"] == "waiting_approval"
    assert [(r["field"], r["key"], r["reason"]) for r in status["refusedRequests"]] == [
        ("approvals", "pay-1", "StampInvalid")
    ]
    condition = {c["type"]: c for c in status["conditions"]}["RequestRefused"]
    assert (condition["status"], condition["reason"]) == ("True", "StampInvalid")
    assert "approvals[pay-1]" in condition["message"]
    assert [a.get("decision") for a in status["checkpoint"]["approvals"]] == [None, None], "never recorded"
    assert "the decision on pay-1 was refused" in status["approvalRequest"]["policyReason"]
    eventually(lambda: refusal_events(runs, paying), Within.COMMIT, "a RequestRefused Event")
    assert refsystem.counts() == {}, "no effect on a forged decision"

    # Forged cancellations: refused, once each; the run keeps waiting, nothing else is written.
    version = status["stateVersion"]
    for request_id in ("c1", "c2"):
        cancellation = {
            "scope": "task",
            "reason": "forged",
            "requestedBy": HAND_WRITTEN,
            "stamp": FORGED_STAMP,
        }
        runs.patch_spec(paying, {"cancellations": {request_id: cancellation}}, stamped=False)
        eventually(
            lambda request_id=request_id: any(
                f"cancellations[{request_id}]" in m for m in refusal_events(runs, paying)
            ),
            Within.COMMIT,
            f"the refusal of cancellation {request_id}",
        )
    run = runs.get(paying)
    assert run["status"]["state"] == "waiting_approval"
    assert run["status"]["stateVersion"] == version, "a refusal is not a transition"
    assert [r["key"] for r in run["status"]["refusedRequests"]] == ["pay-1", "c1", "c2"]
    messages = refusal_events(runs, paying)
    assert len(messages) == 3, f"one Event per refused request, not one per look: {messages}"
    assert not run["status"].get("cancellation")

    # The webhook is back: a properly stamped decision on the new request is acted on.
    again = webhook_operator("webhook-again")
    runs.await_webhook()
    second = runs.get(paying)["status"]["approvalRequest"]
    decision = {"spec": {"approvals": {"pay-2": {"digest": second["digest"], "decision": "approve"}}}}
    patch(people["alice"], runs, paying, decision)
    done = runs.wait_state(paying, "completed")
    assert again.alive
    assert [
        (a["requestId"], a.get("decision"), a.get("decidedBy"))
        for a in done["status"]["checkpoint"]["approvals"]
    ] == [
        ("pay-1", None, None),
        ("pay-2", "approved", "alice"),
    ]
    assert_history_is_gapless(done)
    assert list(refsystem.counts().values()) == [1]
    assert refsystem.duplicates() == []


def impersonations(plane: LocalControlPlane, user: str) -> list[str]:
    """Requests made as ``user`` through impersonation, from the API server's audit log."""
    found: list[str] = []
    with plane.audit_log_path.open("rb") as log:
        for line in log:  # hundreds of MB by the end of a suite: parse only what can match
            if b'"impersonatedUser"' not in line or user.encode() not in line:
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line still being written
            if (entry.get("impersonatedUser") or {}).get("username") == user:
                ref = entry.get("objectRef") or {}
                found.append(f"{entry.get('verb')} {ref.get('resource')}/{ref.get('name')}")
    return found


@pytest.mark.local_plane("audit", "webhook")
def test_a_run_whose_service_account_is_not_proven_fails_and_does_nothing_as_it(
    kube: KubeEnv,
    plane: LocalControlPlane,
    start_operator: Callable[..., OperatorProcess],
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    readable_configmap: str,
    deployer: str,
) -> None:
    sa_user = f"system:serviceaccount:{runs.namespace}:{deployer}"
    read = {
        "name": "read",
        "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": readable_configmap}},
    }
    effect = {
        "name": "pay",
        "effect": {
            "effect": "http.post",
            "target": {"url": f"{refsystem.url}/effects"},
            "arguments": {"n": 1},
        },
    }
    spec = {
        "taskType": "e2e",
        "objective": "read and pay as the deployer",
        "serviceAccountName": deployer,
        "steps": [read, effect, {"name": "done", "complete": {}}],
    }
    # Control: created through the webhook, the same run reads as the deployer and pays.
    op = webhook_operator("with-webhook")
    runs.create(spec, name="stamped")
    runs.wait_state("stamped", "completed")
    assert any(call.endswith(f"configmaps/{readable_configmap}") for call in impersonations(plane, sa_user))
    assert len(refsystem.counts()) == 1
    eventually(lambda: not runs.leases(), Within.COMMIT, "the run's Lease to be released")

    webhook_off(kube, runs, op)
    seen_before = len(impersonations(plane, sa_user))
    start_operator("no-webhook", LEASE)
    forged = {**spec, "createdBy": {"username": "admin", "groups": ["system:masters"], "stamp": FORGED_STAMP}}
    runs.create(forged, name="forged")
    runs.create(spec, name="unstamped", stamped=False)  # as an admin would, the webhook off
    for name, reason in (("forged", "StampInvalid"), ("unstamped", "Unstamped")):
        run = runs.wait_state(name, "failed", "completed")
        status = run["status"]
        assert status["outcome"]["reason"] == "ServiceAccountNotAuthorized", status["outcome"]
        assert status["outcome"]["message"].startswith(f"{reason}: ")
        assert f"ServiceAccount '{deployer}'" in status["outcome"]["message"]
        succeeded = {c["type"]: c for c in status["conditions"]}["Succeeded"]
        assert (succeeded["status"], succeeded["reason"]) == ("False", "ServiceAccountNotAuthorized")
        assert [h["event"] for h in status["history"]] == ["rejected"]
        assert not status["checkpoint"]["evidence"]
        assert not status["checkpoint"]["toolCalls"]
        eventually(
            lambda name=name: [e for e in runs.events(name) if e.reason == "ServiceAccountNotAuthorized"],
            Within.COMMIT,
            f"the ServiceAccountNotAuthorized Event of {name}",
        )
    records = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")[
        "items"
    ]
    assert len(records) == 1, "only the stamped run's effect is in the ledger"
    assert len(refsystem.counts()) == 1
    assert len(impersonations(plane, sa_user)) == seen_before, "nothing was done as the ServiceAccount"


@pytest.mark.local_plane("audit", "webhook")
def test_a_run_re_created_under_its_name_with_a_copied_created_by_is_not_acted_on(
    kube: KubeEnv,
    plane: LocalControlPlane,
    start_operator: Callable[..., OperatorProcess],
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    readable_configmap: str,
    deployer: str,
) -> None:
    """Issue 30, item 4: someone who may delete and create runs, but not use the ServiceAccount,
    deletes a run and, with the webhook off, creates it again under its name with its ``createdBy``
    copied. The stamp covers the time it was made; the API server's creationTimestamp of the new
    object is later: nothing is done as the ServiceAccount."""
    sa_user = f"system:serviceaccount:{runs.namespace}:{deployer}"
    read = {
        "name": "read",
        "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": readable_configmap}},
    }
    pay = {
        "name": "pay",
        "effect": {
            "effect": "http.post",
            "target": {"url": f"{refsystem.url}/effects"},
            "arguments": {"n": 1},
        },
    }
    spec = {
        "taskType": "e2e",
        "objective": "read and pay as the deployer",
        "serviceAccountName": deployer,
        "steps": [read, pay, {"name": "done", "complete": {}}],
    }
    # A normal creation, stamped by the webhook itself (not the test kit): acted on.
    op = webhook_operator("with-webhook")
    runs.await_webhook()
    runs.create(spec, name="payday", stamped=False)
    original = runs.wait_state("payday", "completed")
    copied = original["spec"]["createdBy"]
    assert copied["stamp"]
    assert copied["stampedAt"], "the stamp's time is stored with it"
    assert any(call.endswith(f"configmaps/{readable_configmap}") for call in impersonations(plane, sa_user))
    assert len(refsystem.counts()) == 1
    records_before = {
        r["metadata"]["name"]
        for r in runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")[
            "items"
        ]
    }

    runs.custom.delete_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentruns", "payday")

    def gone() -> bool:
        try:
            runs.get("payday")
        except client.ApiException as err:
            return err.status == 404
        return False

    eventually(gone, Within.COMMIT, "the deleted run to be gone (its finalizer released)")
    webhook_off(kube, runs, op)
    start_operator("no-webhook", LEASE)
    seen_before = len(impersonations(plane, sa_user))
    created = datetime.fromisoformat(original["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    eventually(
        lambda: datetime.now(UTC) > created + CREATION_SKEW + timedelta(seconds=1),
        Within.COMMIT,
        "the copy to be created later than the stamp's skew after the original",
    )
    runs.create({**spec, "createdBy": copied}, name="payday", stamped=False)
    status = runs.wait_state("payday", "failed", "completed")["status"]
    assert status["outcome"]["reason"] == "ServiceAccountNotAuthorized", status["outcome"]
    message = status["outcome"]["message"]
    assert message.startswith("StampNotOfThisObject: "), message
    assert f"stamped at {copied['stampedAt']}" in message
    assert f"ServiceAccount '{deployer}'" in message
    assert [h["event"] for h in status["history"]] == ["rejected"]
    assert not status["checkpoint"]["evidence"]
    records_after = {
        r["metadata"]["name"]
        for r in runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")[
            "items"
        ]
    }
    assert records_after <= records_before, "no new action in the ledger"
    assert len(refsystem.counts()) == 1, "no effect applied by the copy"
    assert len(impersonations(plane, sa_user)) == seen_before, "nothing was done as the ServiceAccount"


@pytest.mark.local_plane("webhook")
def test_a_retry_token_written_with_the_webhook_off_does_not_block_the_retry(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
) -> None:
    """The same shape as an unstamped reconciliation (issue 30, item 2): ``kubectl agentrun retry``
    writes ``retry-<stateVersion>``; a token written by hand under that name (the webhook off) is
    refused, and the webhook stamps only a token that changes, so the same token again would be no
    request at all, and the run would stay quarantined for good. The plugin takes the next one."""
    op = webhook_operator("with-webhook")
    name = runs.create(asking())
    waiting = runs.wait_state(name, "waiting_input", timeout=Within.COMMIT)
    good = waiting["status"]["checkpoint"]
    status_api = client.CustomObjectsApi(kube.api)
    # An admin's status write the operator cannot verify: quarantined, IntegrityFailed.
    forged = {"status": {"checkpoint": {"integrity": FORGED_STAMP}}}
    status_api.patch_namespaced_custom_object_status(
        GROUP, VERSION, runs.namespace, "agentruns", name, forged
    )
    run = runs.wait_state(name, "quarantined", timeout=Within.COMMIT)
    assert run["status"]["outcome"]["reason"] == "IntegrityFailed", run["status"]["outcome"]
    # The admin restores the checkpoint (the run stays quarantined until a retry).
    restored = {"status": {"checkpoint": good}}
    status_api.patch_namespaced_custom_object_status(
        GROUP, VERSION, runs.namespace, "agentruns", name, restored
    )

    webhook_off(kube, runs, op)
    no_webhook = start_operator("no-webhook", LEASE)
    token = f"retry-{runs.get(name)['status']['stateVersion']}"
    runs.patch_spec(name, {"retryQuarantine": token}, stamped=False)  # by hand, unstamped

    def refused_token() -> dict[str, Any] | None:
        for entry in runs.get(name)["status"].get("refusedRequests") or []:
            if (entry["field"], entry["key"]) == ("retryQuarantine", token):
                return dict(entry)
        return None

    assert eventually(refused_token, Within.COMMIT, f"{token} to be refused")["reason"] == "Unstamped"
    assert runs.state(name) == "quarantined"

    no_webhook.stop()
    webhook_operator("webhook-back")
    runs.await_webhook()
    said = kubectl_plugin.retry(status_api, runs.namespace, name)
    released = runs.wait_state(name, "waiting_input", timeout=Within.COMMIT)  # out of quarantine
    assert said.endswith(f"retry {token}.2 requested"), said
    assert released["spec"]["retryQuarantine"] == f"{token}.2"
    assert released["status"]["quarantineRetried"] == f"{token}.2"
    assert released["spec"]["retryQuarantineRequest"]["stamp"], "stamped by the webhook"
    refused = [(e["field"], e["key"], e["reason"]) for e in released["status"].get("refusedRequests") or []]
    assert ("retryQuarantine", token, "Unstamped") in refused
