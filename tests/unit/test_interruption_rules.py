"""Interruptions, purely: cancellation scopes, retry windows, child runs, deployment changes,
runtime configuration availability and quarantine controls, as :func:`decide` answers them.

No cluster: runs are plain dicts (see ``test_engine``), action and child-run observations are
handed to :func:`decide` as the shell would after reading the ledger or the child records.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from tests.unit.test_engine import (
    EPOCH,
    FUTURE_CHECKPOINT,
    PLANNER,
    QUARANTINE_IDLE,
    SETTINGS,
    T0,
    apply,
    assert_well_formed,
    at,
    checkpoint_of,
    commit_of,
    evidence_for,
    iso,
    new_run,
    patch_spec,
    snap,
)

from durable_agents.api.v1alpha1 import (
    API_VERSION,
    ActionRecordSpec,
    ActionState,
    ActionTier,
    AgentPolicySpec,
    AgentRunSpec,
    CancelScope,
    RetryPolicy,
    UnreversedEffect,
)
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import CancellationRecord, ChildRecord, dump_checkpoint, seal_field
from durable_agents.core.engine import (
    ActionObservation,
    ChildObservation,
    Commit,
    Decision,
    Idle,
    NeedActions,
    NeedChildren,
    NeedRead,
    ReadResult,
    Settings,
    child_run_name,
    decide,
    retry_backoff,
)
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents.core.sealing import Keyring
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit

S, E = RunState, RunEvent
A = ActionState

UID: str = new_run()["metadata"]["uid"]
RUN = "run-1"

DONE: dict[str, Any] = {"name": "done", "complete": {"result": "ok"}}
READ: dict[str, Any] = {
    "name": "read-settings",
    "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": "settings"}},
}
CHILD: dict[str, Any] = {
    "name": "sub",
    "child": {"taskType": "t", "objective": "o", "steps": [{"name": "c", "complete": {}}]},
}
NOT_FOUND = 'configmaps "settings" not found'


def ask(name: str) -> dict[str, Any]:
    return {"name": name, "ask": {"question": f"{name}?", "expiresIn": "1h"}}


def wait_for_event(name: str) -> dict[str, Any]:
    return {"name": name, "await": {"event": "window-open", "expiresIn": "1h"}}


def effect(name: str, *, compensates: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "effect": "http.post",
        "target": {"url": "https://payments.example/api"},
        "arguments": {"step": name},
    }
    if compensates is not None:
        body["compensates"] = compensates
    return {"name": name, "effect": body}


def settings_with(
    *, tier: ActionTier = ActionTier.REVERSIBLE, operator_version: str | None = None, **policy: Any
) -> Settings:
    """Settings resolved from an AgentPolicy (camelCase fields, as in the CRD)."""
    return Settings(
        policy_name="team-policy",
        policy_version="v1",
        policy=AgentPolicySpec.model_validate({"version": "v1", **policy}),
        tiers={"http.post": tier},
        operator_version=operator_version,
    )


# A reversible effect without a policy needs no approval: it goes straight to the ledger.
EFFECTS = Settings(policy_name="team-policy", policy_version="v1", tiers={"http.post": ActionTier.REVERSIBLE})
RETRY_3 = settings_with(retry={"maxAttempts": 3, "initialBackoff": "2s"})


def decide_on(
    obj: dict[str, Any],
    now: datetime,
    *,
    settings: Settings = SETTINGS,
    read: ReadResult | None = None,
    actions: dict[str, ActionObservation] | None = None,
    children: dict[str, ChildObservation] | None = None,
) -> Decision:
    """One call of decide, checking that the record it was given is left untouched."""
    before = copy.deepcopy(obj)
    decision = decide(
        snap(obj),
        now=now,
        epoch=EPOCH,
        planner=PLANNER,
        settings=settings,
        read=read,
        actions=actions,
        children=children,
    )
    assert obj == before, "decide must not mutate the record it reads"
    return decision


def advance(
    obj: dict[str, Any],
    now: datetime,
    *,
    settings: Settings = SETTINGS,
    read: ReadResult | None = None,
    actions: dict[str, ActionObservation] | None = None,
    children: dict[str, ChildObservation] | None = None,
) -> tuple[dict[str, Any], Commit]:
    """Decide, expect a well-formed commit, and store it."""
    commit = commit_of(decide_on(obj, now, settings=settings, read=read, actions=actions, children=children))
    assert_well_formed(obj, commit)
    return apply(obj, commit), commit


def expect(
    obj: dict[str, Any], now: datetime, event: RunEvent, state: RunState, **kwargs: Any
) -> tuple[dict[str, Any], Commit]:
    obj, commit = advance(obj, now, **kwargs)
    assert (commit.event, commit.state) == (event, state), commit.detail
    return obj, commit


def cancel(obj: dict[str, Any], requests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A user adds cancellation requests (the webhook would stamp requestedBy/requestedAt)."""
    return patch_spec(obj, cancellations={**obj["spec"].get("cancellations", {}), **requests})


def failed_read(index: int = 0) -> ReadResult:
    return ReadResult(index, error_reason="NotFound", error_message=NOT_FOUND)


def walk(obj: dict[str, Any], until: RunState, *, settings: Settings, now: datetime = T0) -> dict[str, Any]:
    """Commit until the run is in ``until``; every read fails (NotFound)."""
    for _ in range(20):
        if obj.get("status", {}).get("state") == until.value:
            return obj
        decision = decide_on(obj, now, settings=settings)
        if isinstance(decision, NeedRead):
            decision = decide_on(obj, now, settings=settings, read=failed_read(decision.step_index))
        commit = commit_of(decision)
        assert_well_formed(obj, commit)
        obj = apply(obj, commit)
    raise AssertionError(f"the run did not reach {until.value}")


def reach(state: RunState) -> tuple[dict[str, Any], Settings]:
    """A run that got to ``state`` the ordinary way, with the settings it runs under."""
    if state is S.WAITING_APPROVAL:
        settings = settings_with(tier=ActionTier.CONSEQUENTIAL)
        return walk(new_run(steps=[effect("pay"), DONE]), state, settings=settings), settings
    if state is S.WAITING_RETRY:
        return walk(new_run(steps=[READ, DONE]), state, settings=RETRY_3), RETRY_3
    if state is S.WAITING_EXTERNAL:
        return walk(new_run(steps=[wait_for_event("window"), DONE]), state, settings=SETTINGS), SETTINGS
    answers = {"confirm": "yes"} if state is S.RESUME_VALIDATION else {}
    return walk(new_run(steps=[ask("confirm"), DONE], answers=answers), state, settings=SETTINGS), SETTINGS


def waiting_on_action(
    settings: Settings, steps: list[dict[str, Any]]
) -> tuple[dict[str, Any], ActionRecordSpec]:
    """A run in waiting_external on the intent of its effect step (step 0), and that intent."""
    obj, _ = expect(new_run(steps=steps), T0, E.ACCEPTED, S.READY, settings=settings)
    obj, intent = expect(obj, at(1), E.EXTERNAL_AWAITED, S.WAITING_EXTERNAL, settings=settings)
    (spec,) = intent.intents
    name = action_record_name(spec.idempotency_key)
    assert intent.status.waiting_for == f"action:{name}"
    assert [p.action_record_name for p in checkpoint_of(intent).pending_actions] == [name]
    return obj, spec


def cp_of(obj: dict[str, Any]) -> Any:
    return checkpoint_of(obj["status"]["checkpoint"])


# --- 1. task scope: the run ends canceled ---------------------------------------------------

TASK_CANCELABLE = [
    S.READY,
    S.WAITING_INPUT,
    S.WAITING_EXTERNAL,
    S.WAITING_APPROVAL,
    S.WAITING_RETRY,
    S.RESUME_VALIDATION,
]


