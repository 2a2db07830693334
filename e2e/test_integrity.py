"""No record can be forged: two lines, each tested on its own against the real API server.

A user granted too much by RBAC (``create`` on actionrecords, ``patch`` on ``agentruns/status``)
tries to have an effect dispatched without a run, and to approve an effect by writing the run's
checkpoint. The first line is the chart's ValidatingAdmissionPolicy
(``charts/durable-agents/files/admission-policy.yaml``): such writes are refused at admission for
anyone but the operator. The second line holds with the policy removed: the dispatcher sends only
an intent its run's stamped checkpoint holds (a forged record ends ``failed``/``NotInCheckpoint``),
and the engine quarantines a checkpoint whose integrity stamp does not verify
(``IntegrityFailed``), untouched, until an authorised retry after it is restored. The reference
system counts every effect applied: none of the forgeries applies one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port, metric, scrape

REPO = Path(__file__).resolve().parents[1]
POLICY_BODY = REPO / "charts/durable-agents/files/admission-policy.yaml"
OPERATOR_USER = "durable-agents-operator"  # as e2e/conftest.py binds the chart's rules to it
REFUSAL = "only the durable-agents operator (durable-agents-operator) writes ActionRecords"
LEASE = 2
FORGED_AMOUNT = 1000000


@pytest.fixture
def mallory(kube: KubeEnv, plane: LocalControlPlane, namespace: str) -> client.ApiClient:
    """A user RBAC grants too much here: ActionRecords and the status of runs, as only the
    operator should have."""
    rules = [
        {"apiGroups": [GROUP], "resources": ["agentruns", "actionrecords"], "verbs": ["get", "list"]},
        {"apiGroups": [GROUP], "resources": ["actionrecords"], "verbs": ["create", "delete"]},
        {
            "apiGroups": [GROUP],
            "resources": ["agentruns/status", "actionrecords/status"],
            "verbs": ["get", "update", "patch"],
        },
    ]
    grant(kube, namespace, "mallory", rules, name="over-broad")
    return kube.user_client("mallory", ["forgers"])


@pytest.fixture
def approver(kube: KubeEnv, plane: LocalControlPlane, namespace: str) -> client.ApiClient:
    """alice may approve runs here (the custom verb the webhook asks RBAC about)."""
    grant(
        kube, namespace, "alice", rule(GROUP, "agentruns", "get", "list", "patch", "approve"), name="approver"
    )
    return kube.user_client("alice", ["approvers"])


def admission_policy(name: str, operator: str) -> dict[str, Any]:
    """The chart's policy, made as templates/admission-policy.yaml makes it: the body from the
    chart's file, with the operator's user name as its one variable."""
    body = yaml.safe_load(POLICY_BODY.read_text())
    assert "variables" not in body, "the operator variable is added by whoever makes the policy"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"variables": [{"name": "operator", "expression": f"'{operator}'"}], **body},
    }


@pytest.fixture
def admission_line(kube: KubeEnv, namespace: str) -> Iterator[str]:
    """The chart's policy, bound to this test's namespace only; removed afterwards."""
    api = client.AdmissionregistrationV1Api(kube.api)
    name = f"operator-writes-{namespace}"
    api.create_validating_admission_policy(admission_policy(name, OPERATOR_USER))
    api.create_validating_admission_policy_binding(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
    yield name
    api.delete_validating_admission_policy_binding(name)
    api.delete_validating_admission_policy(name)


def payment(url: str, *, approval: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "taskType": "payment",
        "objective": "pay the invoice, once",
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
    }
    if approval:
        spec["policyRef"] = {"name": "payments"}
    return spec


def approval_policy(runs: Runs) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "payments"},
        "spec": {
            "version": "v1",
            "tiers": {"http.post": "consequential"},
            "approvalRequiredTiers": ["consequential"],
            "approvers": {"verb": "approve", "resource": "agentruns"},
            "approvalExpiry": "1h",
        },
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)


def forged_record(key: str, run: str, url: str, *, service_account: str = "payments-admin") -> dict[str, Any]:
    """An ActionRecord as someone with ``create`` on actionrecords writes it: a POST of 1,000,000."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ActionRecord",
        "metadata": {"name": action_record_name(key)},
        "spec": {
            "idempotencyKey": key,
            "runRef": {"name": run, "uid": "00000000-0000-4000-8000-000000000000"},
            "serviceAccountName": service_account,
            "stepIndex": 0,
            "effect": "http.post",
            "tier": "read-only",
            "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
            "arguments": {"amount": FORGED_AMOUNT},
        },
    }


