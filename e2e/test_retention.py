"""Retention: finished runs deleted on time with their ActionRecords and children, a compact
AgentRunRecord kept and readable; a run with an unknown outcome or a running child is not let go;
a waiting run a user deletes is canceled first and the effects that happened are in its record.

The operator runs as a separate process with the chart's RBAC; effects go to the reference
authoritative system. The local control plane runs kube-controller-manager's garbage collector.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION, ActionRecordStatus
from durable_agents.core.engine import child_run_name
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents.core.outcome_stamps import stamp_outcome
from durable_agents.core.retention import FINALIZER
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import session_keyring
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

LEASE = 2
DONE = {"name": "done", "complete": {"result": "ok"}}
ASK = {"name": "confirm", "ask": {"question": "go on? (secret words)"}}


def pay(url: str, name: str = "pay", *, query_url: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "effect": {
            "effect": "http.post",
            "target": {"url": f"{url}/effects", "queryUrl": query_url or f"{url}/effects"},
            "arguments": {"amount": 10, "note": "card 4111-1111"},
        },
    }


def run_spec(*steps: dict[str, Any], policy: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"taskType": "retention", "objective": "be kept, then go", "steps": list(steps)}
    if policy is not None:
        spec["policyRef"] = {"name": policy}
    return spec


def make_policy(runs: Runs, name: str, **retention: Any) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": name},
        "spec": {"version": "v1", "approvalRequiredTiers": [], "retention": retention},
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)


def gone(runs: Runs, name: str) -> bool:
    try:
        runs.get(name)
    except client.ApiException as err:
        if err.status == 404:
            return True
        raise
    return False


def action_records(runs: Runs, run_name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = runs.custom.list_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "actionrecords", label_selector=f"durable-agents.io/run={run_name}"
    )["items"]
    return items


def run_records(runs: Runs, run_name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = runs.custom.list_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentrunrecords", label_selector=f"durable-agents.io/run={run_name}"
    )["items"]
    return items


def the_record(runs: Runs, run_name: str) -> dict[str, Any]:
    found = eventually(lambda: run_records(runs, run_name), Within.COMMIT, f"the record of {run_name}")
    assert len(found) == 1, found
    return found[0]


def parse(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def grant_agentruns(kube: KubeEnv, namespace: str) -> None:
    """The runs' ServiceAccount may start and cancel child runs (they are made AS that account)."""
    children = rule(GROUP, "agentruns", "get", "create", "patch")
    grant(kube, namespace, service_account("default", namespace), children, name="start-children")


