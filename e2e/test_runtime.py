"""The operator runtime end to end: a read-only run that pauses, resumes and completes."""

from __future__ import annotations

from collections.abc import Callable

from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.runs import (
    EXPECTED_EVENTS,
    Runs,
    assert_history_is_gapless,
    read_ask_await_complete,
)
from durable_agents_testkit.scrape import free_port, metric, scrape_when


def test_run_pauses_without_a_lease_and_resumes_on_patch(
    start_operator: Callable[..., OperatorProcess], runs: Runs, readable_configmap: str
) -> None:
    port = free_port()
    start_operator(DURABLE_AGENTS_METRICS_PORT=str(port))
    name = runs.create(read_ask_await_complete(readable_configmap))

    parked = runs.wait_state(name, "waiting_input")
    assert parked["status"]["waitingFor"] == "input:confirm"
    # The worker deletes the Lease right after committing the wait.
    eventually(lambda: runs.leases() == [], Within.COMMIT, "the parked run's Lease to be released")
    waiting = {c["type"]: c for c in parked["status"]["conditions"]}["Waiting"]
    assert (waiting["status"], waiting["reason"]) == ("True", "WaitingInput")

    runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    runs.wait_state(name, "waiting_external")
    eventually(lambda: runs.leases() == [], Within.COMMIT, "the run's Lease to be released")
    runs.patch_spec(name, {"events": {"window-open": "now"}})
    done = runs.wait_state(name, "completed")

    history = assert_history_is_gapless(done)
    assert [h["event"] for h in history] == EXPECTED_EVENTS
    cp = done["status"]["checkpoint"]
    assert len(cp["evidence"]) == 1
    evidence = cp["evidence"][0]
    assert (evidence["kind"], evidence["name"]) == ("ConfigMap", readable_configmap)
    assert evidence["contentDigest"].startswith("sha256:")
    assert [r["id"] for r in cp["inputRefs"]] == ["answer-confirm", "event-window"]
    assert done["status"]["outcome"]["result"] == "ok"
    conditions = {c["type"]: c["status"] for c in done["status"]["conditions"]}
    assert conditions["Succeeded"] == "True"
    assert conditions["Waiting"] == "False"
    # kopf wrote nothing on the business record: no annotations, no finalizers (the one finalizer a
    # run may carry is the operator's own, retention's: deleting a run cancels and records it first).
    assert set(done["metadata"].get("finalizers") or []) <= {"durable-agents.io/cancel-before-delete"}
    assert not any(k.startswith("kopf.") for k in (done["metadata"].get("annotations") or {}))
    # Commits at semantic boundaries only: 9 transitions in 3 status writes (accepted + read + the
    # question; answer + revalidated + the external wait; event + revalidated + succeeded). The last
    # write is counted once it has returned to the operator: a moment after the test can see it.
    text = scrape_when(port, {"durable_agents_transitions_per_write_count": 3})
    assert metric(text, 'durable_agents_api_writes_total{resource="agentruns/status",verb="update"}') == 3
    assert metric(text, "durable_agents_transitions_per_write_count") == 3
    assert metric(text, "durable_agents_transitions_per_write_sum") == len(EXPECTED_EVENTS)
    # An Event only for what a person acts on (here the question); the rest is in the history.
    # Events are posted in the background, after the commit they report.
    events = eventually(lambda: runs.events(name), Within.COMMIT, "the question's Event")
    reasons = sorted(e.reason for e in events)
    assert reasons == ["InputRequested"]
    eventually(lambda: runs.leases() == [], Within.COMMIT, "the run's Lease to be released")


def test_read_as_a_service_account_without_permission_fails_with_the_reason(
    start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    start_operator()
    # The operator's own user may not read ConfigMaps either, but the point is the run's
    # ServiceAccount: no Role grants it anything here.
    name = runs.create(read_ask_await_complete("kube-root-ca.crt"))
    failed = runs.wait_state(name, "failed")
    assert failed["status"]["outcome"]["reason"] == "Forbidden"
    assert (
        f"ServiceAccount {runs.namespace}/default may not read ConfigMap"
        in failed["status"]["outcome"]["message"]
    )
