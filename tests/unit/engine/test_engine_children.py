"""Child runs: committed before they are created, awaited, and canceled with their parent; only a
child the operator made (its stamp, the step's spec) is ever adopted."""

from __future__ import annotations

import copy
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
from durable_agents.core.engine.children import (
    CHILD_STAMP_ANNOTATION,
    FOREIGN_CHILD,
    PARENT_STEP_ANNOTATION,
    child_failure,
    foreign_child,
    stamp_child,
)
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp
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


# --- adopting only what the operator made ----------------------------------------------------

KEYS = Keyring(keys={"k1": bytes(range(32))}, active_key_id="k1")
OTHER_KEYS = Keyring(keys={"k1": bytes(range(1, 33))}, active_key_id="k1")


def as_stored(body: dict[str, Any]) -> dict[str, Any]:
    """The child as the API server returns it: uid, defaults, the webhook's createdBy, a status."""
    out = copy.deepcopy(body)
    out["metadata"].update(uid="child-uid-1", resourceVersion="7", generation=1)
    out["metadata"]["annotations"]["example.com/note"] = "added by a tool"
    out["spec"]["steps"][0]["complete"] = {"result": ""}
    out["spec"]["createdBy"] = {"username": "system:serviceaccount:team-a:agent-sa", "groups": []}
    out["spec"]["answers"] = {"unrelated": "yes"}
    out["status"] = {"state": "completed", "stateVersion": 3}
    return out


def judge(found: dict[str, Any], expected: dict[str, Any] | None, run_id: str = UID) -> str | None:
    return foreign_child(found, expected, keyring=KEYS, parent_run_id=run_id, parent_name=RUN)


def test_the_child_the_operator_stamped_is_adopted_as_the_api_server_returns_it() -> None:
    _, body = waiting_on_child()
    assert body["metadata"]["annotations"] == {PARENT_STEP_ANNOTATION: "sub"}
    stamped = stamp_child(body, KEYS, UID)
    assert CHILD_STAMP_ANNOTATION not in body["metadata"]["annotations"], "the engine's body is not changed"
    assert stamped["metadata"]["annotations"][CHILD_STAMP_ANNOTATION].startswith("k1:")
    assert judge(as_stored(stamped), body) is None
    # While canceling, the step's body is not at hand: the stamp and the parent reference decide.
    assert judge(as_stored(stamped), None) is None


def test_a_run_created_first_under_the_childs_name_is_foreign_even_owned_by_the_parent() -> None:
    """The attack of the issue: same name, same spec, owner reference and parentRef to the parent."""
    _, body = waiting_on_child()
    assert body["metadata"]["ownerReferences"][0]["uid"] == UID
    why = judge(as_stored(body), body)
    assert why == "it carries no child stamp"
    assert judge(as_stored(body), None) == why


def test_a_copied_or_forged_stamp_proves_nothing() -> None:
    _, body = waiting_on_child()
    stamped = as_stored(stamp_child(body, KEYS, UID))
    value = stamped["metadata"]["annotations"][CHILD_STAMP_ANNOTATION]

    # Copied from this child onto a child of another parent run (another run ID).
    assert judge(stamped, body, run_id="another-run-id") is not None
    # Made by someone else's keys, or for another purpose with ours.
    forged = copy.deepcopy(stamped)
    forged["metadata"]["annotations"][CHILD_STAMP_ANNOTATION] = stamp_child(body, OTHER_KEYS, UID)[
        "metadata"
    ]["annotations"][CHILD_STAMP_ANNOTATION]
    assert judge(forged, body) is not None
    proof = {"parentRunId": UID, "step": "sub", "child": "run-1-sub"}
    forged["metadata"]["annotations"][CHILD_STAMP_ANNOTATION] = stamp(KEYS, Purpose.CONTROL, proof)
    assert judge(forged, body) is not None
    forged["metadata"]["annotations"][CHILD_STAMP_ANNOTATION] = "k1:AAAA"
    assert judge(forged, body) is not None
    # Copied onto an object under another child's name (the stamp binds the name).
    renamed = copy.deepcopy(stamped)
    renamed["metadata"]["name"] = "run-1-other"
    assert judge(renamed, None) is not None
    # A claim of another step, with this child's stamp.
    other_step = copy.deepcopy(stamped)
    other_step["metadata"]["annotations"][PARENT_STEP_ANNOTATION] = "other"
    assert judge(other_step, body) == "it was made for step 'other', not 'sub'"
    assert judge(other_step, None) is not None
    assert value == stamped["metadata"]["annotations"][CHILD_STAMP_ANNOTATION]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("steps", [{"name": "c", "effect": {"effect": "http.post", "target": {"url": "http://evil"}}}]),
        ("serviceAccountName", "cluster-admin-sa"),
        ("agent", {"planner": "scripted", "model": "another-model"}),
        ("objective", "something else"),
        ("parentRef", {"name": "another-parent", "uid": UID}),
    ],
)
def test_a_stamped_child_whose_spec_is_not_the_steps_child_is_foreign(field: str, value: Any) -> None:
    """A stamp copied from the real child (deleted) onto a new run doing other work is not adopted."""
    _, body = waiting_on_child()
    stamped = as_stored(stamp_child(body, KEYS, UID))
    stamped["spec"][field] = value
    why = judge(stamped, body)
    assert why is not None
    if field == "parentRef":
        assert judge(stamped, None) is not None


def test_without_a_keyring_nothing_is_adopted() -> None:
    _, body = waiting_on_child()
    stamped = as_stored(stamp_child(body, KEYS, UID))
    assert foreign_child(stamped, body, keyring=None, parent_run_id=UID, parent_name=RUN) is not None


def test_a_foreign_child_fails_the_parents_step_and_is_never_adopted() -> None:
    obj, _ = waiting_on_child()
    seen = {"run-1-sub": ChildObservation(RunState.FAILED, FOREIGN_CHILD)}
    obj, received = expect(obj, at(2), RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION, children=seen)
    cp = checkpoint_of(received)
    assert cp.position.step == 0, "the step did not happen: the parent does not go on"
    assert cp.children == [
        ChildRecord(name="run-1-sub", step_index=0, outcome="failed", reason=FOREIGN_CHILD)
    ]
    assert "ForeignChild" in received.detail
    obj, failed = expect(obj, at(3), RunEvent.ATTEMPT_FAILED, RunState.FAILED)
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == FOREIGN_CHILD
    assert "team-a/run-1-sub" in failed.status.outcome.message
    assert "not adopted" in failed.status.outcome.message


def test_the_outcome_of_a_failed_child_says_whether_it_was_foreign() -> None:
    foreign = child_failure(
        "team-a", ChildRecord(name="x", step_index=0, outcome="failed", reason=FOREIGN_CHILD)
    )
    assert (foreign.reason, "team-a/x" in foreign.message) == (FOREIGN_CHILD, True)
    failed = child_failure("team-a", ChildRecord(name="x", step_index=0, outcome="expired", reason="Late"))
    assert failed.reason == "ChildRunFailed"
    assert failed.message == "child run x ended expired: Late"
