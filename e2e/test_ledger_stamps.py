"""The action ledger's status is believed only with the operator's outcome stamp.

A user granted ``actionrecords/status`` (``mallory``, as in e2e/test_integrity.py), with the
chart's ValidatingAdmissionPolicy absent, rewrites an ActionRecord's status: ``succeeded`` with a
made-up outcome on an intent never sent, a claim until 2099 on it, or ``failed`` on an action that
succeeded. The operator believes none of them: the engine waits (the run neither completes nor
fails on it), the dispatcher asks the reference system by key and writes a stamped status
(applied: ``succeeded``; not applied: sent once, with the same key). The reference system counts
every application: exactly one each time.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e.test_integrity import mallory
from e2e.test_key_rotation import SECRET, A, B, keys, operator, refused, set_keys
from e2e.test_ledger import http_effect_run, key_of, record_of
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.stamps import stamp_key_id
from durable_agents.shell.keys.keyguard import KEYRING_LABEL
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

__all__ = ["keys", "mallory", "operator"]  # fixtures, shared with test_integrity, test_key_rotation

LEASE = 2
NOT_BELIEVED = "not written by the operator, so not believed"
FORGED_OUTCOME = {"status": 201, "receipt": "rcpt-made-up"}


def forge(api: client.ApiClient, runs: Runs, name: str, status: dict[str, Any]) -> None:
    """``name``'s status replaced by ``status``, as mallory can (read again on a 409)."""
    custom = client.CustomObjectsApi(api)
    for _ in range(20):
        current = custom.get_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords", name)
        current["status"] = status
        try:
            custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, runs.namespace, "actionrecords", name, current
            )
            return
        except client.ApiException as err:
            if err.status != 409:
                raise
    raise AssertionError(f"{name} kept moving: 20 forged writes refused with 409")


