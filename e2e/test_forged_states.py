"""A forged end is never believed: not by the engine, a parent run, or retention.

Someone RBAC lets write ``agentruns/status`` (the chart's admission policy absent: this is the
second line) sets a live run's ``status.state`` to ``completed``, ``failed`` or ``canceled``, with
exactly ``kubectl patch agentrun RUN --subresource status --type=merge -p '{"status":{"state":...}}'``.
The status's position stamp (:mod:`durable_agents.core.positions`) does not verify: the run is
quarantined ``IntegrityFailed``, its effect is never sent, a parent waiting on it does not go on to
its next effect, and retention (the run's TTL is a second) neither deletes it nor records it as
the end it never reached: once a person cancels it, its record says ``canceled``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from e2e.test_integrity import mallory  # noqa: F401 (a fixture)
from e2e.test_interruptions import ASK, DONE, cancel, grant_agentruns, pay, run_spec
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.engine.children import child_run_name
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

LEASE = 2


def forge_state(api: client.ApiClient, runs: Runs, name: str, state: str) -> None:
    """What ``kubectl patch agentrun NAME --subresource status --type=merge`` sends."""
    client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, runs.namespace, "agentruns", name, {"status": {"state": state}}
    )


def quarantined(runs: Runs, name: str) -> dict[str, Any]:
    """The run, once its worker quarantined it ``IntegrityFailed`` (the forged state is not it)."""
    run = runs.wait_state(name, "quarantined", timeout=Within.COMMIT)
    status = run["status"]
    assert status["outcome"]["reason"] == "IntegrityFailed", status["outcome"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Quarantined"]["status"], conditions["Quarantined"]["reason"]) == (
        "True",
        "IntegrityFailed",
    )
    return run


def brief_retention(runs: Runs) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "brief"},
        "spec": {"version": "v1", "approvalRequiredTiers": [], "retention": {"ttlAfterFinished": "1s"}},
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)


def records_of(runs: Runs, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = runs.custom.list_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentrunrecords", label_selector=f"durable-agents.io/run={name}"
    )["items"]
    return items


def gone(runs: Runs, name: str) -> bool:
    try:
        runs.get(name)
    except client.ApiException as err:
        return err.status == 404
    return False


@pytest.mark.parametrize("forged", ["completed", "failed", "canceled"])
@pytest.mark.local_plane("users")
def test_a_forged_end_of_a_top_level_run_is_quarantined_and_never_recorded_as_such(
    forged: str,
    mallory: client.ApiClient,  # noqa: F811
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    brief_retention(runs)
    start_operator("forged-end", LEASE)
    name = runs.create(run_spec(ASK, pay(refsystem.url), DONE, policyRef={"name": "brief"}))
    runs.wait_state(name, "waiting_input", timeout=Within.COMMIT)
    forge_state(mallory, runs, name, forged)

    run = quarantined(runs, name)
    assert "position stamp does not verify" in run["status"]["outcome"]["message"]
    assert run["status"]["history"][-1]["from"] == forged
    assert run["status"]["checkpoint"]["position"]["state"] == "waiting_input", "checkpoint untouched"
    assert records_of(runs, name) == [], "retention recorded a run that never ended"
    assert refsystem.total() == 0

    # A person cancels it: the end retention records (and deletes after its TTL) is the real one.
    cancel(runs, name, "after-forgery", "task", "status was forged")
    eventually(lambda: gone(runs, name), Within.RUN, f"{name} deleted after its retention")
    (record,) = records_of(runs, name)
    assert record["spec"]["state"] == "canceled", record["spec"]
    events = [h["event"] for h in record["spec"]["history"]]
    assert "quarantine" in events
    assert refsystem.total() == 0, "the effect after the question was never sent"


@pytest.mark.parametrize("forged", ["completed", "failed", "canceled"])
@pytest.mark.local_plane("users")
def test_a_forged_end_of_a_child_run_does_not_move_its_parent(
    forged: str,
    kube: KubeEnv,
    namespace: str,
    mallory: client.ApiClient,  # noqa: F811
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    grant_agentruns(kube, namespace)
    start_operator("forged-child", LEASE)
    child = {"name": "child", "child": {"taskType": "sub", "objective": "ask", "steps": [ASK, DONE]}}
    name = runs.create(run_spec(child, pay(refsystem.url), DONE))
    child_name = child_run_name(name, "child")
    runs.wait_state(child_name, "waiting_input", timeout=Within.COMMIT)
    runs.wait_state(name, "waiting_external", timeout=Within.COMMIT)

    forge_state(mallory, runs, child_name, forged)
    sub = quarantined(runs, child_name)
    assert sub["status"]["checkpoint"]["position"]["state"] == "waiting_input"
    # The parent was woken by the forged end: it did not believe it, and waits.
    assert runs.state(name) == "waiting_external"
    assert refsystem.total() == 0

    # The child is canceled for real: the parent's step fails with the child's real end (never
    # the forged one), and the effect after it is never sent.
    cancel(runs, child_name, "after-forgery", "task", "status was forged")
    runs.wait_state(child_name, "canceled", timeout=Within.COMMIT)
    done = runs.wait_state(name, "failed", "completed", "canceled", timeout=Within.RUN)
    (record,) = done["status"]["checkpoint"]["children"]
    # The real end carries the child's stamped outcome ("Canceled"); the forged state had none.
    assert (record["outcome"], record.get("reason")) == ("canceled", "Canceled"), record
    assert done["status"]["state"] != "completed", done["status"]
    assert refsystem.total() == 0
