"""The seed's interruption table, row by row, plus cancellation scopes, child runs and retry windows.

| Interruption      | Persisted transition          | Safe next step                                 |
|-------------------|-------------------------------|------------------------------------------------|
| Approval wait     | waiting_approval              | Release worker and await durable decision      |
| Worker crash      | state unchanged, lease expires| Another worker reloads checkpoint              |
| Tool timeout      | outcome_unknown               | Query authoritative record                     |
| User cancellation | cancel_requested              | Stop new work and reconcile in-flight effects  |
| Deployment change | resume_validation             | Migrate or quarantine checkpoint               |

Each row is one test below (``test_row_*``); the deployment change's migrate-or-quarantine half
across real releases is ``e2e/test_upgrade.py``. Operators run as separate processes against a
real API server; effects go to the reference authoritative system, which counts applications.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.engine import child_run_name
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless
from durable_agents_testkit.scrape import free_port, metric, scrape, scrape_when

LEASE = 2


def pay(url: str, name: str = "pay", amount: int = 10) -> dict[str, Any]:
    return {
        "name": name,
        "effect": {
            "effect": "http.post",
            "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
            "arguments": {"amount": amount},
        },
    }


def run_spec(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"taskType": "interruptions", "objective": "be interrupted safely", "steps": list(steps), **extra}


ASK = {"name": "confirm", "ask": {"question": "go on?"}}
DONE = {"name": "done", "complete": {"result": "ok"}}


def events_of(run: dict[str, Any]) -> list[str]:
    return [h["event"] for h in assert_history_is_gapless(run)]


def policy(runs: Runs, name: str = "ops", **spec: Any) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": name},
        "spec": {"version": "v1", "approvalRequiredTiers": [], **spec},
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)


def canceling(runs: Runs, name: str) -> bool:
    return runs.state(name) in ("cancel_requested", "canceled")


def cancel(runs: Runs, name: str, request_id: str, scope: str, reason: str = "") -> float:
    runs.patch_spec(name, {"cancellations": {request_id: {"scope": scope, "reason": reason}}})
    return time.monotonic()


def grant_agentruns(kube: KubeEnv, namespace: str) -> None:
    """The runs' ServiceAccount may start and cancel child runs (they are made AS that account)."""
    children = rule(GROUP, "agentruns", "get", "create", "patch")
    grant(kube, namespace, service_account("default", namespace), children, name="start-children")


def record(runs: Runs, name: str) -> dict[str, Any]:
    out: dict[str, Any] = runs.custom.get_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "actionrecords", name
    )
    return out


def record_state(runs: Runs, name: str) -> str | None:
    """The record's dispatch state; None while it does not exist yet."""
    try:
        return str((record(runs, name).get("status") or {}).get("state", "intent"))
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def key(run: dict[str, Any], step: int, name: str, attempt: int = 0) -> str:
    return idempotency_key(run["metadata"]["uid"], step, name, attempt)


# --- the table, row by row -------------------------------------------------------------------


