"""Child runs: committed before they are created, awaited, and canceled with their parent."""

from __future__ import annotations

import re
from typing import Any

import pytest
from tests.unit.builders import (
    CHILD,
    DONE,
    RUN,
    T0,
    UID,
    at,
    cancel,
    checkpoint_of,
    cp_of,
    decide_on,
    expect,
    new_run,
)

from durable_agents.api.v1alpha1 import API_VERSION, AgentRunSpec
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import ChildRecord
from durable_agents.core.engine import ChildObservation, Idle, NeedChildren, child_run_name
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit


def waiting_on_child(**spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    obj = new_run(steps=[CHILD, DONE], serviceAccountName="agent-sa", policyRef={"name": "p"}, **spec)
    obj, _ = expect(obj, T0, RunEvent.ACCEPTED, RunState.READY)
    obj, started = expect(obj, at(1), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL)
    assert started.intents == ()
    (body,) = started.children
    return obj, body


def test_a_child_step_commits_the_child_before_it_is_created() -> None:
    obj, body = waiting_on_child()
    cp = cp_of(obj)
    assert cp.children == [ChildRecord(name="run-1-sub", step_index=0)]
    assert obj["status"]["checkpoint"]["children"] == [{"name": "run-1-sub", "stepIndex": 0}]
    assert obj["status"]["waitingFor"] == "child:run-1-sub"
    assert cp.position.step == 0

    meta = body["metadata"]
    assert (meta["name"], meta["namespace"]) == ("run-1-sub", "team-a")
    assert meta["ownerReferences"] == [
        {"apiVersion": API_VERSION, "kind": "AgentRun", "name": RUN, "uid": UID}
    ]
    child = AgentRunSpec.model_validate(body["spec"])
    assert child.parent_ref is not None
    assert (child.parent_ref.name, child.parent_ref.uid) == (RUN, UID)
    assert child.service_account_name == "agent-sa"
    assert child.policy_ref is not None
    assert child.policy_ref.name == "p"
    assert (child.task_type, child.objective, [s.name for s in child.steps]) == ("t", "o", ["c"])

    # Waiting: the shell is asked to make sure the child exists (same body) and to report it.
    assert decide_on(obj, at(2)) == NeedChildren({"run-1-sub": body}, None)
    running = {"run-1-sub": ChildObservation(RunState.READY)}
    assert decide_on(obj, at(2), children=running) == Idle(reason="child run in progress")


def test_a_completed_child_advances_the_parent() -> None:
    obj, _ = waiting_on_child()
    done = {"run-1-sub": ChildObservation(RunState.COMPLETED)}
    obj, received = expect(obj, at(2), RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION, children=done)
    cp = checkpoint_of(received)
    assert cp.position.step == 1
    assert cp.children == [
        ChildRecord(name="run-1-sub", step_index=0, outcome="completed", reason="completed")
    ]
    assert [e.id for e in cp.evidence] == ["child-run-1-sub"]
    obj, _ = expect(obj, at(3), RunEvent.REVALIDATED, RunState.READY)
    obj, _ = expect(obj, at(4), RunEvent.SUCCEEDED, RunState.COMPLETED)


@pytest.mark.parametrize("ended", [RunState.FAILED, RunState.CANCELED, RunState.EXPIRED], ids=str)
def test_a_child_that_did_not_complete_fails_the_parent(ended: RunState) -> None:
    obj, _ = waiting_on_child()
    seen = {"run-1-sub": ChildObservation(ended, reason="SomethingBroke")}
    obj, received = expect(obj, at(2), RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION, children=seen)
    assert checkpoint_of(received).position.step == 0
    obj, failed = expect(obj, at(3), RunEvent.ATTEMPT_FAILED, RunState.FAILED)
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "ChildRunFailed"
    assert "run-1-sub" in failed.status.outcome.message
    assert "SomethingBroke" in failed.status.outcome.message


def test_a_children_cancellation_cancels_the_child_and_the_parent_goes_on() -> None:
    obj, body = waiting_on_child()
    obj = cancel(obj, {"kids-1": {"scope": "children", "reason": "too slow"}})
    obj, recorded = expect(obj, at(2), RunEvent.CANCEL_RECORDED, RunState.WAITING_EXTERNAL)
    assert recorded.status.waiting_for == "child:run-1-sub"
    assert "no tool call to cancel" not in recorded.detail
    need = decide_on(obj, at(3))
    assert isinstance(need, NeedChildren), need
    assert need.records == {"run-1-sub": body}
    assert need.cancel is not None
    assert "kids-1" in need.cancel

    canceled = {"run-1-sub": ChildObservation(RunState.CANCELED, reason="Canceled")}
    obj, received = expect(
        obj, at(4), RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION, children=canceled
    )
    assert checkpoint_of(received).position.step == 1, "a child canceled on request is not a failure"
    obj, _ = expect(obj, at(5), RunEvent.REVALIDATED, RunState.READY)
    obj, _ = expect(obj, at(6), RunEvent.SUCCEEDED, RunState.COMPLETED)


def test_a_task_cancellation_cancels_running_children_before_finishing() -> None:
    obj, _ = waiting_on_child()
    obj = cancel(obj, {"stop-1": {"reason": "abort"}})
    obj, _ = expect(obj, at(2), RunEvent.CANCEL_REQUESTED, RunState.CANCEL_REQUESTED)
    need = decide_on(obj, at(3))
    assert isinstance(need, NeedChildren), need
    assert need.records == {"run-1-sub": None}, "a missing child is not created while canceling"
    assert need.cancel is not None
    assert "stop-1" in need.cancel
    still = {"run-1-sub": ChildObservation(RunState.CANCEL_REQUESTED)}
    assert isinstance(decide_on(obj, at(4), children=still), Idle)
    gone = {"run-1-sub": ChildObservation(RunState.CANCELED)}
    obj, finished = expect(obj, at(5), RunEvent.CANCEL_FINISHED, RunState.CANCELED, children=gone)
    assert finished.status.outcome is not None
    assert finished.status.outcome.reason == "Canceled"


@pytest.mark.parametrize(
    ("parent", "step_name"),
    [("run-1", "sub"), ("p" * 40, "s" * 22), ("p" * 40, "s" * 23), ("a" * 63, "b" * 63), ("x-" * 30, "y")],
)
def test_child_run_names_fit_a_label_value(parent: str, step_name: str) -> None:
    name = child_run_name(parent, step_name)
    assert len(name) <= 63
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
    assert name == child_run_name(parent, step_name), "deterministic"
    if len(parent) + 1 + len(step_name) <= 63:
        assert name == f"{parent}-{step_name}"
    else:
        assert name != child_run_name(parent, step_name + "x"), "different steps, different children"