@pytest.mark.parametrize("state", TASK_CANCELABLE, ids=str)
def test_a_task_cancellation_requests_then_finishes_cancel(state: RunState) -> None:
    obj, settings = reach(state)
    assert obj["status"]["state"] == state.value
    current_step = cp_of(obj).position.step
    obj = cancel(obj, {"stop-1": {"reason": "wrong ticket", "requestedAt": iso(at(5))}})

    # Even a due retry or a delivered answer does not beat the request: one commit, cancel_requested.
    obj, requested = expect(obj, at(10), E.CANCEL_REQUESTED, S.CANCEL_REQUESTED, settings=settings)
    cancellation = requested.status.cancellation
    assert cancellation is not None
    assert (cancellation.request_id, cancellation.scope, cancellation.reason, cancellation.requested_at) == (
        "stop-1",
        CancelScope.TASK,
        "wrong ticket",
        at(5),
    )
    assert checkpoint_of(requested).cancellations == [
        CancellationRecord(request_id="stop-1", scope="task", step_index=current_step, handled_at=at(10))
    ]
    assert requested.status.waiting_for is None
    assert requested.status.outcome is None
    assert "stop-1" in requested.detail

    # Nothing in flight: the next decision finishes the cancellation.
    obj, finished = expect(obj, at(11), E.CANCEL_FINISHED, S.CANCELED, settings=settings)
    assert finished.status.outcome is not None
    assert finished.status.outcome.reason == "Canceled"
    assert finished.status.outcome.message == "wrong ticket; no effect happened"
    done = finished.status.cancellation
    assert done is not None
    assert (done.request_id, done.reason, done.requested_at) == ("stop-1", "wrong ticket", at(5))
    assert (done.unreversed_effects, done.canceled_actions, done.proposed_compensations) == ([], [], [])
    succeeded = {c["type"]: c for c in obj["status"]["conditions"]}["Succeeded"]
    assert (succeeded["status"], succeeded["reason"]) == ("False", "Canceled")
    assert decide_on(obj, at(12), settings=settings) == Idle(reason="run is canceled")


def test_a_task_cancellation_is_acted_on_once() -> None:
    obj, settings = reach(S.WAITING_INPUT)
    obj = cancel(obj, {"stop-1": {}})
    obj, _ = expect(obj, at(10), E.CANCEL_REQUESTED, S.CANCEL_REQUESTED, settings=settings)
    # The request is still in the spec: in cancel_requested it is not requested again.
    obj, finished = expect(obj, at(11), E.CANCEL_FINISHED, S.CANCELED, settings=settings)
    assert [c.request_id for c in checkpoint_of(finished).cancellations] == ["stop-1"]
    assert finished.status.outcome is not None
    assert finished.status.outcome.message == "canceled; no effect happened"


# --- 2. task scope with an action in flight: reconciled, never assumed undone ----------------


@pytest.mark.parametrize(
    ("observed", "canceled", "unreversed"),
    [(A.CANCELED, True, False), (A.SUCCEEDED, False, True), (A.FAILED, False, False)],
    ids=["canceled", "succeeded", "failed"],
)
def test_a_task_cancellation_reconciles_the_pending_action(
    observed: ActionState, canceled: bool, unreversed: bool
) -> None:
    obj, spec = waiting_on_action(EFFECTS, [effect("pay"), DONE])
    name = action_record_name(spec.idempotency_key)
    # Without a cancellation the shell is asked to reconcile, not to cancel.
    assert decide_on(obj, at(2), settings=EFFECTS) == NeedActions({name: spec}, cancel=False)

    obj = cancel(obj, {"stop-1": {"reason": "abort"}})
    obj, requested = expect(obj, at(3), E.CANCEL_REQUESTED, S.CANCEL_REQUESTED, settings=EFFECTS)
    assert [p.action_record_name for p in checkpoint_of(requested).pending_actions] == [name]

    # The shell must cancel the intent if undispatched (cancel=True), and report its state.
    assert decide_on(obj, at(4), settings=EFFECTS) == NeedActions({name: spec}, cancel=True)

    seen = {name: ActionObservation(observed, outcome={"id": "pay-1"}, reason="Whatever")}
    obj, finished = expect(obj, at(5), E.CANCEL_FINISHED, S.CANCELED, settings=EFFECTS, actions=seen)
    status = finished.status.cancellation
    assert status is not None
    assert status.canceled_actions == ([name] if canceled else [])
    assert status.unreversed_effects == (
        [UnreversedEffect(step="pay", effect="http.post", action_record=name, state="succeeded")]
        if unreversed
        else []
    )
    assert finished.status.outcome is not None
    assert finished.status.outcome.reason == "Canceled"
    happened = "1 effect(s) happened and were not undone" if unreversed else "no effect happened"
    assert finished.status.outcome.message == f"abort; {happened}"
    assert checkpoint_of(finished).pending_actions == []


@pytest.mark.parametrize("observed", [A.DISPATCHING, A.OUTCOME_UNKNOWN, A.INTENT], ids=str)
def test_a_task_cancellation_waits_for_a_dispatched_or_unknown_action(observed: ActionState) -> None:
    obj, spec = waiting_on_action(EFFECTS, [effect("pay"), DONE])
    name = action_record_name(spec.idempotency_key)
    obj = cancel(obj, {"stop-1": {}})
    obj, _ = expect(obj, at(3), E.CANCEL_REQUESTED, S.CANCEL_REQUESTED, settings=EFFECTS)
    idle = decide_on(obj, at(4), settings=EFFECTS, actions={name: ActionObservation(observed)})
    assert isinstance(idle, Idle), idle
    assert name in idle.reason
    # Not reported at all: the same.
    assert isinstance(decide_on(obj, at(4), settings=EFFECTS, actions={}), Idle)


# --- 3. earlier effects stay: unreversed, and compensations proposed by policy ---------------


@pytest.mark.parametrize("propose", [True, False])
def test_earlier_succeeded_effects_are_reported_unreversed_with_proposed_compensations(propose: bool) -> None:
    settings = settings_with(proposeCompensations=propose)
    steps = [effect("pay"), ask("confirm"), effect("refund", compensates="pay"), DONE]
    obj, spec = waiting_on_action(settings, steps)
    name = action_record_name(spec.idempotency_key)
    ok = {name: ActionObservation(A.SUCCEEDED, outcome={"payment": "p-1"})}
    obj, received = expect(
        obj, at(2), E.EXTERNAL_RECEIVED, S.RESUME_VALIDATION, settings=settings, actions=ok
    )
    assert checkpoint_of(received).position.step == 1
    obj, _ = expect(obj, at(3), E.REVALIDATED, S.READY, settings=settings)
    obj, _ = expect(obj, at(4), E.INPUT_REQUESTED, S.WAITING_INPUT, settings=settings)

    obj = cancel(obj, {"stop-1": {"reason": "changed my mind"}})
    obj, _ = expect(obj, at(5), E.CANCEL_REQUESTED, S.CANCEL_REQUESTED, settings=settings)
    obj, finished = expect(obj, at(6), E.CANCEL_FINISHED, S.CANCELED, settings=settings)
    status = finished.status.cancellation
    assert status is not None
    assert status.unreversed_effects == [
        UnreversedEffect(step="pay", effect="http.post", action_record=name, state="succeeded")
    ]
    assert status.canceled_actions == []
    assert status.proposed_compensations == (["refund"] if propose else [])
    assert finished.status.outcome is not None
    assert "1 effect(s) happened and were not undone" in finished.status.outcome.message


