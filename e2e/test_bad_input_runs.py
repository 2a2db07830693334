"""Bad input never leaves a run stuck silently (issue 13, item 1): each case ends in a state with a
reason (or completes), says so in an Event, and the operator goes on serving a valid run after it.

Runs are written raw (as the webhook would stamp them, no webhook in front): what is checked is
the operator's side, whatever admission lets through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.core.engine import child_run_name
from durable_agents.shell.ground.faults import INTERNAL_ERROR_VARIABLE
from durable_agents.shell.ownership.leases import run_label
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

LEASE = 2
DONE = {"name": "done", "complete": {"result": "ok"}}
VALID = {"taskType": "check", "objective": "a valid run after a bad one", "steps": [DONE]}


def pay(url: str, query_url: str | None = None) -> dict[str, Any]:
    return {
        "name": "pay",
        "effect": {
            "effect": "http.post",
            "target": {"url": url, "queryUrl": query_url or url},
            "arguments": {"amount": 10},
        },
    }


def a_valid_run_completes(runs: Runs, op: OperatorProcess) -> None:
    assert op.alive, f"the operator exited:\n{op.log_tail()}"
    name = runs.create(VALID)
    done = runs.wait_state(name, "completed", "failed")
    assert done["status"]["state"] == "completed", done["status"].get("outcome")


def test_a_run_with_a_253_character_name_completes(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    op = start_operator("long", LEASE, DURABLE_AGENTS_EVENTS="all")
    name = "long-" + "n" * 120 + "." + "m" * 127  # 253: the longest name an object may have
    assert len(name) == 253
    runs.create({"taskType": "t", "objective": "o", "steps": [pay(f"{refsystem.url}/effects"), DONE]}, name)
    done = runs.wait_state(name, "completed", "failed", "quarantined", timeout=60)
    assert done["status"]["state"] == "completed", done["status"].get("outcome")
    # Its ActionRecord carries the run's label, hashed to fit; a selector on it finds the record.
    listed = runs.custom.list_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "actionrecords", label_selector=f"{RUN_LABEL}={run_label(name)}"
    )["items"]
    assert [r["spec"]["runRef"]["name"] for r in listed] == [name]
    assert len(run_label(name)) <= 63
    assert refsystem.total() == 1
    # Its Events were recorded (their names are cut to fit; posted in the background, after the
    # commits they report), and no Lease is left behind.
    eventually(lambda: runs.events(name), Within.COMMIT, "the run's Events to be recorded")
    eventually(lambda: runs.leases() == [], Within.COMMIT, "the run's Lease to be released")
    a_valid_run_completes(runs, op)


def test_an_http_post_to_a_url_that_cannot_be_parsed_fails_with_invalid_target(
    start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    op = start_operator("badurl", LEASE)
    name = runs.create({"taskType": "t", "objective": "o", "steps": [pay("http://[not-a-url"), DONE]})
    done = runs.wait_state(name, "completed", "failed", "quarantined", timeout=60)
    status = done["status"]
    assert status["state"] == "failed", status
    assert status["outcome"]["reason"] == "ActionFailed"
    assert "InvalidTarget" in status["outcome"]["message"]
    assert "not a URL" in status["outcome"]["message"]
    (record,) = runs.custom.list_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "actionrecords", label_selector=f"{RUN_LABEL}={run_label(name)}"
    )["items"]
    assert (record["status"]["state"], record["status"]["reason"]) == ("failed", "InvalidTarget")
    # A definite failure: never an unknown outcome, so never a wait for reconciliation.
    assert "unknown" not in [h.get("to") for h in status["history"]]
    a_valid_run_completes(runs, op)


def test_a_child_whose_service_account_may_not_create_agentruns_fails_the_step(
    start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    op = start_operator("nochild", LEASE)  # the namespace's default ServiceAccount has no AgentRun rights
    child = {"name": "sub", "child": {"taskType": "sub", "objective": "o", "steps": [DONE]}}
    name = runs.create({"taskType": "t", "objective": "o", "steps": [child, DONE]})
    done = runs.wait_state(name, "completed", "failed", "quarantined", timeout=60)
    status = done["status"]
    assert status["state"] == "failed", status
    assert status["outcome"]["reason"] == "ChildNotPermitted"
    assert "may not create AgentRuns" in status["outcome"]["message"]
    refused = runs.wait_event(name, "ChildNotPermitted")
    assert refused[0].type == "Warning"
    assert "403" in refused[0].message
    child_name = child_run_name(name, "sub")
    with pytest.raises(client.ApiException) as missing:
        runs.get(child_name)
    assert missing.value.status == 404, "the child was never created"
    a_valid_run_completes(runs, op)


def test_an_internal_error_is_retried_a_bounded_number_of_times_then_quarantines_the_run(
    kube: KubeEnv, start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    op = start_operator("buggy", LEASE, **{INTERNAL_ERROR_VARIABLE: "buggy-"})
    name = runs.create({"taskType": "t", "objective": "o", "steps": [DONE]}, "buggy-1")
    # Backoff 1+2+4+8 s between the five attempts, then the quarantine.
    done = runs.wait_state(name, "quarantined", "completed", "failed", timeout=60)
    status = done["status"]
    assert status["state"] == "quarantined"
    outcome = status["outcome"]
    assert outcome["reason"] == "InternalError"
    assert "InjectedInternalError" in outcome["message"]
    assert "pending --accepted-->" in outcome["message"], "the message names the transition"
    assert "5 attempts" in outcome["message"]
    conditions = {c["type"]: c for c in status["conditions"]}
    quarantined = conditions["Quarantined"]
    assert (quarantined["status"], quarantined["reason"]) == ("True", "InternalError")
    event = runs.wait_event(name, "InternalError")
    assert event[0].type == "Warning"
    # Bounded: five tracebacks, then it stays quarantined (the injection still fires on any commit).
    assert op.log_path.read_text().count("Traceback") == 5, op.log_tail(80)
    a_valid_run_completes(runs, op)
    assert runs.state(name) == "quarantined"
    assert op.log_path.read_text().count("Traceback") == 5
    # The quarantine is the ordinary kind: a retry token is taken (and fails again here, bounded).
    runs.patch_spec(name, {"retryQuarantine": "after-fix"})
    eventually(
        lambda: op.logged("failed at commit of the transition quarantined --release_quarantine-->"),
        Within.COMMIT,
        "the retry to be attempted",
    )
    again = eventually(
        lambda: [
            e for e in runs.events(name) if e.reason == "InternalError" and "quarantined run" in e.message
        ],
        Within.COMMIT,
        "an InternalError Event for the failed retry",
    )
    assert "release_quarantine" in again[0].message
    assert runs.state(name) == "quarantined"