def closed_port() -> int:
    """A loopback port nothing listens on: a query there never gets an answer."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_finished_runs_are_deleted_on_time_with_their_action_records_and_the_record_is_kept(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    make_policy(runs, "brief", ttlAfterFinished="4s")
    make_policy(runs, "forever")
    start_operator("retention", LEASE)
    short = runs.create(run_spec(pay(refsystem.url), DONE, policy="brief"))
    kept = runs.create(run_spec(pay(refsystem.url), DONE, policy="forever"))
    done = runs.wait_state(short, "completed", timeout=Within.RUN)
    uid, finished = done["metadata"]["uid"], parse(done["status"]["stateSince"])
    assert FINALIZER in eventually(
        lambda: runs.get(short)["metadata"].get("finalizers"), Within.COMMIT, "finalizer"
    )
    assert len(action_records(runs, short)) == 1
    eventually(lambda: gone(runs, short), Within.RUN, f"{short} deleted after its retention")
    deleted_after = time.time() - finished
    assert deleted_after >= 4.0, f"deleted {deleted_after:.1f}s after finishing: before its TTL"
    assert action_records(runs, short) == [], "its ActionRecords go with it"

    record = the_record(runs, short)
    spec = record["spec"]
    assert spec["why"] == "retention"
    assert spec["run"]["uid"] == uid
    assert spec["state"] == "completed"
    assert spec["outcome"]["reason"]
    assert parse(spec["finishedAt"]) == finished
    assert parse(spec["recordedAt"]) >= finished + 4.0
    assert [h["to"] for h in spec["history"]][-1] == "completed"
    pay_key = idempotency_key(uid, 0, "pay", 0)
    assert [(e["idempotencyKey"], e["state"]) for e in spec["ledger"]] == [(pay_key, "succeeded")]
    assert spec["ledger"][0]["actionRecord"] == action_record_name(pay_key)
    text = json.dumps(record)
    assert "4111" not in text, "no argument in clear"
    assert "sealed:" not in text, "no sealed value either"
    assert "ownerReferences" not in record["metadata"], "the record outlives the run"

    # The run whose policy keeps runs is still there, with its ledger, and has no record.
    runs.wait_state(kept, "completed")
    assert not gone(runs, kept)
    assert len(action_records(runs, kept)) == 1
    assert run_records(runs, kept) == []
    assert refsystem.counts() == {
        pay_key: 1,
        idempotency_key(runs.get(kept)["metadata"]["uid"], 0, "pay", 0): 1,
    }


def test_a_waiting_run_deleted_by_a_user_is_canceled_first_and_its_effects_are_in_its_record(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    start_operator("delete-waiting", LEASE)
    name = runs.create(run_spec(pay(refsystem.url), ASK, pay(refsystem.url, "pay-again"), DONE))
    waiting = runs.wait_state(name, "waiting_input", timeout=Within.RUN)
    uid = waiting["metadata"]["uid"]
    eventually(
        lambda: FINALIZER in (runs.get(name)["metadata"].get("finalizers") or []), Within.COMMIT, "finalizer"
    )
    runs.custom.delete_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentruns", name)
    eventually(lambda: gone(runs, name), Within.RUN, f"{name} canceled, recorded and let go")

    spec = the_record(runs, name)["spec"]
    assert spec["why"] == "deleted"
    assert spec["state"] == "canceled", "canceled before it went"
    assert spec["outcome"]["reason"] == "Canceled"
    events = [h["event"] for h in spec["history"]]
    assert "cancel_requested" in events
    assert events[-1] == "cancel_finished"
    assert spec["cancellation"]["requestId"] == "deleted"
    assert [(e["step"], e["state"]) for e in spec["cancellation"]["unreversedEffects"]] == [
        ("pay", "succeeded")
    ]
    pay_key = idempotency_key(uid, 0, "pay", 0)
    assert [(e["idempotencyKey"], e["state"]) for e in spec["ledger"]] == [(pay_key, "succeeded")]
    assert action_records(runs, name) == []
    assert refsystem.counts() == {pay_key: 1}, "no new work after the deletion"
    assert "secret words" not in json.dumps(spec)


def test_a_run_with_an_unknown_outcome_is_not_let_go_until_it_is_settled(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    """The effect was applied but its answer lost, and the authoritative system cannot be asked:
    the outcome stays unknown. Deleted by a user (and past its policy's TTL as well), the run is
    canceled, but held by the finalizer while the action is unknown; once the outcome is known the
    run goes, and the effect that happened is in its record."""
    make_policy(runs, "brief", ttlAfterFinished="1s")
    refsystem.inject("drop_after_apply", times=1)
    start_operator("unknown", LEASE, DURABLE_AGENTS_DISPATCH_TIMEOUT="1")
    dead_query = f"http://127.0.0.1:{closed_port()}"
    name = runs.create(run_spec(pay(refsystem.url, query_url=dead_query), DONE, policy="brief"))
    running = runs.wait_state(name, "waiting_external", timeout=Within.RUN)
    record_name = action_record_name(idempotency_key(running["metadata"]["uid"], 0, "pay", 0))

    def record() -> dict[str, Any]:
        out: dict[str, Any] = runs.custom.get_namespaced_custom_object(
            GROUP, VERSION, runs.namespace, "actionrecords", record_name
        )
        return out

    def record_state() -> str | None:
        try:
            return str((record().get("status") or {}).get("state", "intent"))
        except client.ApiException as err:
            if err.status == 404:  # the intent is not written yet
                return None
            raise

    eventually(lambda: record_state() == "outcome_unknown", Within.COMMIT, "an unknown outcome")
    eventually(
        lambda: FINALIZER in (runs.get(name)["metadata"].get("finalizers") or []), Within.COMMIT, "finalizer"
    )
    runs.custom.delete_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentruns", name)
    runs.wait_state(name, "cancel_requested", timeout=Within.COMMIT)
    # Asked again and again, never answered: the run stays, held, while its outcome is unknown.
    eventually(lambda: record()["status"].get("queries", 0) >= 2, Within.RUN, "the dispatcher's queries")
    held = runs.get(name)
    assert held["metadata"].get("deletionTimestamp")
    assert held["status"]["state"] == "cancel_requested"
    assert record()["status"]["state"] == "outcome_unknown"
    assert run_records(runs, name) == []

    # Written settled without the operator's outcome stamp (someone with actionrecords/status):
    # not believed. The dispatcher asks again (the system still cannot answer) and writes it
    # unknown; retention kept the run (and its records) meanwhile.
    def forge() -> bool:
        forged = record()
        status = forged["status"]
        status.update(state="succeeded", reason="Applied", finishedAt=status["lastAttemptAt"])
        try:
            runs.custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, runs.namespace, "actionrecords", record_name, forged
            )
        except client.ApiException as err:
            if err.status == 409:  # the dispatcher asked again in between: read again
                return False
            raise
        return True

    eventually(forge, Within.COMMIT, "the unstamped 'succeeded' written")
    eventually(
        lambda: record()["status"]["state"] == "outcome_unknown",
        Within.RUN,
        "the unstamped 'succeeded' not believed: asked again, still unknown",
    )
    assert runs.get(name)["metadata"].get("deletionTimestamp"), "held: not let go on a forged settled state"
    assert run_records(runs, name) == []

    # A person settles it from the authoritative system's own record (what reconcile would find).
    assert refsystem.counts() == {record()["spec"]["idempotencyKey"]: 1}

    def settle() -> bool:
        settled = record()
        status = settled["status"]
        status.update(state="succeeded", reason="Applied", finishedAt=status["lastAttemptAt"])
        status.pop("outcomeUnknownSince", None)
        # Written as the dispatcher writes a person's answer (kubectl agentrun reconcile --applied):
        # with the operator's outcome stamp. A status without one is not believed (test_ledger_stamps).
        key = settled["spec"]["idempotencyKey"]
        parsed = ActionRecordStatus.model_validate(status)
        status["stamp"] = stamp_outcome(session_keyring(), record_name, key, parsed)
        try:
            runs.custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, runs.namespace, "actionrecords", record_name, settled
            )
        except client.ApiException as err:
            if err.status == 409:  # the dispatcher asked again in between: read again
                return False
            raise
        return True

    eventually(settle, Within.COMMIT, "the outcome settled")
    eventually(lambda: gone(runs, name), Within.RUN, f"{name} let go once settled")
    spec = the_record(runs, name)["spec"]
    assert spec["state"] == "canceled"
    assert [(e["actionRecord"], e["state"]) for e in spec["ledger"]] == [(record_name, "succeeded")]
    assert [(e["step"], e["state"]) for e in spec["cancellation"]["unreversedEffects"]] == [
        ("pay", "succeeded")
    ]


def test_a_run_with_a_running_child_goes_only_after_its_child_and_both_are_recorded(
    kube: KubeEnv, namespace: str, start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    grant_agentruns(kube, namespace)
    make_policy(runs, "brief", ttlAfterFinished="1s")
    start_operator("tree", LEASE)
    child = {"name": "child", "child": {"taskType": "sub", "objective": "wait", "steps": [ASK]}}
    name = runs.create(run_spec(child, DONE, policy="brief"))
    child_name = child_run_name(name, "child")
    runs.wait_state(child_name, "waiting_input", timeout=Within.RUN)
    eventually(
        lambda: FINALIZER in (runs.get(name)["metadata"].get("finalizers") or []), Within.COMMIT, "finalizer"
    )
    runs.custom.delete_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentruns", name)
    eventually(lambda: gone(runs, name), Within.RUN, f"{name} let go")
    eventually(lambda: gone(runs, child_name), Within.RUN, f"{child_name} let go with its parent")
    parent_record = the_record(runs, name)["spec"]
    child_record = the_record(runs, child_name)["spec"]
    assert parent_record["state"] == "canceled"
    assert child_record["state"] == "canceled", "the child was finished before its parent went"
    assert child_record["run"]["parent"] == name
    assert [(c["name"], c.get("outcome")) for c in parent_record["children"]] == [(child_name, "canceled")]


@pytest.mark.local_plane("webhook")
def test_with_the_admission_webhook_the_operators_own_cancellation_is_admitted(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    """With the webhook on, the deletion's cancellation goes through it as the operator's own user
    (the chart's rules give it the cancel verb); the webhook re-stamps it, the engine acts on it."""
    op = start_operator("webhook", LEASE, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    name = runs.create(run_spec(pay(refsystem.url), ASK, DONE))
    uid = runs.wait_state(name, "waiting_input", timeout=Within.RUN)["metadata"]["uid"]
    eventually(
        lambda: FINALIZER in (runs.get(name)["metadata"].get("finalizers") or []), Within.COMMIT, "finalizer"
    )
    runs.custom.delete_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentruns", name)
    asked = eventually(
        lambda: (runs.get(name)["spec"].get("cancellations") or {}).get("deleted"),
        Within.COMMIT,
        "the request",
    )
    assert asked["requestedBy"]["username"] == "durable-agents-operator", "stamped by the webhook as its user"
    eventually(lambda: gone(runs, name), Within.RUN, f"{name} canceled, recorded and let go")
    spec = the_record(runs, name)["spec"]
    assert spec["state"] == "canceled"
    assert [(e["idempotencyKey"], e["state"]) for e in spec["ledger"]] == [
        (idempotency_key(uid, 0, "pay", 0), "succeeded")
    ]