def test_without_a_policy_no_compensation_is_proposed() -> None:
    steps = [effect("pay"), ask("confirm"), effect("refund", compensates="pay"), DONE]
    obj, spec = waiting_on_action(EFFECTS, steps)
    ok = {action_record_name(spec.idempotency_key): ActionObservation(A.SUCCEEDED)}
    obj, _ = expect(obj, at(2), E.EXTERNAL_RECEIVED, S.RESUME_VALIDATION, settings=EFFECTS, actions=ok)
    obj = walk(obj, S.WAITING_INPUT, settings=EFFECTS)
    obj = cancel(obj, {"stop-1": {}})
    obj, _ = expect(obj, at(5), E.CANCEL_REQUESTED, S.CANCEL_REQUESTED, settings=EFFECTS)
    obj, finished = expect(obj, at(6), E.CANCEL_FINISHED, S.CANCELED, settings=EFFECTS)
    assert finished.status.cancellation is not None
    assert len(finished.status.cancellation.unreversed_effects) == 1
    assert finished.status.cancellation.proposed_compensations == []


# --- 4. turn and tool-call scope: the step is abandoned, the run goes on ----------------------


@pytest.mark.parametrize("kind", ["ask", "await"])
def test_a_turn_cancellation_in_a_wait_abandons_the_step_after_resume_validation(kind: str) -> None:
    first = ask("confirm") if kind == "ask" else wait_for_event("window")
    waiting = S.WAITING_INPUT if kind == "ask" else S.WAITING_EXTERNAL
    obj = walk(new_run(steps=[first, ask("next"), DONE]), waiting, settings=SETTINGS)
    obj = cancel(obj, {"skip-1": {"scope": "turn", "reason": "not needed"}})

    obj, canceled = expect(obj, at(10), E.STEP_CANCELED, S.RESUME_VALIDATION)
    cp = checkpoint_of(canceled)
    assert cp.cancellations == [
        CancellationRecord(request_id="skip-1", scope="turn", step_index=0, handled_at=at(10))
    ]
    assert cp.position.step == 0, "the step is abandoned by resume validation, not before"
    assert canceled.status.cancellation is None, "only a task cancellation is reported in status"

    obj, revalidated = expect(obj, at(11), E.REVALIDATED, S.READY)
    cp = checkpoint_of(revalidated)
    assert cp.position.step == 1, "the canceled step is skipped"
    assert (cp.pending_input, cp.pending_external, cp.input_refs) == (None, None, [])
    assert "abandoned" in revalidated.detail
    assert "skip-1" in revalidated.detail

    # The run goes on with the next step, and the request is not acted on again.
    obj, asked = expect(obj, at(12), E.INPUT_REQUESTED, S.WAITING_INPUT)
    assert asked.status.waiting_for == "input:next"
    assert isinstance(decide_on(obj, at(13)), Idle)


def test_a_turn_cancellation_in_ready_skips_the_step_at_once() -> None:
    obj = walk(new_run(steps=[ask("confirm"), ask("next"), DONE]), S.READY, settings=SETTINGS)
    obj = cancel(obj, {"skip-1": {"scope": "turn"}})
    obj, canceled = expect(obj, at(10), E.STEP_CANCELED, S.READY)
    cp = checkpoint_of(canceled)
    assert cp.position.step == 1
    assert [(c.request_id, c.scope, c.step_index) for c in cp.cancellations] == [("skip-1", "turn", 0)]
    # "confirm" is never asked: the next question is.
    obj, asked = expect(obj, at(11), E.INPUT_REQUESTED, S.WAITING_INPUT)
    assert asked.status.waiting_for == "input:next"


def test_a_turn_cancellation_in_waiting_retry_abandons_the_failing_step() -> None:
    obj, settings = reach(S.WAITING_RETRY)
    obj = cancel(obj, {"skip-1": {"scope": "turn"}})
    obj, _ = expect(obj, at(0.5), E.STEP_CANCELED, S.RESUME_VALIDATION, settings=settings)
    obj, revalidated = expect(obj, at(0.6), E.REVALIDATED, S.READY, settings=settings)
    cp = checkpoint_of(revalidated)
    assert (cp.position.step, cp.retry.retry_at) == (1, None)
    expect(obj, at(0.7), E.SUCCEEDED, S.COMPLETED, settings=settings)


def test_a_tool_call_cancellation_with_nothing_pending_is_only_recorded() -> None:
    obj = walk(new_run(steps=[ask("confirm"), DONE]), S.WAITING_INPUT, settings=SETTINGS)
    before = cp_of(obj)
    obj = cancel(obj, {"tc-1": {"scope": "toolCall"}})
    obj, recorded = expect(obj, at(10), E.CANCEL_RECORDED, S.WAITING_INPUT)
    assert "no tool call to cancel" in recorded.detail
    assert recorded.status.waiting_for == "input:confirm", "what the run waits for stays visible"
    assert recorded.status.state_since == T0, "the state did not change"
    cp = checkpoint_of(recorded)
    assert [(c.request_id, c.scope, c.step_index) for c in cp.cancellations] == [("tc-1", "toolCall", 0)]
    assert (cp.position.step, cp.pending_input) == (0, before.pending_input)

    # Still waiting for the answer (not recorded again), which then moves the run on as usual.
    assert pending_input_expiry(obj) == T0 + timedelta(hours=1)
    assert decide_on(obj, at(20)) == Idle(wake_at=T0 + timedelta(hours=1), reason="waiting")
    obj = patch_spec(obj, answers={"confirm": "yes"})
    obj, received = expect(obj, at(30), E.INPUT_RECEIVED, S.RESUME_VALIDATION)
    assert [r.id for r in checkpoint_of(received).input_refs] == ["answer-confirm"]
    obj, _ = expect(obj, at(31), E.REVALIDATED, S.READY)
    obj, _ = expect(obj, at(32), E.SUCCEEDED, S.COMPLETED)


def pending_input_expiry(obj: dict[str, Any]) -> datetime:
    pending = cp_of(obj).pending_input
    assert pending is not None
    expires: datetime = pending.expires_at
    return expires


def test_cancellation_requests_are_handled_once_each_in_request_id_order() -> None:
    obj = walk(new_run(steps=[ask("first"), ask("second"), DONE]), S.WAITING_INPUT, settings=SETTINGS)
    # Inserted out of order: handled by request ID, not by insertion.
    obj = cancel(obj, {"b-turn": {"scope": "turn"}, "a-tool-call": {"scope": "toolCall"}})
    obj, first = expect(obj, at(10), E.CANCEL_RECORDED, S.WAITING_INPUT)
    assert "a-tool-call" in first.detail
    obj, second = expect(obj, at(11), E.STEP_CANCELED, S.RESUME_VALIDATION)
    assert "b-turn" in second.detail
    obj, _ = expect(obj, at(12), E.REVALIDATED, S.READY)
    obj, asked = expect(obj, at(13), E.INPUT_REQUESTED, S.WAITING_INPUT)
    assert asked.status.waiting_for == "input:second"
    assert [(c.request_id, c.step_index) for c in checkpoint_of(asked).cancellations] == [
        ("a-tool-call", 0),
        ("b-turn", 0),
    ]
    # Neither request touches the second question.
    assert decide_on(obj, at(14)) == Idle(wake_at=at(13) + timedelta(hours=1), reason="waiting")


@pytest.mark.parametrize("scope", ["turn", "toolCall"])
@pytest.mark.parametrize("observed", [A.CANCELED, A.SUCCEEDED], ids=str)
def test_a_step_cancellation_of_an_action_in_flight_reconciles_then_goes_on(
    scope: str, observed: ActionState
) -> None:
    obj, spec = waiting_on_action(EFFECTS, [effect("pay"), ask("after"), DONE])
    name = action_record_name(spec.idempotency_key)
    obj = cancel(obj, {"c-1": {"scope": scope}})
    obj, recorded = expect(obj, at(2), E.CANCEL_RECORDED, S.WAITING_EXTERNAL, settings=EFFECTS)
    assert recorded.status.waiting_for == f"action:{name}"
    assert "no tool call to cancel" not in recorded.detail
    assert decide_on(obj, at(3), settings=EFFECTS) == NeedActions({name: spec}, cancel=True)

    seen = {name: ActionObservation(observed)}
    obj, _ = expect(obj, at(4), E.EXTERNAL_RECEIVED, S.RESUME_VALIDATION, settings=EFFECTS, actions=seen)
    # Canceled: the step is abandoned (not failed); succeeded: it is done. Either way, the next step.
    obj, revalidated = expect(obj, at(5), E.REVALIDATED, S.READY, settings=EFFECTS)
    assert checkpoint_of(revalidated).position.step == 1
    obj, asked = expect(obj, at(6), E.INPUT_REQUESTED, S.WAITING_INPUT, settings=EFFECTS)
    assert asked.status.waiting_for == "input:after"