def record_when_created(runs: Runs, key: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        try:
            return record_of(runs, key)
        except client.ApiException as err:
            if err.status == 404:
                return None
            raise

    got: dict[str, Any] = eventually(found, Within.COMMIT, f"the ActionRecord of key {key}")
    return got


def worker_only(start_operator: Callable[..., OperatorProcess], name: str) -> OperatorProcess:
    """The engine without a dispatcher: what it believes of the ledger shows, nothing is sent."""
    return start_operator(name, LEASE, DURABLE_AGENTS_DISPATCHER="off")


def engine_did_not_believe(op: OperatorProcess, runs: Runs, run: str, record: str) -> None:
    eventually(
        lambda: op.logged(f"action {record}: status") and op.logged(NOT_BELIEVED),
        Within.TAKEOVER,
        f"the engine to read {record}'s forged status and not believe it\n{op.log_tail()}",
    )
    state = runs.get(run)["status"]["state"]
    assert state == "waiting_external", f"the run acted on a forged ledger status: {state}"


@pytest.mark.parametrize(
    "forged",
    [
        {
            "state": "succeeded",
            "attempts": 1,
            "outcome": FORGED_OUTCOME,
            "finishedAt": "2030-01-01T00:00:00Z",
        },
        {
            "state": "dispatching",
            "attempts": 1,
            "claimedBy": "mallory",
            "claimExpiresAt": "2099-01-01T00:00:00Z",
        },
    ],
    ids=["succeeded", "claimed-until-2099"],
)
@pytest.mark.local_plane("users")
def test_a_forged_status_on_an_intent_never_sent_is_asked_about_and_sent_once(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    mallory: client.ApiClient,
    forged: dict[str, Any],
) -> None:
    worker = worker_only(start_operator, "worker")
    name = runs.create(http_effect_run(refsystem.url), name="never-sent")
    runs.wait_state(name, "waiting_external", timeout=Within.COMMIT)
    key = key_of(runs.get(name))
    record = record_when_created(runs, key)
    assert record["spec"].get("statusStamped") is True, "created by an operator that stamps its statuses"
    assert not record.get("status"), "the intent waits unsent (no dispatcher)"

    forge(mallory, runs, record["metadata"]["name"], forged)
    if forged["state"] == "succeeded":  # a claim is not an answer: the engine waits on it anyway
        engine_did_not_believe(worker, runs, name, record["metadata"]["name"])
    assert refsystem.counts() == {}

    start_operator("dispatcher", LEASE, DURABLE_AGENTS_WORKERS="0")
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    assert refsystem.counts() == {key: 1}, "asked by key, not applied: sent exactly once"
    settled = record_of(runs, key)["status"]
    assert settled["state"] == "succeeded", settled
    assert settled["stamp"], "written by the operator, with its outcome stamp"
    assert settled.get("outcome") != FORGED_OUTCOME
    assert settled["queries"] >= 1, "the reference system was asked before the send"
    assert [c["outcome"] for c in done["status"]["checkpoint"]["toolCalls"]] == ["succeeded"]
    runs.wait_event(record["metadata"]["name"], "IntegrityFailed")


@pytest.mark.local_plane("users")
def test_a_succeeded_action_forged_failed_does_not_fail_the_run(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    mallory: client.ApiClient,
) -> None:
    first = worker_only(start_operator, "worker-1")
    name = runs.create(http_effect_run(refsystem.url), name="forged-failed")
    runs.wait_state(name, "waiting_external", timeout=Within.COMMIT)
    key = key_of(runs.get(name))
    record_when_created(runs, key)
    first.stop()  # the engine away while the action succeeds: it has not taken the outcome in

    sender = start_operator("sender", LEASE, DURABLE_AGENTS_WORKERS="0")
    eventually(
        lambda: (record_of(runs, key).get("status") or {}).get("state") == "succeeded",
        Within.COMMIT,
        "the action to be sent and succeed",
    )
    assert refsystem.counts() == {key: 1}
    sender.stop()

    record = record_of(runs, key)["metadata"]["name"]
    forge(
        mallory, runs, record, {"state": "failed", "attempts": 1, "reason": "Declined", "message": "made up"}
    )
    worker = worker_only(start_operator, "worker-2")
    engine_did_not_believe(worker, runs, name, record)

    start_operator("dispatcher", LEASE, DURABLE_AGENTS_WORKERS="0")
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    assert refsystem.counts() == {key: 1}, "reconciled by query: 0 duplicates"
    settled = record_of(runs, key)["status"]
    assert settled["state"] == "succeeded", settled
    assert settled["stamp"], "written by the operator, with its outcome stamp"
    assert settled["queries"] >= 1, "settled by asking the reference system, not by sending"
    assert [c["outcome"] for c in done["status"]["checkpoint"]["toolCalls"]] == ["succeeded"]


@pytest.mark.local_plane("webhook")
def test_key_rotation_restamps_the_ledger_and_a_key_stamping_it_cannot_be_retired(
    operator: Callable[..., tuple[OperatorProcess, int]],
    runs: Runs,
    namespace: str,
    keys: dict[str, Path],
    refsystem: ReferenceSystemThread,
) -> None:
    """An outcome stamp made with key A: the keyguard refuses to take A away while the record
    carries it; the rotation pass re-stamps it under B (the same status, one write), so the record
    still verifies once A is gone (no question to the reference system, no second send)."""
    core = client.CoreV1Api(runs.kube.api)
    first, _ = operator("under-a", keys["a"], A)
    name = runs.create(http_effect_run(refsystem.url), name="rotated", stamped=False)
    runs.wait_state(name, "completed", timeout=Within.RUN)
    key = key_of(runs.get(name))
    settled = record_of(runs, key)["status"]
    assert stamp_key_id(settled["stamp"]) == A

    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": SECRET, "labels": {KEYRING_LABEL: "true"}},
            "data": {A: base64.b64encode((keys["a"] / A).read_bytes()).decode()},
        },
    )
    set_keys(core, namespace, A, B, material=keys)
    message = refused(lambda: set_keys(core, namespace, B, material=keys))
    assert f"1 ActionRecord(s) carry outcome stamps made with key(s) '{A}'" in message

    first.stop()
    operator("under-b", keys["ab"], B)
    restamped = eventually(
        lambda: (got := record_of(runs, key)["status"]) and stamp_key_id(got["stamp"]) == B and got,
        Within.RUN,
        "the record's outcome stamp re-made under key B",
    )
    assert {k: v for k, v in restamped.items() if k != "stamp"} == {
        k: v for k, v in settled.items() if k != "stamp"
    }, "the same status, only its stamp re-made"
    assert refsystem.counts() == {key: 1}
    assert "IntegrityFailed" not in [e.reason for e in runs.events(record_of(runs, key)["metadata"]["name"])]