def create_record(api: client.ApiClient, namespace: str, body: dict[str, Any], **kwargs: Any) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "actionrecords", body, **kwargs
    )


def record(runs: Runs, name: str) -> dict[str, Any]:
    out: dict[str, Any] = runs.custom.get_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "actionrecords", name
    )
    return out


def forge_approval(run: dict[str, Any], by: str = "mallory") -> dict[str, Any]:
    """The run's status as someone with ``patch`` on agentruns/status rewrites it: its approval
    request recorded as approved, and the run moved on to ``resume_validation``."""
    forged = copy.deepcopy(run)
    status, cp = forged["status"], forged["status"]["checkpoint"]
    cp["approvals"][-1].update(decision="approved", decidedBy=by, decidedAt="2030-01-01T00:00:00Z")
    version = status["stateVersion"] + 1
    cp["position"].update(state="resume_validation", stateVersion=version)
    status.update(state="resume_validation", stateVersion=version)
    status.pop("approvalRequest", None)
    status.pop("waitingFor", None)
    return forged


def write_status(api: client.ApiClient, runs: Runs, run: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = client.CustomObjectsApi(api).replace_namespaced_custom_object_status(
        GROUP, VERSION, runs.namespace, "agentruns", run["metadata"]["name"], run
    )
    return out


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def refused(call: Callable[[], object]) -> str:
    with pytest.raises(client.ApiException) as err:
        call()
    assert err.value.status == 403, err.value.body
    return str(err.value.body)


def parked(runs: Runs, name: str, state: str) -> dict[str, Any]:
    """The run parked in ``state``, read once the operator's retention finalizer is on it: that
    patch follows a run's first parking, and a status replaced from an earlier read would conflict."""
    runs.wait_state(name, state, timeout=Within.COMMIT)

    def finalized() -> dict[str, Any] | None:
        run = runs.get(name)
        return (
            run
            if "durable-agents.io/cancel-before-delete" in (run["metadata"].get("finalizers") or [])
            else None
        )

    return eventually(finalized, Within.COMMIT, f"the retention finalizer on {name}")


def quarantined(runs: Runs, name: str) -> dict[str, Any]:
    run = runs.wait_state(name, "quarantined", "completed", "failed", timeout=Within.COMMIT)
    status = run["status"]
    assert status["state"] == "quarantined", status
    assert status["outcome"]["reason"] == "IntegrityFailed", status["outcome"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Quarantined"]["status"], conditions["Quarantined"]["reason"]) == (
        "True",
        "IntegrityFailed",
    )
    return run


# --- the first line: admission -------------------------------------------------------------------


@pytest.mark.local_plane("users")
def test_the_admission_policy_refuses_everyone_but_the_operator(
    kube: KubeEnv,
    admission_line: str,
    mallory: client.ApiClient,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    namespace = runs.namespace
    forged = forged_record("no-run/0/pay", "no-run", refsystem.url)

    def refused_at_admission() -> str | None:
        try:  # a dry run: nothing is stored while the policy is not in force yet
            create_record(mallory, namespace, forged, dry_run="All")
        except client.ApiException as err:
            return str(err.body) if err.status == 403 and REFUSAL in str(err.body) else None
        return None

    # The message is the policy's messageExpression (it names the operator): it evaluates.
    eventually(refused_at_admission, Within.COMMIT, "the admission policy to be in force")
    message = refused(lambda: create_record(mallory, namespace, forged))
    assert "durable-agents: mallory may not CREATE actionrecords" in message
    assert REFUSAL in message

    # The operator, as its own user, still does all of its work here, under the policy.
    start_operator("admitted", LEASE)
    name = runs.create(payment(refsystem.url))
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    key = idempotency_key(done["metadata"]["uid"], 0, "pay")
    assert refsystem.counts() == {key: 1}

    # Nobody else writes a run's status or the ledger: not mallory, not even a cluster admin.
    forged_status = copy.deepcopy(done)
    forged_status["status"]["state"] = "resume_validation"
    message = refused(lambda: write_status(mallory, runs, forged_status))
    assert "durable-agents: mallory may not UPDATE agentruns/status" in message
    assert REFUSAL in message
    assert "may not UPDATE agentruns/status" in refused(lambda: write_status(kube.api, runs, forged_status))
    ledger = record(runs, action_record_name(key))
    ledger["status"]["state"] = "failed"
    message = refused(
        lambda: client.CustomObjectsApi(mallory).replace_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "actionrecords", ledger["metadata"]["name"], ledger
        )
    )
    assert "may not UPDATE actionrecords/status" in message
    message = refused(
        lambda: client.CustomObjectsApi(mallory).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, "actionrecords", ledger["metadata"]["name"]
        )
    )
    assert "may not DELETE actionrecords" in message
    assert runs.get(name)["status"] == done["status"]
    assert refsystem.counts() == {key: 1}