@pytest.mark.parametrize("scope", ["turn", "toolCall"])
def test_a_step_cancellation_in_waiting_approval_abandons_the_effect(scope: str) -> None:
    obj, settings = reach(S.WAITING_APPROVAL)
    obj = cancel(obj, {"c-1": {"scope": scope}})
    obj, canceled = expect(obj, at(10), E.STEP_CANCELED, S.RESUME_VALIDATION, settings=settings)
    assert canceled.status.approval_request is None
    obj, revalidated = expect(obj, at(11), E.REVALIDATED, S.READY, settings=settings)
    assert checkpoint_of(revalidated).position.step == 1
    obj, done = expect(obj, at(12), E.SUCCEEDED, S.COMPLETED, settings=settings)
    assert checkpoint_of(done).pending_actions == []


def test_a_step_cancellation_in_resume_validation_is_recorded_then_abandons_the_step() -> None:
    obj = walk(new_run(steps=[ask("confirm"), ask("next"), DONE]), S.READY, settings=SETTINGS)
    obj, _ = expect(obj, at(1), E.INPUT_REQUESTED, S.WAITING_INPUT)
    # The answer arrives: leaving the wait advanced the step already. A turn cancellation now
    # names the step the run is about to take.
    obj = patch_spec(obj, answers={"confirm": "yes"})
    obj, _ = expect(obj, at(2), E.INPUT_RECEIVED, S.RESUME_VALIDATION)
    obj = cancel(obj, {"skip-1": {"scope": "turn"}})
    obj, recorded = expect(obj, at(3), E.CANCEL_RECORDED, S.RESUME_VALIDATION)
    assert checkpoint_of(recorded).cancellations[0].step_index == 1
    obj, revalidated = expect(obj, at(4), E.REVALIDATED, S.READY)
    assert checkpoint_of(revalidated).position.step == 2
    obj, _ = expect(obj, at(5), E.SUCCEEDED, S.COMPLETED)


def test_a_tool_call_cancellation_with_nothing_pending_does_not_cancel_a_later_action() -> None:
    """Recorded as "no tool call to cancel" in ready: the effect that the step starts afterwards is
    a new tool call the request never named, so it must not be canceled."""
    obj = walk(new_run(steps=[effect("pay"), DONE]), S.READY, settings=EFFECTS)
    obj = cancel(obj, {"tc-1": {"scope": "toolCall"}})
    obj, recorded = expect(obj, at(1), E.CANCEL_RECORDED, S.READY, settings=EFFECTS)
    assert "no tool call to cancel" in recorded.detail
    obj, intent = expect(obj, at(2), E.EXTERNAL_AWAITED, S.WAITING_EXTERNAL, settings=EFFECTS)
    (spec,) = intent.intents
    need = decide_on(obj, at(3), settings=EFFECTS)
    assert need == NeedActions({action_record_name(spec.idempotency_key): spec}, cancel=False)


def test_a_tool_call_cancellation_with_nothing_pending_in_resume_validation_does_not_skip_the_step() -> None:
    """Recorded as "no tool call to cancel": resume validation must not then abandon the step."""
    obj = walk(new_run(steps=[ask("confirm"), ask("next"), DONE]), S.WAITING_INPUT, settings=SETTINGS)
    obj = patch_spec(obj, answers={"confirm": "yes"})
    obj, _ = expect(obj, at(1), E.INPUT_RECEIVED, S.RESUME_VALIDATION)
    obj = cancel(obj, {"tc-1": {"scope": "toolCall"}})
    obj, recorded = expect(obj, at(2), E.CANCEL_RECORDED, S.RESUME_VALIDATION)
    assert "no tool call to cancel" in recorded.detail
    obj, revalidated = expect(obj, at(3), E.REVALIDATED, S.READY)
    assert checkpoint_of(revalidated).position.step == 1, "the question 'next' is still asked"


def test_a_children_cancellation_with_no_child_running_does_not_cancel_a_later_child() -> None:
    """A children-scope request covers the children running when it is handled, not later ones."""
    obj = walk(new_run(steps=[ask("confirm"), CHILD, DONE]), S.WAITING_INPUT, settings=SETTINGS)
    obj = cancel(obj, {"kids-1": {"scope": "children"}})
    obj, _ = expect(obj, at(1), E.CANCEL_RECORDED, S.WAITING_INPUT)
    obj = patch_spec(obj, answers={"confirm": "yes"})
    obj = walk(obj, S.WAITING_EXTERNAL, settings=SETTINGS, now=at(2))
    need = decide_on(obj, at(3))
    assert isinstance(need, NeedChildren), need
    assert need.cancel is None, "a child started after the request was handled is not canceled"


# --- 5. retry windows -------------------------------------------------------------------------


def test_a_failed_read_is_retried_in_a_window_until_attempts_are_exhausted() -> None:
    policy = RETRY_3.policy
    assert policy is not None
    obj = walk(new_run(steps=[READ, DONE]), S.READY, settings=RETRY_3)
    now = at(1)
    bounds = {1: (1.6, 2.0), 2: (3.2, 4.0)}  # initialBackoff 2s, doubling, jitter 0.2 (down only)
    for attempt in (1, 2):
        need = decide_on(obj, now, settings=RETRY_3)
        assert isinstance(need, NeedRead), need
        assert need.step_index == 0
        obj, scheduled = expect(
            obj, now, E.RETRY_SCHEDULED, S.WAITING_RETRY, settings=RETRY_3, read=failed_read()
        )
        cp = checkpoint_of(scheduled)
        assert cp.retry.attempts == attempt
        retry_at = cp.retry.retry_at
        assert retry_at is not None
        assert retry_at == now + retry_backoff(policy.retry, attempt, UID)
        low, high = bounds[attempt]
        assert now + timedelta(seconds=low) <= retry_at <= now + timedelta(seconds=high)
        assert scheduled.status.retry_at == retry_at
        assert scheduled.status.waiting_for == f"retry:{retry_at.isoformat()}"
        assert cp.retry.last_failure == f"NotFound: {NOT_FOUND}"
        assert cp.position.step == 0
        assert (cp.evidence, cp.tool_calls) == ([], [])

        # Before the window ends: idle until retryAt.
        assert decide_on(obj, retry_at - timedelta(microseconds=1), settings=RETRY_3) == Idle(
            wake_at=retry_at, reason="retry window"
        )
        obj, due = expect(obj, retry_at, E.RETRY_DUE, S.RESUME_VALIDATION, settings=RETRY_3)
        assert checkpoint_of(due).retry.retry_at is None
        assert checkpoint_of(due).retry.attempts == attempt
        assert due.status.retry_at is None
        obj, _ = expect(obj, retry_at, E.REVALIDATED, S.READY, settings=RETRY_3)
        now = retry_at + timedelta(seconds=1)

    assert isinstance(decide_on(obj, now, settings=RETRY_3), NeedRead)
    obj, failed = expect(obj, now, E.ATTEMPT_FAILED, S.FAILED, settings=RETRY_3, read=failed_read())
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "RetriesExhausted"
    assert failed.status.outcome.message == f"3 attempts failed; last: NotFound: {NOT_FOUND}"
    assert failed.status.retry_at is None
    assert decide_on(obj, now + timedelta(hours=1), settings=RETRY_3) == Idle(reason="run is failed")


