"""The planner's next step: a read that fails, and a planner that cannot answer."""

from __future__ import annotations

import pytest
from tests.unit.builders import (
    T0,
    apply,
    assert_well_formed,
    at,
    checkpoint_of,
    commit_of,
    condition_view,
    conditions,
    drive,
    new_run,
    step,
)

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import Idle, NeedRead, ReadResult
from durable_agents.core.statemachine import RunEvent
from durable_agents_testkit.runs import read_ask_await_complete

pytestmark = pytest.mark.unit


# --- failures ------------------------------------------------------------------------------------


def test_a_forbidden_read_fails_the_run_with_its_reason_and_message() -> None:
    obj = new_run(**read_ask_await_complete("kube-root-ca.crt"))
    obj = apply(obj, commit_of(step(obj, T0)))
    need = step(obj, at(1))
    assert isinstance(need, NeedRead)
    message = "ServiceAccount team-a/default may not read ConfigMap team-a/kube-root-ca.crt"
    failed = commit_of(step(obj, at(1), read=ReadResult(0, error_reason="Forbidden", error_message=message)))
    assert_well_formed(obj, failed)
    assert (failed.event, failed.state) == (RunEvent.ATTEMPT_FAILED, RunState.FAILED)
    assert failed.status.outcome is not None
    assert (failed.status.outcome.reason, failed.status.outcome.message) == ("Forbidden", message)
    # The history entry (and so the AttemptFailed Event) says why, not only that.
    assert failed.detail == f"read ConfigMap/kube-root-ca.crt failed: Forbidden: {message}"
    cp = checkpoint_of(failed)
    assert (cp.evidence, cp.tool_calls) == ([], [])
    assert cp.position.step == 0
    assert condition_view(failed.status) == {
        "Waiting": ("False", "Failed"),
        "Succeeded": ("False", "Forbidden"),
        "Finished": ("True", "Failed"),
        "Quarantined": ("False", "Failed"),
        "Reconciling": ("False", "Failed"),
        "Ready": ("False", "Forbidden"),
        "Stalled": ("True", "Forbidden"),
    }
    assert conditions(failed.status)["Succeeded"].message == message
    assert step(apply(obj, failed), at(2)) == Idle(wake_at=None, reason="run is failed")


def test_a_read_without_evidence_or_reason_fails_as_read_failed() -> None:
    obj = new_run(**read_ask_await_complete("settings"))
    obj = apply(obj, commit_of(step(obj, T0)))
    failed = commit_of(step(obj, at(1), read=ReadResult(0)))
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "ReadFailed"


def test_a_planner_error_fails_the_attempt() -> None:
    obj = new_run(steps=[{"name": "nothing"}])  # the CRD forbids this; the engine must still answer
    obj, commits, idle = drive(obj, T0)
    assert [c.event for c in commits] == [RunEvent.ACCEPTED, RunEvent.ATTEMPT_FAILED]
    assert commits[-1].status.outcome is not None
    assert commits[-1].status.outcome.reason == "PlannerError"
    assert "'nothing'" in commits[-1].status.outcome.message
    assert idle.wake_at is None