# --- the second line, with the admission policy removed: the dispatcher ---------------------------


@pytest.mark.local_plane("users")
def test_a_forged_action_record_is_never_dispatched(
    mallory: client.ApiClient,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    namespace = runs.namespace
    port = free_port()
    start_operator("dispatcher", LEASE, DURABLE_AGENTS_METRICS_PORT=str(port))
    # A real run, to forge against; it completes with its own effect, once.
    legit = runs.create(payment(refsystem.url))
    done = runs.wait_state(legit, "completed", timeout=Within.RUN)
    uid = done["metadata"]["uid"]
    own_key = idempotency_key(uid, 0, "pay")
    assert refsystem.counts() == {own_key: 1}

    # No run at all, as a powerful ServiceAccount; and a key of the real run it never intended.
    orphan = forged_record("made-up-run/0/pay", "made-up-run", refsystem.url)
    stray_key = f"{uid}/1/pay-again"
    stray = forged_record(stray_key, legit, refsystem.url, service_account="default")
    for body in (orphan, stray):
        create_record(mallory, namespace, body)

    def failed(name: str) -> dict[str, Any] | None:
        status = record(runs, name).get("status") or {}
        return status if status.get("state") in ("failed", "succeeded", "outcome_unknown") else None

    orphan_status = eventually(
        lambda: failed(orphan["metadata"]["name"]), Within.COMMIT, "the orphan refused"
    )
    stray_status = eventually(lambda: failed(stray["metadata"]["name"]), Within.COMMIT, "the stray refused")
    for status in (orphan_status, stray_status):
        assert (status["state"], status["reason"]) == ("failed", "NotInCheckpoint"), status
    assert "its run 'made-up-run' does not exist" in orphan_status["message"]
    assert f"holds no pending action with key '{stray_key}'" in stray_status["message"]
    assert refsystem.counts() == {own_key: 1}, "no forged effect was applied"
    assert refsystem.applied(orphan["spec"]["idempotencyKey"]) == 0
    assert refsystem.applied(stray_key) == 0

    # Visible: an Event on each record (and on the run it names), and a metric.
    for involved in (orphan["metadata"]["name"], stray["metadata"]["name"], legit):
        eventually(
            lambda: "NotInCheckpoint" in {e.reason for e in runs.events(involved)},  # noqa: B023
            Within.COMMIT,  # the operator's own writes, after the record's (not a local effect)
            f"a NotInCheckpoint Event on {involved}",
        )
    text = scrape(port)
    assert (
        metric(text, 'durable_agents_action_dispatches_total{answer="NotInCheckpoint",effect="http.post"}')
        == 2
    )
    assert runs.get(legit)["status"]["state"] == "completed"


# --- the second line: the checkpoint's integrity stamp -------------------------------------------


def approve(api: client.ApiClient, runs: Runs, name: str) -> None:
    request = runs.wait_state(name, "waiting_approval", timeout=Within.COMMIT)["status"]["approvalRequest"]
    patch = {
        "spec": {"approvals": {request["requestId"]: {"digest": request["digest"], "decision": "approve"}}}
    }
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentruns", name, patch
    )