def test_a_read_that_succeeds_on_retry_records_its_attempt() -> None:
    obj = walk(new_run(steps=[READ, DONE]), S.WAITING_RETRY, settings=RETRY_3)
    retry_at = cp_of(obj).retry.retry_at
    assert retry_at is not None
    obj, _ = expect(obj, retry_at, E.RETRY_DUE, S.RESUME_VALIDATION, settings=RETRY_3)
    obj, _ = expect(obj, retry_at, E.REVALIDATED, S.READY, settings=RETRY_3)
    read = ReadResult(0, evidence_for(0, "read-settings"))
    obj, completed = expect(obj, retry_at, E.STEP_COMPLETED, S.READY, settings=RETRY_3, read=read)
    (call,) = checkpoint_of(completed).tool_calls
    assert (call.outcome, call.attempt) == ("succeeded", 1)
    obj, _ = expect(obj, retry_at, E.SUCCEEDED, S.COMPLETED, settings=RETRY_3)


def test_each_step_gets_its_own_attempts() -> None:
    """maxAttempts bounds the attempts of one step: a failure of an earlier step that was retried
    successfully does not use up the retries of a later one (RETRY_DUE says "attempt N of step K")."""
    settings = settings_with(retry={"maxAttempts": 2, "initialBackoff": "1s"})
    second = {**READ, "name": "read-other"}
    obj = walk(new_run(steps=[READ, second, DONE]), S.WAITING_RETRY, settings=settings)
    retry_at = cp_of(obj).retry.retry_at
    assert retry_at is not None
    obj, _ = expect(obj, retry_at, E.RETRY_DUE, S.RESUME_VALIDATION, settings=settings)
    obj, _ = expect(obj, retry_at, E.REVALIDATED, S.READY, settings=settings)
    read = ReadResult(0, evidence_for(0, "read-settings"))
    obj, _ = expect(obj, retry_at, E.STEP_COMPLETED, S.READY, settings=settings, read=read)
    # The second read fails for the first time: it is retried, not failed as exhausted.
    obj, scheduled = advance(obj, retry_at, settings=settings, read=failed_read(1))
    assert (scheduled.event, scheduled.state) == (E.RETRY_SCHEDULED, S.WAITING_RETRY), (
        scheduled.status.outcome
    )


@pytest.mark.parametrize("settings", [Settings(), settings_with()], ids=["no-policy", "default-retry"])
def test_without_a_retry_policy_a_failed_read_fails_the_run_with_its_reason(settings: Settings) -> None:
    obj = walk(new_run(steps=[READ, DONE]), S.READY, settings=settings)
    obj, failed = expect(obj, at(1), E.ATTEMPT_FAILED, S.FAILED, settings=settings, read=failed_read())
    assert failed.status.outcome is not None
    assert (failed.status.outcome.reason, failed.status.outcome.message) == ("NotFound", NOT_FOUND)
    assert checkpoint_of(failed).retry.attempts == 0
    assert failed.status.retry_at is None


def test_retry_backoff_doubles_then_caps_without_jitter() -> None:
    policy = RetryPolicy.model_validate({"initialBackoff": "1s", "maxBackoff": "5s", "jitter": 0})
    assert [retry_backoff(policy, n, UID).total_seconds() for n in range(1, 7)] == [1, 2, 4, 5, 5, 5]


def test_retry_backoff_is_deterministic_per_run_and_attempt_and_jitters_down_only() -> None:
    policy = RetryPolicy.model_validate({"initialBackoff": "2s", "maxBackoff": "1m", "jitter": 0.5})
    for attempt in range(1, 12):
        capped = min(2.0 * 2 ** (attempt - 1), 60.0)
        value = retry_backoff(policy, attempt, UID)
        assert value == retry_backoff(policy, attempt, UID), "a recomputation agrees"
        assert capped * 0.5 <= value.total_seconds() <= capped
    others = [retry_backoff(policy, n, "another-run-uid") for n in range(1, 12)]
    assert others != [retry_backoff(policy, n, UID) for n in range(1, 12)], "runs do not retry in lockstep"


# --- 6. an effect that definitely failed: a retry is a new action ----------------------------


def test_a_failed_effect_is_retried_as_a_new_action_with_its_own_key() -> None:
    settings = settings_with(retry={"maxAttempts": 2, "initialBackoff": "1s"})
    obj, first = waiting_on_action(settings, [effect("pay"), DONE])
    assert first.idempotency_key == idempotency_key(UID, 0, "pay") == f"{UID}/0/pay"
    first_name = action_record_name(first.idempotency_key)

    failed = {first_name: ActionObservation(A.FAILED, reason="Upstream500", message="bad gateway")}
    obj, received = expect(
        obj, at(2), E.EXTERNAL_RECEIVED, S.RESUME_VALIDATION, settings=settings, actions=failed
    )
    cp = checkpoint_of(received)
    assert cp.position.step == 0
    assert [(c.outcome, c.attempt) for c in cp.tool_calls] == [("failed", 0)]
    obj, scheduled = expect(obj, at(3), E.RETRY_SCHEDULED, S.WAITING_RETRY, settings=settings)
    retry = checkpoint_of(scheduled).retry
    assert retry.attempts == 1
    assert retry.last_failure is not None
    assert retry.last_failure.startswith("ActionFailed: http.post: Upstream500")
    assert retry.retry_at is not None

    obj, _ = expect(obj, retry.retry_at, E.RETRY_DUE, S.RESUME_VALIDATION, settings=settings)
    obj, _ = expect(obj, retry.retry_at, E.REVALIDATED, S.READY, settings=settings)
    obj, again = expect(obj, retry.retry_at, E.EXTERNAL_AWAITED, S.WAITING_EXTERNAL, settings=settings)
    (second,) = again.intents
    assert second.idempotency_key == f"{UID}/0/pay/attempt-1"
    second_name = action_record_name(second.idempotency_key)
    assert second_name != first_name
    assert [p.action_record_name for p in checkpoint_of(again).pending_actions] == [second_name]
    assert again.status.waiting_for == f"action:{second_name}"
    assert decide_on(obj, at(10), settings=settings) == NeedActions({second_name: second}, cancel=False)

    failed = {second_name: ActionObservation(A.FAILED, reason="Upstream500")}
    obj, _ = expect(obj, at(11), E.EXTERNAL_RECEIVED, S.RESUME_VALIDATION, settings=settings, actions=failed)
    obj, exhausted = expect(obj, at(12), E.ATTEMPT_FAILED, S.FAILED, settings=settings)
    assert exhausted.status.outcome is not None
    assert exhausted.status.outcome.reason == "RetriesExhausted"


def test_a_failed_effect_without_retry_fails_the_run() -> None:
    obj, spec = waiting_on_action(EFFECTS, [effect("pay"), DONE])
    failed = {action_record_name(spec.idempotency_key): ActionObservation(A.FAILED, reason="Upstream500")}
    obj, _ = expect(obj, at(2), E.EXTERNAL_RECEIVED, S.RESUME_VALIDATION, settings=EFFECTS, actions=failed)
    obj, done = expect(obj, at(3), E.ATTEMPT_FAILED, S.FAILED, settings=EFFECTS)
    assert done.status.outcome is not None
    assert done.status.outcome.reason == "ActionFailed"


# --- 7. child runs ----------------------------------------------------------------------------