def test_row_approval_wait_releases_the_worker_and_resumes_on_the_durable_decision(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    """Approval wait: persisted waiting_approval; no worker holds the run; the decision, made while
    no operator runs at all, is durable and resumes a fresh process."""
    policy(runs, "payments", approvalRequiredTiers=["consequential"], tiers={"http.post": "consequential"})
    op = start_operator("approval", LEASE)
    name = runs.create(run_spec(pay(refsystem.url), DONE, policyRef={"name": "payments"}))
    waiting = runs.wait_state(name, "waiting_approval")
    assert waiting["status"]["approvalRequest"]["step"] == "pay"
    eventually(lambda: not runs.leases(), Within.COMMIT, "the worker to release the run's Lease")
    op.stop()
    # The approval arrives with no operator alive. Without the admission webhook nothing stamps
    # an approver, so the decision is written the way the webhook would have stamped it.
    request = waiting["status"]["approvalRequest"]
    decided = {
        "digest": request["digest"],
        "decision": "approve",
        "approver": {"username": "alice"},
        "decidedAt": datetime.now().astimezone().isoformat(),
    }
    runs.patch_spec(name, {"approvals": {request["requestId"]: decided}})
    assert runs.state(name) == "waiting_approval"
    start_operator("after-approval", LEASE)
    done = runs.wait_state(name, "completed", "failed")
    assert done["status"]["state"] == "completed", done["status"].get("outcome")
    assert events_of(done)[:3] == ["accepted", "approval_requested", "approval_decided"]
    assert refsystem.counts() == {key(done, 0, "pay"): 1}


def test_row_worker_crash_leaves_the_state_and_another_worker_reloads_it(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    """Worker crash: nothing is persisted by the crash; the Lease expires; a fresh worker reloads.

    The worker dies right after its first commit (accepted, the wait left, the intent to pay: one
    write at that semantic boundary), before it created the action record."""
    victim = start_operator("crash", LEASE, DURABLE_AGENTS_TEST_KILL_AT="after:1")
    name = runs.create(
        run_spec({"name": "note", "await": {"event": "go"}}, pay(refsystem.url), DONE, events={"go": "now"})
    )
    assert victim.wait_killed(60) == -signal.SIGKILL
    crashed = runs.get(name)
    version = crashed["status"]["stateVersion"]
    assert version >= 2
    assert crashed["status"]["checkpoint"]["pendingActions"], "the intent was committed"
    assert {h["holder"] for h in crashed["status"]["history"]} == {victim.identity}
    listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
    assert listed["items"] == [], "the crash came before the action record"
    held = [lease for lease in runs.shard_leases() if lease.spec.holder_identity == victim.identity]
    assert held, "the dead worker's shard Leases are still there until they expire"
    rescuer = start_operator("rescuer", LEASE)
    done = runs.wait_state(name, "completed")
    history = assert_history_is_gapless(done)
    assert [h["holder"] for h in history[:version]] == [victim.identity] * version
    assert [h["holder"] for h in history[version:]] == [rescuer.identity] * (len(history) - version)
    assert refsystem.counts() == {key(done, 1, "pay"): 1}


def test_row_tool_timeout_is_an_unknown_outcome_reconciled_by_asking_the_authoritative_system(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    """Tool timeout: outcome_unknown (never failed); the reference system is asked, not retried blind."""
    refsystem.inject("slow", times=1, delay=3.0)
    start_operator("timeout", LEASE, DURABLE_AGENTS_DISPATCH_TIMEOUT="1")
    name = runs.create(run_spec(pay(refsystem.url), DONE))
    done = runs.wait_state(name, "completed", "failed", timeout=90)
    assert done["status"]["state"] == "completed", done["status"].get("outcome")
    action = record(runs, action_record_name(key(done, 0, "pay")))
    assert action["status"]["state"] == "succeeded"
    assert action["status"]["queries"] >= 1, "the outcome came from a query, not from a second dispatch"
    assert action["status"]["attempts"] == 1
    assert refsystem.counts() == {key(done, 0, "pay"): 1}


def test_row_user_cancellation_stops_new_work_and_reports_effects_that_happened(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    """User cancellation: cancel_requested; no new work; the effect that happened is reported, not
    assumed reversed; the run ends canceled. Cancellation latency is measured."""
    start_operator("cancel", LEASE)
    later = pay(refsystem.url, "pay-again", 20)
    name = runs.create(run_spec(pay(refsystem.url), ASK, later, DONE))
    runs.wait_state(name, "waiting_input")
    requested = cancel(runs, name, "stop", "task", "change freeze")
    eventually(
        lambda: runs.state(name) in ("cancel_requested", "canceled"), Within.COMMIT, "the cancellation"
    )
    latency = time.monotonic() - requested
    done = runs.wait_state(name, "canceled")
    assert "cancel_requested" in events_of(done)
    assert events_of(done)[-1] == "cancel_finished"
    cancellation = done["status"]["cancellation"]
    assert cancellation["requestId"] == "stop"
    assert cancellation["reason"] == "change freeze"
    assert [(e["step"], e["state"]) for e in cancellation["unreversedEffects"]] == [("pay", "succeeded")]
    assert done["status"]["outcome"]["reason"] == "Canceled"
    assert "1 effect(s) happened and were not undone" in done["status"]["outcome"]["message"]
    # No new work: the later effect was never even intended, the answer given later changes nothing.
    runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    assert refsystem.counts() == {key(done, 0, "pay"): 1}
    records = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
    assert len(records["items"]) == 1
    print(f"\ncancellation latency (request to cancel_requested observed): {latency * 1000:.0f} ms")
    assert runs.state(name) == "canceled"


def test_row_deployment_change_passes_resume_validation(
    start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    """Deployment change: a run committed by operator 0.1.9 and resumed by this version goes through
    resume_validation before any new work. (The old one writes a status per transition, as wave 1
    did, so that it leaves the run in ``ready``.)"""
    old = start_operator(
        "old",
        LEASE,
        DURABLE_AGENTS_OPERATOR_VERSION="0.1.9",
        DURABLE_AGENTS_TEST_KILL_AT="after:1",
        DURABLE_AGENTS_TRANSITIONS_PER_WRITE="1",
    )
    name = runs.create(run_spec({"name": "go", "await": {"event": "go"}}, DONE, events={"go": "now"}))
    assert old.wait_killed(60) == -signal.SIGKILL
    accepted = runs.get(name)
    assert (accepted["status"]["state"], accepted["status"]["checkpoint"]["runtimeConfig"]["operator"]) == (
        "ready",
        "0.1.9",
    )
    start_operator("new", LEASE)
    done = runs.wait_state(name, "completed")
    history = assert_history_is_gapless(done)
    assert [h["event"] for h in history[1:3]] == ["revalidation_required", "revalidated"]
    assert "deployment changed: operator 0.1.9 -> " in history[1]["detail"]
    assert history[1]["to"] == "resume_validation"
    assert done["status"]["checkpoint"]["runtimeConfig"]["operator"] != "0.1.9"


def test_a_runtime_configuration_withdrawn_during_a_wait_fails_resume_validation_per_policy(
    start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    """The model a run was started with is withdrawn by GitOps while it waits: on resume it goes
    through resume_validation and, per policy (onUnavailable: fail), fails with the reason."""
    policy(runs, runtime={"models": ["model-2025-01"], "onUnavailable": "fail"})
    op = start_operator("runtime", LEASE)
    agent = {"model": "model-2025-01", "prompt": "rollout@v3"}
    name = runs.create(run_spec(ASK, DONE, policyRef={"name": "ops"}, agent=agent))
    runs.wait_state(name, "waiting_input")
    op.stop()
    # GitOps withdraws the model while no operator runs; the answer arrives meanwhile too.
    withdrawn = {"spec": {"version": "v2", "runtime": {"models": ["model-2026-06"]}}}
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "ops", withdrawn
    )
    runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    start_operator("runtime-2", LEASE)  # decides nothing for the run before it knows its policy
    done = runs.wait_state(name, "failed", "completed")
    assert done["status"]["outcome"]["reason"] == "RuntimeConfigUnavailable"
    assert "model 'model-2025-01'" in done["status"]["outcome"]["message"]
    assert events_of(done)[-3:] == ["input_requested", "input_received", "attempt_failed"]
    assert done["status"]["history"][-1]["from"] == "resume_validation"


# --- cancellation scopes ---------------------------------------------------------------------


def test_turn_scope_abandons_the_current_step_and_goes_on(
    start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    start_operator("turn", LEASE)
    name = runs.create(run_spec(ASK, DONE))
    runs.wait_state(name, "waiting_input")
    cancel(runs, name, "skip-question", "turn", "nobody will answer")
    done = runs.wait_state(name, "completed")
    events = events_of(done)
    assert events == ["accepted", "input_requested", "step_canceled", "revalidated", "succeeded"]
    assert done["status"]["checkpoint"]["cancellations"][0]["scope"] == "turn"


def test_tool_call_scope_cancels_an_undispatched_intent_and_the_run_goes_on(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    # A worker without a dispatcher: the intent is committed and stays undispatched.
    start_operator("no-dispatch", LEASE, DURABLE_AGENTS_DISPATCHER="off")
    name = runs.create(run_spec(pay(refsystem.url), DONE))
    intent = runs.wait_state(name, "waiting_external")
    record_name = action_record_name(key(intent, 0, "pay"))
    eventually(lambda: record_state(runs, record_name), Within.COMMIT, "the intent record")
    cancel(runs, name, "not-this-call", "toolCall")
    done = runs.wait_state(name, "completed")
    assert record(runs, record_name)["status"]["state"] == "canceled"
    assert "cancel_recorded" in events_of(done)
    assert refsystem.counts() == {}, "a canceled intent is never dispatched"
    # A dispatcher arriving afterwards finds nothing to do. It logs (at DEBUG) each time it looks
    # at a record, and looks at one key at a time: once it has looked at the record a second time
    # (after a touch), its first look, from its initial list, has ended, with whatever it decided.
    port = free_port()
    dispatcher = start_operator(
        "dispatcher", LEASE, DURABLE_AGENTS_LOG_LEVEL="DEBUG", DURABLE_AGENTS_METRICS_PORT=str(port)
    )
    looked = f"dispatcher looks at {runs.namespace}/{record_name}"
    eventually(lambda: dispatcher.logged(looked), Within.COMMIT, "the new dispatcher to look at the record")
    runs.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        runs.namespace,
        "actionrecords",
        record_name,
        {"metadata": {"labels": {"touched": "1"}}},
    )
    eventually(
        lambda: dispatcher.logged(looked, times=2),
        Within.COMMIT,
        "the new dispatcher to look at the record again",
    )
    assert record(runs, record_name)["status"]["state"] == "canceled"
    assert "durable_agents_action_dispatches_total{" not in scrape(port), "no dispatch, not even refused"
    assert refsystem.counts() == {}


def test_tool_call_scope_on_a_dispatched_call_reconciles_it_and_never_assumes_it_undone(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    refsystem.inject("slow", times=1, delay=2.0)
    start_operator("dispatched", LEASE)
    name = runs.create(run_spec(pay(refsystem.url), DONE))
    running = runs.wait_state(name, "waiting_external")
    record_name = action_record_name(key(running, 0, "pay"))
    # Applied, its answer held back: in flight (under the dispatcher's first claim, the record
    # still says intent: a first-claimed intent is never canceled, it is reconciled).
    eventually(lambda: refsystem.applied(key(running, 0, "pay")) == 1, Within.COMMIT, "dispatch")
    assert record_state(runs, record_name) in ("dispatching", "intent")
    cancel(runs, name, "too-late", "toolCall")
    done = runs.wait_state(name, "completed")
    assert record(runs, record_name)["status"]["state"] == "succeeded"
    assert refsystem.counts() == {key(done, 0, "pay"): 1}
    assert done["status"]["checkpoint"]["toolCalls"][0]["outcome"] == "succeeded"


def test_task_scope_cancels_a_tree_of_child_runs(
    kube: KubeEnv,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    grant_agentruns(kube, namespace)
    start_operator("tree", LEASE)
    grandchild_steps = [{"name": "wait", "ask": {"question": "never answered"}}]
    child = {
        "name": "child",
        "child": {
            "taskType": "sub",
            "objective": "work",
            "steps": [pay(refsystem.url, "sub-pay"), *grandchild_steps],
        },
    }
    name = runs.create(run_spec(child, DONE))
    child_name = child_run_name(name, "child")
    runs.wait_state(name, "waiting_external")
    sub = runs.wait_state(child_name, "waiting_input")
    parent = runs.get(name)
    assert sub["spec"]["parentRef"] == {"name": name, "uid": parent["metadata"]["uid"]}
    owners = sub["metadata"]["ownerReferences"]
    assert [(o["kind"], o["uid"]) for o in owners] == [("AgentRun", parent["metadata"]["uid"])]
    eventually(
        lambda: any(f"parent={parent['metadata']['uid']}" in e.message for e in runs.events(child_name)),
        Within.COMMIT,
        "the child's Event (its question) to name its parent",
    )

    cancel(runs, name, "abort", "task", "stop everything")
    done = runs.wait_state(name, "canceled", timeout=60)
    sub = runs.wait_state(child_name, "canceled", timeout=30)
    # The child's effect happened before the cancel: reported by the child, never assumed undone.
    unreversed = sub["status"]["cancellation"]["unreversedEffects"]
    assert [(u["step"], u["state"]) for u in unreversed] == [("sub-pay", "succeeded")]
    assert done["status"]["checkpoint"]["children"] == [
        {"name": child_name, "stepIndex": 0, "outcome": "canceled", "reason": "Canceled"}
    ]
    assert refsystem.duplicates() == []
    assert refsystem.total() == 1


def test_children_scope_cancels_the_children_and_the_parent_goes_on(
    kube: KubeEnv, namespace: str, start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    grant_agentruns(kube, namespace)
    start_operator("children", LEASE)
    child = {"name": "child", "child": {"taskType": "sub", "objective": "wait", "steps": [ASK]}}
    name = runs.create(run_spec(child, DONE))
    child_name = child_run_name(name, "child")
    runs.wait_state(child_name, "waiting_input")
    cancel(runs, name, "drop-children", "children")
    done = runs.wait_state(name, "completed", "failed", timeout=60)
    assert done["status"]["state"] == "completed", done["status"].get("outcome")
    assert runs.state(child_name) == "canceled"
    assert "cancel_recorded" in events_of(done)


def test_a_completed_child_wakes_its_parent(
    kube: KubeEnv, namespace: str, start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    grant_agentruns(kube, namespace)
    start_operator("wake", LEASE)
    child = {"name": "child", "child": {"taskType": "sub", "objective": "ask", "steps": [ASK, DONE]}}
    name = runs.create(run_spec(child, DONE))
    child_name = child_run_name(name, "child")
    runs.wait_state(child_name, "waiting_input")
    assert runs.state(name) == "waiting_external"
    runs.patch_spec(child_name, {"answers": {"confirm": "yes"}})
    done = runs.wait_state(name, "completed")
    assert done["status"]["checkpoint"]["children"][0]["outcome"] == "completed"
    assert runs.state(child_name) == "completed"


# --- retry windows ---------------------------------------------------------------------------


def read_missing(name: str = "appears-later") -> dict[str, Any]:
    return {"name": "read", "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": name}}}


def allow_reading(kube: KubeEnv, namespace: str, configmap: str) -> None:
    reads = rule("", "configmaps", "get", names=[configmap])
    grant(kube, namespace, service_account("default", namespace), reads, name="read")


RETRY = {"maxAttempts": 3, "initialBackoff": "2s", "maxBackoff": "10s", "jitter": 0.2}


def test_retry_window_honours_backoff_and_a_crash_during_it_loses_nothing(
    kube: KubeEnv, namespace: str, start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    allow_reading(kube, namespace, "appears-later")
    policy(runs, retry=RETRY)
    first = start_operator("retry-1", LEASE)
    name = runs.create(run_spec(read_missing(), DONE, policyRef={"name": "ops"}))
    waiting = runs.wait_state(name, "waiting_retry")
    first.kill()  # crash inside the retry window
    retry = waiting["status"]["checkpoint"]["retry"]
    assert retry["attempts"] == 1
    assert retry["lastFailure"].startswith("NotFound")
    failed_at = datetime.fromisoformat(waiting["status"]["stateSince"])
    retry_at = datetime.fromisoformat(waiting["status"]["retryAt"])
    assert 1.6 <= (retry_at - failed_at).total_seconds() <= 2.0, "2s backoff with 20% jitter"
    client.CoreV1Api(kube.api).create_namespaced_config_map(
        namespace, {"metadata": {"name": "appears-later"}}
    )
    start_operator("retry-2", LEASE)
    done = runs.wait_state(name, "completed", "failed", timeout=60)
    assert done["status"]["state"] == "completed", done["status"].get("outcome")
    history = assert_history_is_gapless(done)
    due = next(h for h in history if h["event"] == "retry_due")
    assert datetime.fromisoformat(due["at"]) >= retry_at, "never retried before the window closed"
    assert [h["event"] for h in history] == [
        "accepted",
        "retry_scheduled",
        "retry_due",
        "revalidated",
        "step_completed",
        "succeeded",
    ]
    calls = done["status"]["checkpoint"]["toolCalls"]
    assert [(c["outcome"], c.get("attempt", 0)) for c in calls] == [("succeeded", 1)]


def test_retries_are_limited_by_the_policy(
    kube: KubeEnv, namespace: str, start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    allow_reading(kube, namespace, "never-there")
    policy(runs, retry={**RETRY, "initialBackoff": "1s"})
    start_operator("exhaust", LEASE)
    name = runs.create(run_spec(read_missing("never-there"), DONE, policyRef={"name": "ops"}))
    done = runs.wait_state(name, "failed", "completed", timeout=60)
    assert done["status"]["outcome"]["reason"] == "RetriesExhausted"
    assert "3 attempts failed" in done["status"]["outcome"]["message"]
    assert events_of(done).count("retry_scheduled") == 2
    assert done["status"]["checkpoint"]["retry"]["attempts"] == 2


def test_a_definitely_failed_effect_is_retried_as_a_new_action_and_applied_once(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    refsystem.inject("reject", times=1)
    policy(runs, retry={**RETRY, "initialBackoff": "1s"}, tiers={"http.post": "reversible"})
    start_operator("effect-retry", LEASE)
    name = runs.create(run_spec(pay(refsystem.url), DONE, policyRef={"name": "ops"}))
    done = runs.wait_state(name, "completed", "failed", timeout=60)
    assert done["status"]["state"] == "completed", done["status"].get("outcome")
    first, second = key(done, 0, "pay"), key(done, 0, "pay", attempt=1)
    assert record(runs, action_record_name(first))["status"]["state"] == "failed"
    assert record(runs, action_record_name(second))["status"]["state"] == "succeeded"
    assert refsystem.counts() == {second: 1}
    assert refsystem.duplicates() == []


# --- the operator's controls, from kubectl ---------------------------------------------------


@pytest.mark.local_plane("webhook")
def test_kubectl_agentrun_cancel_is_stamped_and_its_latency_measured(
    kube: KubeEnv, start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    """``kubectl agentrun cancel`` on parked runs: the webhook stamps who and when; the operator's
    histogram measures request-to-no-new-work (cancel_requested committed) for each one."""
    port = free_port()
    op = start_operator(
        "controls", LEASE, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()), DURABLE_AGENTS_METRICS_PORT=str(port)
    )
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    names = [runs.create(run_spec(ASK, DONE), name=f"parked-{i}") for i in range(CANCELED_RUNS)]
    for name in names:
        runs.wait_state(name, "waiting_input")
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    plugin = [sys.executable, "-m", "durable_agents.kubectl.main"]
    observed: list[float] = []
    for name in names:
        started = time.monotonic()
        out = subprocess.run(
            [*plugin, "cancel", name, "-n", runs.namespace, "--reason", "maintenance"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        assert "task cancellation cancel-01 requested" in out.stdout
        eventually(partial(canceling, runs, name), Within.COMMIT, f"{name} to cancel")
        observed.append(time.monotonic() - started)
    for name in names:
        done = runs.wait_state(name, "canceled")
        request = done["spec"]["cancellations"]["cancel-01"]
        assert request["requestedBy"]["username"], "stamped by the webhook from the authenticated user"
        assert done["status"]["cancellation"]["requestedAt"] == request["requestedAt"]
    # Observed once the cancel_requested commit has returned to the operator: a moment after the
    # test can see it.
    text = scrape_when(port, {"durable_agents_cancellation_latency_seconds_count": CANCELED_RUNS})
    assert metric(text, "durable_agents_cancellation_latency_seconds_count") == CANCELED_RUNS
    mean = metric(text, "durable_agents_cancellation_latency_seconds_sum") / CANCELED_RUNS
    observed.sort()
    print(
        f"\ncancellation latency over {CANCELED_RUNS} runs: operator histogram mean {mean * 1000:.0f} ms; "
        f"kubectl-to-observed p50 {observed[len(observed) // 2] * 1000:.0f} ms, "
        f"max {observed[-1] * 1000:.0f} ms"
    )
    again = subprocess.run(
        [*plugin, "cancel", names[0], "-n", runs.namespace], env=env, capture_output=True, text=True
    )
    assert again.returncode != 0
    assert "has already ended (canceled)" in again.stderr


CANCELED_RUNS = 10