@pytest.mark.local_plane("users", "webhook")
def test_a_forged_approval_in_the_checkpoint_quarantines_the_run_untouched_until_restored(
    kube: KubeEnv,
    mallory: client.ApiClient,
    approver: client.ApiClient,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    approval_policy(runs)
    port = free_port()
    webhook_operator(DURABLE_AGENTS_METRICS_PORT=str(port))
    name = runs.create(payment(refsystem.url, approval=True))
    waiting = parked(runs, name, "waiting_approval")
    backup = copy.deepcopy(waiting)  # what the admin's backup holds (e.g. kubectl get -o yaml)

    forged = write_status(mallory, runs, forge_approval(waiting))
    stored = canonical(forged["status"]["checkpoint"])
    run = quarantined(runs, name)
    assert "integrity stamp does not verify" in run["status"]["outcome"]["message"]
    assert canonical(run["status"]["checkpoint"]) == stored, (
        "the forged checkpoint is kept as it is, to inspect"
    )
    assert refsystem.counts() == {}, "nothing was dispatched on the forged approval"
    assert (
        runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")["items"]
        == []
    )
    event = eventually(
        lambda: next((e for e in runs.events(name) if e.reason == "Quarantine"), None),
        Within.COMMIT,  # posted by the operator in the background, after the quarantine's commit
        "the quarantine's Event",
    )
    assert event.type == "Warning"
    assert "integrity stamp does not verify" in event.message, event.message
    integrity_failures = 'durable_agents_quarantines_total{reason="IntegrityFailed"}'
    eventually(
        lambda: metric(scrape(port), integrity_failures, default=0) == 1,
        Within.MOMENT,
        "the quarantine to be counted once",
    )

    # The admin restores the checkpoint from the backup (the run stays quarantined), then retries.
    current = runs.get(name)
    current["status"]["checkpoint"] = backup["status"]["checkpoint"]
    write_status(kube.api, runs, current)
    runs.patch_spec(name, {"retryQuarantine": "restored-from-backup"})
    asked = eventually(
        lambda: (runs.get(name)["status"].get("approvalRequest") or {}).get("requestId") == "pay-2",
        Within.COMMIT,
        "the released run to ask for approval again",
    )
    assert asked
    assert refsystem.counts() == {}
    approve(approver, runs, name)
    done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
    assert done["status"]["state"] == "completed", done["status"]
    # The forged write shows as the one gap in the history: version 3 was never committed here.
    history = done["status"]["history"]
    forged_version = forged["status"]["stateVersion"]
    assert [h["stateVersion"] for h in history] == [
        *range(1, forged_version),
        *range(forged_version + 1, forged_version + 1 + len(history) - (forged_version - 1)),
    ]
    quarantine = next(h for h in history if h["event"] == "quarantine")
    assert (quarantine["from"], quarantine["stateVersion"]) == ("resume_validation", forged_version + 1)
    events_seen = [h["event"] for h in history]
    assert events_seen.index("quarantine") < events_seen.index("release_quarantine"), events_seen
    assert done["status"]["quarantineRetried"] == "restored-from-backup"
    assert list(refsystem.counts().values()) == [1], "applied once, after a real approval"
    approvals = done["status"]["checkpoint"]["approvals"]
    assert [(a["requestId"], a.get("decidedBy")) for a in approvals] == [("pay-1", None), ("pay-2", "alice")]


@pytest.mark.local_plane("users")
def test_a_forged_intent_and_its_record_are_held_back_and_never_sent(
    mallory: client.ApiClient,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    """Both forgeries at once: the run's own effect, written into its checkpoint as an intent
    (skipping its approval), and the matching ActionRecord. The record is exactly what the run's
    step asks for, so only the stamp tells it apart: the dispatcher sends nothing, and the run is
    quarantined."""
    approval_policy(runs)
    port = free_port()
    start_operator("both", LEASE, DURABLE_AGENTS_METRICS_PORT=str(port))
    name = runs.create(payment(refsystem.url, approval=True))
    waiting = parked(runs, name, "waiting_approval")
    key = idempotency_key(waiting["metadata"]["uid"], 0, "pay")
    forged = forge_approval(waiting)
    cp, status = forged["status"]["checkpoint"], forged["status"]
    cp["pendingActions"] = [
        {
            "idempotencyKey": key,
            "actionRecordName": action_record_name(key),
            "effect": "http.post",
            "tier": "consequential",
            "stepIndex": 0,
            "approvalRequestId": cp["approvals"][-1]["requestId"],
        }
    ]
    cp["position"]["state"] = status["state"] = "waiting_external"
    step = waiting["spec"]["steps"][0]["effect"]
    body = forged_record(key, name, refsystem.url, service_account="default")
    body["spec"].update(tier="consequential", target=step["target"], arguments=step["arguments"])
    write_status(mallory, runs, forged)
    create_record(mallory, runs.namespace, body)

    quarantined(runs, name)
    held = 'durable_agents_action_dispatches_total{answer="Unverified",effect="http.post"}'
    eventually(
        lambda: metric(scrape(port), held, default=0) >= 1,
        Within.COMMIT,
        "the dispatcher to hold the record back",
    )
    assert record(runs, body["metadata"]["name"]).get("status", {}).get("state", "intent") == "intent"
    assert refsystem.counts() == {}, "the run's own effect was not sent on a forged checkpoint"