def waiting_on_child(**spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    obj = new_run(steps=[CHILD, DONE], serviceAccountName="agent-sa", policyRef={"name": "p"}, **spec)
    obj, _ = expect(obj, T0, E.ACCEPTED, S.READY)
    obj, started = expect(obj, at(1), E.EXTERNAL_AWAITED, S.WAITING_EXTERNAL)
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
    running = {"run-1-sub": ChildObservation(S.READY)}
    assert decide_on(obj, at(2), children=running) == Idle(reason="child run in progress")


def test_a_completed_child_advances_the_parent() -> None:
    obj, _ = waiting_on_child()
    done = {"run-1-sub": ChildObservation(S.COMPLETED)}
    obj, received = expect(obj, at(2), E.EXTERNAL_RECEIVED, S.RESUME_VALIDATION, children=done)
    cp = checkpoint_of(received)
    assert cp.position.step == 1
    assert cp.children == [
        ChildRecord(name="run-1-sub", step_index=0, outcome="completed", reason="completed")
    ]
    assert [e.id for e in cp.evidence] == ["child-run-1-sub"]
    obj, _ = expect(obj, at(3), E.REVALIDATED, S.READY)
    obj, _ = expect(obj, at(4), E.SUCCEEDED, S.COMPLETED)


@pytest.mark.parametrize("ended", [S.FAILED, S.CANCELED, S.EXPIRED], ids=str)
def test_a_child_that_did_not_complete_fails_the_parent(ended: RunState) -> None:
    obj, _ = waiting_on_child()
    seen = {"run-1-sub": ChildObservation(ended, reason="SomethingBroke")}
    obj, received = expect(obj, at(2), E.EXTERNAL_RECEIVED, S.RESUME_VALIDATION, children=seen)
    assert checkpoint_of(received).position.step == 0
    obj, failed = expect(obj, at(3), E.ATTEMPT_FAILED, S.FAILED)
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "ChildRunFailed"
    assert "run-1-sub" in failed.status.outcome.message
    assert "SomethingBroke" in failed.status.outcome.message


def test_a_children_cancellation_cancels_the_child_and_the_parent_goes_on() -> None:
    obj, body = waiting_on_child()
    obj = cancel(obj, {"kids-1": {"scope": "children", "reason": "too slow"}})
    obj, recorded = expect(obj, at(2), E.CANCEL_RECORDED, S.WAITING_EXTERNAL)
    assert recorded.status.waiting_for == "child:run-1-sub"
    assert "no tool call to cancel" not in recorded.detail
    need = decide_on(obj, at(3))
    assert isinstance(need, NeedChildren), need
    assert need.records == {"run-1-sub": body}
    assert need.cancel is not None
    assert "kids-1" in need.cancel

    canceled = {"run-1-sub": ChildObservation(S.CANCELED, reason="Canceled")}
    obj, received = expect(obj, at(4), E.EXTERNAL_RECEIVED, S.RESUME_VALIDATION, children=canceled)
    assert checkpoint_of(received).position.step == 1, "a child canceled on request is not a failure"
    obj, _ = expect(obj, at(5), E.REVALIDATED, S.READY)
    obj, _ = expect(obj, at(6), E.SUCCEEDED, S.COMPLETED)


def test_a_task_cancellation_cancels_running_children_before_finishing() -> None:
    obj, _ = waiting_on_child()
    obj = cancel(obj, {"stop-1": {"reason": "abort"}})
    obj, _ = expect(obj, at(2), E.CANCEL_REQUESTED, S.CANCEL_REQUESTED)
    need = decide_on(obj, at(3))
    assert isinstance(need, NeedChildren), need
    assert need.records == {"run-1-sub": None}, "a missing child is not created while canceling"
    assert need.cancel is not None
    assert "stop-1" in need.cancel
    still = {"run-1-sub": ChildObservation(S.CANCEL_REQUESTED)}
    assert isinstance(decide_on(obj, at(4), children=still), Idle)
    gone = {"run-1-sub": ChildObservation(S.CANCELED)}
    obj, finished = expect(obj, at(5), E.CANCEL_FINISHED, S.CANCELED, children=gone)
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


# --- 8. deployment changes: resume validation under the new operator -------------------------


@pytest.mark.parametrize("recorded", ["0.1.0", None])
def test_a_deployment_change_goes_through_resume_validation(recorded: str | None) -> None:
    old = Settings(operator_version=recorded)
    new = Settings(operator_version="0.2.0")
    obj, accepted = expect(new_run(steps=[ask("confirm"), DONE]), T0, E.ACCEPTED, S.READY, settings=old)
    assert accepted.checkpoint is not None
    assert accepted.checkpoint["runtimeConfig"].get("operator") == recorded

    obj, required = expect(obj, at(1), E.REVALIDATION_REQUIRED, S.RESUME_VALIDATION, settings=new)
    assert f"operator {recorded or 'unrecorded'} -> 0.2.0" in required.detail
    obj, revalidated = expect(obj, at(2), E.REVALIDATED, S.READY, settings=new)
    assert checkpoint_of(revalidated).position.step == 0, "revalidation does not skip the step"
    # Once stamped, the same deployment does not revalidate again: the step proceeds.
    obj, asked = expect(obj, at(3), E.INPUT_REQUESTED, S.WAITING_INPUT, settings=new)
    for commit in (required, revalidated, asked):
        assert commit.checkpoint is not None
        assert commit.checkpoint["runtimeConfig"]["operator"] == "0.2.0"


def test_the_same_or_an_unchecked_operator_version_is_no_deployment_change() -> None:
    v1 = Settings(operator_version="0.1.0")
    obj, _ = expect(new_run(steps=[ask("confirm"), DONE]), T0, E.ACCEPTED, S.READY, settings=v1)
    _, same = expect(obj, at(1), E.INPUT_REQUESTED, S.WAITING_INPUT, settings=v1)
    _, unchecked = expect(obj, at(1), E.INPUT_REQUESTED, S.WAITING_INPUT, settings=Settings())
    assert unchecked.checkpoint is not None
    assert unchecked.checkpoint["runtimeConfig"]["operator"] == "0.1.0", "not stamped when unknown"
    assert same.checkpoint is not None
    assert same.checkpoint["runtimeConfig"]["operator"] == "0.1.0"


# --- 9. runtime configuration no longer available ---------------------------------------------

AGENT = {"model": "m1", "prompt": "p1", "toolSet": "ts1"}


@pytest.mark.parametrize(
    ("runtime", "what"),
    [
        ({"models": ["m2"]}, "model 'm1'"),
        ({"prompts": ["p2"]}, "prompt 'p1'"),
        ({"toolSets": ["ts2"]}, "tool set 'ts1'"),
    ],
    ids=["model", "prompt", "tool-set"],
)
def test_an_unavailable_runtime_config_fails_at_resume_validation(runtime: dict[str, Any], what: str) -> None:
    obj, _ = expect(new_run(agent=AGENT, steps=[ask("confirm"), DONE]), T0, E.ACCEPTED, S.READY)
    settings = settings_with(operator_version="0.2.0", runtime={**runtime, "onUnavailable": "fail"})
    obj, _ = expect(obj, at(1), E.REVALIDATION_REQUIRED, S.RESUME_VALIDATION, settings=settings)
    obj, failed = expect(obj, at(2), E.ATTEMPT_FAILED, S.FAILED, settings=settings)
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "RuntimeConfigUnavailable"
    assert what in failed.status.outcome.message


def test_an_unavailable_runtime_config_continues_when_the_policy_says_so() -> None:
    obj, _ = expect(new_run(agent=AGENT, steps=[ask("confirm"), DONE]), T0, E.ACCEPTED, S.READY)
    settings = settings_with(
        operator_version="0.2.0", runtime={"models": ["m2"], "onUnavailable": "continue"}
    )
    obj, _ = expect(obj, at(1), E.REVALIDATION_REQUIRED, S.RESUME_VALIDATION, settings=settings)
    obj, revalidated = expect(obj, at(2), E.REVALIDATED, S.READY, settings=settings)
    assert "model 'm1' unavailable, continuing per policy" in revalidated.detail
    obj, _ = expect(obj, at(3), E.INPUT_REQUESTED, S.WAITING_INPUT, settings=settings)


def test_a_listed_runtime_config_revalidates() -> None:
    obj, _ = expect(new_run(agent=AGENT, steps=[ask("confirm"), DONE]), T0, E.ACCEPTED, S.READY)
    settings = settings_with(operator_version="0.2.0", runtime={"models": ["m2", "m1"], "prompts": ["p1"]})
    obj, _ = expect(obj, at(1), E.REVALIDATION_REQUIRED, S.RESUME_VALIDATION, settings=settings)
    obj, revalidated = expect(obj, at(2), E.REVALIDATED, S.READY, settings=settings)
    assert "unavailable" not in revalidated.detail


# --- 10. quarantine controls: retry after an upgrade, or cancel -------------------------------


def as_v1(raw: dict[str, Any], attempt: int = 0) -> dict[str, Any]:
    """The same checkpoint as schema version 1 wrote it (no retry, children, cancellations)."""
    doc = copy.deepcopy(raw)
    for key in ("retry", "children", "cancellations"):
        doc.pop(key, None)
    doc["runtimeConfig"].pop("operator", None)
    for call in doc.get("toolCalls", []):
        call.pop("attempt", None)
    doc["attempt"] = attempt
    doc["schemaVersion"] = 1
    return doc


def quarantined(**spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run quarantined on an unknown schema version, and the run's last readable checkpoint."""
    obj = walk(new_run(steps=[ask("confirm"), DONE], **spec), S.READY, settings=SETTINGS)
    readable = copy.deepcopy(obj["status"]["checkpoint"])
    obj["status"]["checkpoint"] = copy.deepcopy(FUTURE_CHECKPOINT)
    obj, commit = advance_untouched(obj, at(1))
    assert (commit.event, commit.state) == (E.QUARANTINE, S.QUARANTINED)
    return obj, readable


def advance_untouched(obj: dict[str, Any], now: datetime) -> tuple[dict[str, Any], Commit]:
    """A commit that must leave the stored checkpoint byte for byte as it is."""
    stored = json.dumps(obj["status"]["checkpoint"])
    commit = commit_of(decide_on(obj, now))
    assert json.dumps(commit.checkpoint) == stored
    assert commit.status.state_version == obj["status"]["stateVersion"] + 1
    return apply(obj, commit), commit


def test_a_quarantined_run_stays_idle_without_a_control() -> None:
    obj, _ = quarantined()
    assert decide_on(obj, at(2)) == Idle(reason=QUARANTINE_IDLE)


def test_retry_quarantine_with_a_still_unreadable_checkpoint_stays_idle() -> None:
    obj, _ = quarantined()
    obj = patch_spec(obj, retryQuarantine="t1")
    idle = decide_on(obj, at(2))
    assert isinstance(idle, Idle), idle
    assert idle.wake_at is None
    assert idle.reason.startswith("quarantined: still unreadable")


def test_retry_quarantine_releases_a_readable_checkpoint_migrating_it() -> None:
    obj, readable = quarantined()
    obj["status"]["checkpoint"] = as_v1(readable, attempt=2)  # readable by this deployment now
    obj = patch_spec(obj, retryQuarantine="t1")
    obj, released = expect(obj, at(2), E.RELEASE_QUARANTINE, S.RESUME_VALIDATION)
    assert released.migrated_from == 1
    assert released.status.quarantine_retried == "t1"
    assert released.checkpoint is not None
    assert released.checkpoint["schemaVersion"] == 2
    assert "attempt" not in released.checkpoint
    assert checkpoint_of(released).retry.attempts == 2
    assert "t1" in released.detail
    assert "migrated from schemaVersion 1" in released.detail
    # From here the run goes on as usual.
    obj, _ = expect(obj, at(3), E.REVALIDATED, S.READY)
    obj, _ = expect(obj, at(4), E.INPUT_REQUESTED, S.WAITING_INPUT)


def test_a_retry_token_acts_once() -> None:
    obj, readable = quarantined()
    obj["status"]["checkpoint"] = as_v1(readable)
    obj["status"]["quarantineRetried"] = "t1"
    obj = patch_spec(obj, retryQuarantine="t1")
    assert decide_on(obj, at(2)) == Idle(reason=QUARANTINE_IDLE)
    obj = patch_spec(obj, retryQuarantine="t2")
    assert commit_of(decide_on(obj, at(3))).event is E.RELEASE_QUARANTINE


@pytest.mark.parametrize("retry_token", [None, "t1"])
def test_a_cancellation_of_a_quarantined_run_leaves_the_checkpoint_untouched(retry_token: str | None) -> None:
    obj, _ = quarantined()
    if retry_token is not None:
        obj = patch_spec(obj, retryQuarantine=retry_token)  # cancel wins over retry
    obj = cancel(obj, {"stop-1": {"reason": "give up", "requestedAt": iso(at(1))}})
    obj, requested = advance_untouched(obj, at(2))
    assert (requested.event, requested.state) == (E.CANCEL_REQUESTED, S.CANCEL_REQUESTED)
    cancellation = requested.status.cancellation
    assert cancellation is not None
    assert (cancellation.request_id, cancellation.scope, cancellation.reason) == (
        "stop-1",
        CancelScope.TASK,
        "give up",
    )
    assert requested.status.history[-1].from_state is S.QUARANTINED

    obj, finished = advance_untouched(obj, at(3))
    assert (finished.event, finished.state) == (E.CANCEL_FINISHED, S.CANCELED)
    assert finished.status.outcome is not None
    assert finished.status.outcome.reason == "Canceled"
    assert "unreadable checkpoint" in finished.status.outcome.message
    assert finished.status.cancellation == cancellation
    assert obj["status"]["checkpoint"] == FUTURE_CHECKPOINT
    assert decide_on(obj, at(4)) == Idle(reason="run is canceled")


def test_a_step_cancellation_handled_before_quarantine_does_not_cancel_the_quarantined_run() -> None:
    """Quarantine controls are a task cancellation or a retry token: an old turn-scope request,
    already acted on while the checkpoint was readable, must not end the run."""
    obj = walk(new_run(steps=[ask("first"), ask("second"), DONE]), S.WAITING_INPUT, settings=SETTINGS)
    obj = cancel(obj, {"skip-1": {"scope": "turn"}})
    obj, _ = expect(obj, at(1), E.STEP_CANCELED, S.RESUME_VALIDATION)
    obj, _ = expect(obj, at(2), E.REVALIDATED, S.READY)
    obj, _ = expect(obj, at(3), E.INPUT_REQUESTED, S.WAITING_INPUT)
    obj["status"]["checkpoint"] = copy.deepcopy(FUTURE_CHECKPOINT)
    obj, commit = advance_untouched(obj, at(4))
    assert commit.event is E.QUARANTINE
    assert decide_on(obj, at(5)) == Idle(reason=QUARANTINE_IDLE)


def _released_from(obj: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Quarantine ``obj`` as a v1-only operator would (checkpoint untouched), then retry it here."""
    readable = copy.deepcopy(obj["status"]["checkpoint"])
    obj["status"]["checkpoint"] = copy.deepcopy(FUTURE_CHECKPOINT)
    obj, _ = advance_untouched(obj, at(5))
    obj["status"]["checkpoint"] = readable
    obj = patch_spec(obj, retryQuarantine="after-upgrade")
    obj, _ = expect(obj, at(6), E.RELEASE_QUARANTINE, S.RESUME_VALIDATION, settings=settings)
    return obj


def test_a_run_released_mid_action_goes_back_to_waiting_on_that_action() -> None:
    settings = settings_with(tier=ActionTier.REVERSIBLE)
    obj, spec = waiting_on_action(settings, [effect("pay"), DONE])
    obj = _released_from(obj, settings)
    obj, back = expect(obj, at(7), E.EXTERNAL_AWAITED, S.WAITING_EXTERNAL, settings=settings)
    assert back.intents == (), "no second intent for the same step"
    assert back.status.waiting_for == f"action:{action_record_name(spec.idempotency_key)}"
    assert [p.idempotency_key for p in checkpoint_of(back).pending_actions] == [spec.idempotency_key]
    need = decide_on(obj, at(8), settings=settings)
    assert isinstance(need, NeedActions)


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (S.WAITING_INPUT, E.INPUT_REQUESTED),
        (S.WAITING_EXTERNAL, E.EXTERNAL_AWAITED),
        (S.WAITING_RETRY, E.RETRY_SCHEDULED),
    ],
)
def test_a_run_released_mid_wait_goes_back_to_that_wait(state: RunState, event: RunEvent) -> None:
    obj, settings = reach(state)
    before = checkpoint_of(obj["status"]["checkpoint"])
    obj = _released_from(obj, settings)
    obj, back = expect(obj, at(7), event, state, settings=settings)
    after = checkpoint_of(back)
    assert (after.pending_input, after.pending_external, after.retry.retry_at) == (
        before.pending_input,
        before.pending_external,
        before.retry.retry_at,
    ), "the wait is the one recorded, expiry and all"


# --- 10. restore from a backup: the run keeps its identity ------------------------------------


def test_the_first_commit_records_the_run_id_and_every_commit_keeps_it() -> None:
    obj, accepted = expect(new_run(steps=[effect("pay"), DONE]), T0, E.ACCEPTED, S.READY, settings=EFFECTS)
    assert accepted.status.run_id == UID
    obj, intent = expect(obj, at(1), E.EXTERNAL_AWAITED, S.WAITING_EXTERNAL, settings=EFFECTS)
    assert intent.status.run_id == UID


def test_a_run_restored_from_a_backup_keeps_its_idempotency_keys() -> None:
    """A restore re-creates the AgentRun with its status, but the API server gives it a new uid.
    Keys derive from the recorded run ID, so the authoritative system recognises the effect the
    run applied after the backup was taken, instead of being asked to pay again under a new key."""
    original, _ = expect(new_run(steps=[ask("confirm"), effect("pay"), DONE]), T0, E.ACCEPTED, S.READY)
    original, _ = expect(original, at(1), E.INPUT_REQUESTED, S.WAITING_INPUT)
    backup = copy.deepcopy(original)
    original["spec"]["answers"] = {"confirm": "yes"}
    original, _ = expect(original, at(2), E.INPUT_RECEIVED, S.RESUME_VALIDATION)
    original, _ = expect(original, at(3), E.REVALIDATED, S.READY)
    original, paid = expect(original, at(4), E.EXTERNAL_AWAITED, S.WAITING_EXTERNAL, settings=EFFECTS)
    (before_disaster,) = paid.intents

    restored = copy.deepcopy(backup)
    restored["metadata"]["uid"] = "3f0c2a4e-0000-4000-8000-restored0001"
    restored["spec"]["answers"] = {"confirm": "yes"}
    restored, _ = expect(restored, at(20), E.INPUT_RECEIVED, S.RESUME_VALIDATION)
    restored, _ = expect(restored, at(21), E.REVALIDATED, S.READY)
    restored, again = expect(restored, at(22), E.EXTERNAL_AWAITED, S.WAITING_EXTERNAL, settings=EFFECTS)
    (after_restore,) = again.intents
    assert after_restore.idempotency_key == before_disaster.idempotency_key == idempotency_key(UID, 1, "pay")
    assert again.status.run_id == UID
    assert after_restore.run_ref.uid == restored["metadata"]["uid"], "ownership follows the live object"


# --- 11. sealed values: a checkpoint this operator cannot unseal is quarantined ---------------


KEYRING = Keyring(keys={"k2030": bytes(range(32))}, active_key_id="k2030")
RETIRED = Keyring(keys={"k2025": bytes(range(1, 33))}, active_key_id="k2025")


def waiting_with_a_sealed_value(sealed_by: Keyring, run_id: str = UID) -> dict[str, Any]:
    """A run in waiting_input whose checkpoint carries one sealed value (sealed by ``sealed_by``)."""
    keyed = Settings(keyring=KEYRING)
    obj, _ = expect(new_run(steps=[ask("confirm"), DONE]), T0, E.ACCEPTED, S.READY, settings=keyed)
    obj, _ = expect(obj, at(1), E.INPUT_REQUESTED, S.WAITING_INPUT, settings=keyed)
    cp = seal_field(
        checkpoint_of(obj["status"]["checkpoint"]), "apiToken", b"s3cret", keyring=sealed_by, run_uid=run_id
    )
    obj["status"]["checkpoint"] = dump_checkpoint(cp)
    obj["spec"]["answers"] = {"confirm": "yes"}
    return obj


def quarantine(obj: dict[str, Any], now: datetime, *, settings: Settings) -> tuple[dict[str, Any], Commit]:
    """Decide, expect the quarantine commit (the checkpoint kept as stored), and store it."""
    commit = commit_of(decide_on(obj, now, settings=settings))
    assert (commit.event, commit.status.state) == (E.QUARANTINE, S.QUARANTINED), commit.detail
    return apply(obj, commit), commit


def test_a_sealed_value_this_keyring_unseals_lets_the_run_go_on() -> None:
    obj = waiting_with_a_sealed_value(KEYRING)
    obj, received = expect(
        obj, at(2), E.INPUT_RECEIVED, S.RESUME_VALIDATION, settings=Settings(keyring=KEYRING)
    )
    assert checkpoint_of(received).sealed == checkpoint_of(obj["status"]["checkpoint"]).sealed


@pytest.mark.parametrize(
    ("keyring", "message"),
    [(KEYRING, "'k2025' is not in the keyring"), (None, "no sealing keyring")],
    ids=["key-retired", "no-keyring"],
)
def test_a_sealed_value_that_cannot_be_unsealed_quarantines_untouched(
    keyring: Keyring | None, message: str
) -> None:
    obj = waiting_with_a_sealed_value(RETIRED)
    stored = copy.deepcopy(obj["status"]["checkpoint"])
    obj, commit = quarantine(obj, at(2), settings=Settings(keyring=keyring))
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "Undecryptable"
    assert "apiToken" in commit.status.outcome.message
    assert message in commit.status.outcome.message
    assert obj["status"]["checkpoint"] == stored, "the checkpoint is kept exactly as stored"


def test_a_tampered_sealed_value_quarantines() -> None:
    obj = waiting_with_a_sealed_value(KEYRING)
    sealed = obj["status"]["checkpoint"]["sealed"]["apiToken"]
    flipped = bytearray(base64.b64decode(sealed["ciphertext"]))
    flipped[0] ^= 1
    sealed["ciphertext"] = base64.b64encode(bytes(flipped)).decode()
    _, commit = quarantine(obj, at(2), settings=Settings(keyring=KEYRING))
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "Undecryptable"


def test_an_undecryptable_run_is_released_once_its_key_is_back() -> None:
    obj = waiting_with_a_sealed_value(RETIRED)
    obj, _ = quarantine(obj, at(2), settings=Settings(keyring=KEYRING))
    obj["spec"]["retryQuarantine"] = "key-restored"
    still = decide_on(obj, at(3), settings=Settings(keyring=KEYRING))
    assert isinstance(still, Idle)
    assert "still unreadable" in still.reason
    both = Keyring(keys={**KEYRING.keys, **RETIRED.keys}, active_key_id="k2030")
    obj, released = expect(
        obj, at(4), E.RELEASE_QUARANTINE, S.RESUME_VALIDATION, settings=Settings(keyring=both)
    )
    assert released.status.quarantine_retried == "key-restored"


def test_sealed_values_stay_bound_to_the_run_id_across_a_restore() -> None:
    """Sealed values are bound to the run (associated data): to its recorded run ID, so a run
    restored from a backup (a new uid) still unseals its own values, and another run cannot."""
    obj = waiting_with_a_sealed_value(KEYRING)
    obj["metadata"]["uid"] = "3f0c2a4e-0000-4000-8000-restored0001"
    expect(
        copy.deepcopy(obj), at(2), E.INPUT_RECEIVED, S.RESUME_VALIDATION, settings=Settings(keyring=KEYRING)
    )
    obj["status"]["runId"] = "another-run"
    quarantine(obj, at(2), settings=Settings(keyring=KEYRING))
