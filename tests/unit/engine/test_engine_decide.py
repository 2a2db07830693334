"""decide(): a whole run commit by commit, the deadline, terminal runs, and any script."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from tests.unit.builders import (
    AGENT,
    EPOCH,
    PLANNER,
    SETTINGS,
    T0,
    apply,
    assert_well_formed,
    at,
    checkpoint_of,
    commit_of,
    condition_view,
    conditions,
    drive,
    evidence_for,
    iso,
    new_run,
    patch_spec,
    run_in,
    snap,
    step,
)

from durable_agents.api.v1alpha1 import AgentRunStatus, ConditionStatus, ObjectReference
from durable_agents.api.v1alpha1.states import NON_TERMINAL_STATES, TERMINAL_STATES, RunState
from durable_agents.core.checkpoint import (
    CURRENT_SCHEMA_VERSION,
    ExternalEvidenceRef,
    Fencing,
    PendingExternal,
    PendingInput,
    PolicyRef,
    Position,
    RuntimeConfig,
    ToolCallRecord,
)
from durable_agents.core.digest import canonical_digest
from durable_agents.core.engine import Commit, Idle, NeedRead, Observations, ReadResult, decide
from durable_agents.core.statemachine import TRANSITIONS, RunEvent
from durable_agents_testkit.runs import EXPECTED_EVENTS, assert_history_is_gapless, read_ask_await_complete

pytestmark = pytest.mark.unit


# --- the whole run, commit by commit -------------------------------------------------------------

ANSWER = "yes - ship it on Tuesday after the freeze"

EVENT_PAYLOAD = "change window CHG-991 opened by the release manager"


def test_read_ask_await_complete_walk() -> None:
    times = [at(60 * k) for k in range(13)]
    obj = new_run(**read_ask_await_complete("settings", expires="1h"), agent=AGENT)
    commits: list[Commit] = []

    def commit_at(now: datetime, read: ReadResult | None = None) -> Commit:
        nonlocal obj
        commit = commit_of(step(obj, now, read=read))
        # Deciding is deterministic: the same inputs give the same commit.
        assert step(obj, now, read=read) == commit
        assert_well_formed(obj, commit)
        assert commit.status.observed_generation == obj["metadata"]["generation"]
        commits.append(commit)
        obj = apply(obj, commit)
        return commit

    # pending -> ready: the initial checkpoint records the runtime configuration and the policy.
    accepted = commit_at(times[0])
    assert (accepted.event, accepted.state, accepted.status.state_version) == (
        RunEvent.ACCEPTED,
        RunState.READY,
        1,
    )
    cp = checkpoint_of(accepted)
    assert accepted.checkpoint is not None
    assert accepted.checkpoint["schemaVersion"] == CURRENT_SCHEMA_VERSION
    assert accepted.checkpoint["runtimeConfig"] == AGENT
    assert cp.position == Position(state="ready", step=0, state_version=1)
    assert cp.runtime_config == RuntimeConfig(
        model="model-2030-01", prompt="prompt-v3", tool_set="read-only-v1"
    )
    assert cp.policy == PolicyRef(name="default-policy", version="v7")
    assert (cp.timestamps.created_at, cp.timestamps.updated_at, cp.timestamps.entered_state_at) == (
        times[0],
        times[0],
        times[0],
    )
    assert (cp.evidence, cp.tool_calls, cp.input_refs) == ([], [], [])
    assert cp.pending_input is None
    assert cp.pending_external is None
    assert accepted.status.state_since == times[0]
    assert accepted.status.waiting_for is None
    assert accepted.status.outcome is None
    assert condition_view(accepted.status) == {
        "Waiting": ("False", "Ready"),
        "Succeeded": ("Unknown", "Ready"),
        "Finished": ("False", "Ready"),
        "Quarantined": ("False", "Ready"),
        # kstatus: a run that works reads InProgress (core/health.py)
        "Reconciling": ("True", "Ready"),
        "Ready": ("False", "Ready"),
        "Stalled": ("False", "Ready"),
    }
    assert all(c.last_transition_time == times[0] for c in accepted.status.conditions)
    entry = accepted.status.history[0]
    assert (entry.from_state, entry.to_state, entry.event, entry.at, entry.detail) == (
        RunState.PENDING,
        RunState.READY,
        "accepted",
        times[0],
        "spec accepted",
    )

    # The read step: the engine asks for a read, and only consumes the result of THIS step.
    need = step(obj, times[1])
    assert need == NeedRead(
        0, "read-settings", ObjectReference(api_version="v1", kind="ConfigMap", name="settings")
    )
    evidence = evidence_for(0, "read-settings", at_=times[1])
    assert step(obj, times[1], read=ReadResult(5, evidence)) == need
    read = commit_at(times[1], ReadResult(0, evidence))
    assert (read.event, read.state) == (RunEvent.STEP_COMPLETED, RunState.READY)
    assert read.detail == "read ConfigMap/settings@4711"
    cp = checkpoint_of(read)
    assert cp.evidence == [evidence]
    assert cp.tool_calls == [
        ToolCallRecord(
            id="call-0-read-settings",
            tool="kubernetes.read",
            step_index=0,
            started_at=times[1],
            finished_at=times[1],
            outcome="succeeded",
            result_ref=evidence.id,
        )
    ]
    assert cp.position.step == 1
    assert cp.timestamps.updated_at == times[1]
    assert cp.timestamps.entered_state_at == times[0], "the state did not change"
    assert read.status.state_since == times[0]

    # ask -> waiting_input, with the question's expiry and what the run waits for.
    asked = commit_at(times[2])
    assert (asked.event, asked.state) == (RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT)
    cp = checkpoint_of(asked)
    assert cp.pending_input == PendingInput(
        request_id="confirm", question="proceed?", expires_at=times[2] + timedelta(hours=1)
    )
    assert asked.checkpoint is not None
    assert asked.checkpoint["pendingInput"]["expiresAt"] == iso(times[2] + timedelta(hours=1))
    assert cp.position.step == 1, "the step is done only when the answer arrives"
    assert asked.status.waiting_for == "input:confirm"
    assert asked.status.state_since == times[2]
    assert cp.timestamps.entered_state_at == times[2]
    assert len(cp.evidence) == len(cp.tool_calls) == 1, "the read is recorded once"
    waiting = conditions(asked.status)["Waiting"]
    assert (waiting.status, waiting.reason, waiting.message) == (
        ConditionStatus.TRUE,
        "WaitingInput",
        "input:confirm",
    )
    assert waiting.last_transition_time == times[2]
    succeeded = conditions(asked.status)["Succeeded"]
    assert (succeeded.status, succeeded.reason) == (ConditionStatus.UNKNOWN, "WaitingInput")
    assert succeeded.last_transition_time == times[0], "an unchanged condition status keeps its time"

    # Unanswered: nothing to commit, wake at the expiry.
    assert step(obj, times[3]) == Idle(wake_at=times[2] + timedelta(hours=1), reason="waiting")

    # The answer arrives: recorded as a reference with a digest, never as text.
    obj = patch_spec(obj, answers={"confirm": ANSWER})
    received = commit_at(times[4])
    assert (received.event, received.state) == (RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION)
    cp = checkpoint_of(received)
    assert cp.input_refs == [
        ExternalEvidenceRef(
            id="answer-confirm",
            step_index=1,
            recorded_at=times[4],
            uri="agentrun://team-a/run-1/spec.answers/confirm",
            content_digest=canonical_digest(ANSWER),
        )
    ]
    assert cp.pending_input is None
    assert cp.position.step == 2
    assert received.status.waiting_for is None
    assert received.status.observed_generation == 2
    waiting = conditions(received.status)["Waiting"]
    assert (waiting.status, waiting.reason, waiting.last_transition_time) == (
        ConditionStatus.FALSE,
        "ResumeValidation",
        times[4],
    )

    revalidated = commit_at(times[5])
    assert (revalidated.event, revalidated.state) == (RunEvent.REVALIDATED, RunState.READY)

    # await -> waiting_external, in the same way.
    awaited = commit_at(times[6])
    assert (awaited.event, awaited.state) == (RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL)
    cp = checkpoint_of(awaited)
    assert cp.pending_external == PendingExternal(
        request_id="window", event="window-open", expires_at=times[6] + timedelta(hours=1)
    )
    assert awaited.status.waiting_for == "event:window-open"
    assert condition_view(awaited.status)["Waiting"] == ("True", "WaitingExternal")
    assert step(obj, times[7]) == Idle(wake_at=times[6] + timedelta(hours=1), reason="waiting")

    obj = patch_spec(obj, events={"window-open": EVENT_PAYLOAD})
    delivered = commit_at(times[8])
    assert (delivered.event, delivered.state) == (RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION)
    cp = checkpoint_of(delivered)
    assert [r.id for r in cp.input_refs] == ["answer-confirm", "event-window"]
    event_ref = cp.input_refs[1]
    assert isinstance(event_ref, ExternalEvidenceRef)
    assert event_ref.uri == "agentrun://team-a/run-1/spec.events/window-open"
    assert event_ref.content_digest == canonical_digest(EVENT_PAYLOAD)
    assert (event_ref.step_index, cp.position.step, cp.pending_external) == (2, 3, None)

    assert commit_at(times[9]).event is RunEvent.REVALIDATED

    # complete -> completed, with the result.
    done = commit_at(times[10])
    assert (done.event, done.state) == (RunEvent.SUCCEEDED, RunState.COMPLETED)
    assert done.status.outcome is not None
    assert (done.status.outcome.reason, done.status.outcome.message, done.status.outcome.result) == (
        "Completed",
        "finished at step done",
        "ok",
    )
    assert checkpoint_of(done).position.step == 4
    assert condition_view(done.status) == {
        "Waiting": ("False", "Completed"),
        "Succeeded": ("True", "Completed"),
        "Finished": ("True", "Completed"),
        "Quarantined": ("False", "Completed"),
        "Reconciling": ("False", "Completed"),
        "Ready": ("True", "Completed"),
        "Stalled": ("False", "Completed"),
    }
    final = conditions(done.status)
    assert final["Succeeded"].last_transition_time == final["Finished"].last_transition_time == times[10]
    assert final["Waiting"].last_transition_time == times[8]
    assert final["Quarantined"].last_transition_time == times[0]

    # Terminal: nothing more to do, no wake-up.
    assert step(obj, times[11]) == Idle(wake_at=None, reason="run is completed")

    # The whole record: the event sequence the e2e test expects, versions 1..n without gaps.
    history = assert_history_is_gapless(obj)
    assert [h["event"] for h in history] == EXPECTED_EVENTS
    assert [c.event.value for c in commits] == EXPECTED_EVENTS
    assert [h["stateVersion"] for h in history] == list(range(1, len(EXPECTED_EVENTS) + 1))
    assert all((h["holder"], h["epoch"]) == ("worker-a", 3) for h in history)
    for earlier, later in itertools.pairwise(history):
        assert later["from"] == earlier["to"]
    assert [h["from"] for h in history] == [
        "pending",
        "ready",
        "ready",
        "waiting_input",
        "resume_validation",
        "ready",
        "waiting_external",
        "resume_validation",
        "ready",
    ]
    wire = json.dumps(obj["status"])
    assert ANSWER not in wire
    assert EVENT_PAYLOAD not in wire
    # The committed status is what the API server's schema for it accepts.
    assert AgentRunStatus.model_validate(obj["status"]).state is RunState.COMPLETED


def test_the_walk_completes_without_stopping_when_everything_is_supplied() -> None:
    obj = new_run(**read_ask_await_complete("settings", answered=True))
    obj, commits, idle = drive(obj, T0)
    assert [c.event.value for c in commits] == EXPECTED_EVENTS
    assert idle == Idle(wake_at=None, reason="run is completed")
    assert_history_is_gapless(obj)


# --- the deadline --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state", sorted(NON_TERMINAL_STATES - {RunState.QUARANTINED, RunState.CANCEL_REQUESTED})
)
def test_past_the_deadline_every_live_state_expires(state: RunState) -> None:
    deadline = at(60)
    obj = run_in(
        state,
        deadline=iso(deadline),
        steps=[{"name": "confirm", "ask": {"question": "q"}}],
        answers={"confirm": "an answer does not beat the deadline"},
    )
    for now in (deadline, deadline + timedelta(days=1)):
        commit = commit_of(step(obj, now))
        assert_well_formed(obj, commit)
        assert (commit.event, commit.state) == (RunEvent.DEADLINE_EXCEEDED, RunState.EXPIRED)
        assert commit.status.outcome is not None
        assert commit.status.outcome.reason == "DeadlineExceeded"
        assert deadline.isoformat() in commit.status.outcome.message
        assert commit.status.history[-1].from_state is state


def test_a_read_step_past_the_deadline_expires_instead_of_reading() -> None:
    deadline = at(60)
    obj = new_run(steps=read_ask_await_complete("settings")["steps"], deadline=iso(deadline))
    obj = apply(obj, commit_of(step(obj, T0)))
    assert isinstance(step(obj, deadline - timedelta(seconds=1)), NeedRead)
    assert commit_of(step(obj, deadline)).event is RunEvent.DEADLINE_EXCEEDED
    read = ReadResult(0, evidence_for(0, "read-settings"))
    assert commit_of(step(obj, deadline, read=read)).event is RunEvent.DEADLINE_EXCEEDED


def test_a_pending_run_past_its_deadline_expires_without_being_accepted() -> None:
    obj = new_run(deadline=iso(T0 - timedelta(hours=1)))
    commit = commit_of(step(obj, T0))
    assert commit.event is RunEvent.DEADLINE_EXCEEDED


def test_a_pending_run_before_its_deadline_is_accepted() -> None:
    obj = new_run(deadline=iso(T0 + timedelta(seconds=1)))
    assert commit_of(step(obj, T0)).event is RunEvent.ACCEPTED


def test_a_cancellation_in_progress_finishes_even_past_the_deadline() -> None:
    obj = run_in(RunState.CANCEL_REQUESTED, deadline=iso(T0))
    commit = commit_of(step(obj, at(60)))
    assert (commit.event, commit.state) == (RunEvent.CANCEL_FINISHED, RunState.CANCELED)


# --- terminal and pending runs -------------------------------------------------------------------


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES))
def test_terminal_runs_are_idle_without_a_wake_up(state: RunState) -> None:
    obj = run_in(
        state,
        deadline=iso(T0),
        steps=read_ask_await_complete("settings")["steps"],
        answers={"confirm": "y"},
    )
    read = ReadResult(0, evidence_for(0, "read-settings"))
    for now in (T0, T0 + timedelta(days=30)):
        assert step(obj, now) == Idle(wake_at=None, reason=f"run is {state.value}")
        assert step(obj, now, read=read) == Idle(wake_at=None, reason=f"run is {state.value}")


def test_a_pending_run_with_a_checkpoint_is_accepted_again() -> None:
    obj = run_in(RunState.PENDING)
    commit = commit_of(step(obj, at(1)))
    assert_well_formed(obj, commit)
    assert (commit.event, commit.state) == (RunEvent.ACCEPTED, RunState.READY)


# --- property: any script, any supplied answers, any clock ---------------------------------------

KINDS = ("read", "ask", "await", "complete")

EVENT_NAMES = ("ev-a", "ev-b", "ev-c")


@st.composite
def scripted_runs(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=8))
    steps: list[dict[str, Any]] = []
    for i, kind in enumerate(kinds):
        name = f"s{i}-{kind}"
        expires = draw(st.sampled_from([None, "30s", "10m", "2h"]))
        extra = {"expiresIn": expires} if expires else {}
        if kind == "read":
            body: dict[str, Any] = {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": f"cm-{i}"}}
        elif kind == "ask":
            body = {"question": f"question {i}?", **extra}
        elif kind == "await":
            body = {"event": draw(st.sampled_from(EVENT_NAMES)), **extra}
        else:
            body = {"result": f"result {i}"}
        steps.append({"name": name, kind: body})
    asks = [s["name"] for s in steps if "ask" in s]
    awaited = sorted({s["await"]["event"] for s in steps if "await" in s})
    all_answers = draw(st.booleans())
    answered = asks if all_answers else draw(st.lists(st.sampled_from(asks), unique=True)) if asks else []
    delivered = (
        awaited if all_answers else draw(st.lists(st.sampled_from(awaited), unique=True)) if awaited else []
    )
    spec: dict[str, Any] = {
        "steps": steps,
        "answers": {name: f"answer for {name}" for name in answered},
        "events": {event: f"payload of {event}" for event in delivered},
    }
    with_deadline = draw(st.integers(0, 2)) == 0
    if with_deadline:
        spec["deadline"] = iso(T0 + timedelta(seconds=draw(st.integers(0, 4 * 3600))))
    complete = all_answers and not with_deadline
    return new_run(**spec), complete


def expected_events(steps: list[dict[str, Any]]) -> list[str]:
    out = ["accepted"]
    for s in steps:
        if "read" in s:
            out.append("step_completed")
        elif "ask" in s:
            out += ["input_requested", "input_received", "revalidated"]
        elif "await" in s:
            out += ["external_awaited", "external_received", "revalidated"]
        else:
            break
    return [*out, "succeeded"]


@hypothesis_settings(max_examples=80, deadline=None)
@given(scripted_runs(), st.data())
def test_any_script_reaches_a_terminal_state_or_idles_with_well_formed_commits(
    run: tuple[dict[str, Any], bool], data: st.DataObject
) -> None:
    obj, fully_supplied = run
    now = T0
    epochs = [EPOCH, Fencing(holder="worker-b", lease_transitions=4)]
    events: list[str] = []
    for _ in range(200):
        now += timedelta(seconds=data.draw(st.integers(0, 900), label="tick"))
        epoch = data.draw(st.sampled_from(epochs), label="epoch")
        decision = decide(snap(obj), now=now, epoch=epoch, planner=PLANNER, settings=SETTINGS)
        if isinstance(decision, NeedRead):
            read = ReadResult(
                decision.step_index, evidence_for(decision.step_index, decision.step_name, at_=now)
            )
            decision = decide(
                snap(obj),
                now=now,
                epoch=epoch,
                planner=PLANNER,
                settings=SETTINGS,
                observed=Observations(read=read),
            )
            assert not isinstance(decision, NeedRead)
        if isinstance(decision, Idle):
            state = RunState(obj["status"]["state"])
            if decision.wake_at is None:
                assert state.terminal or state is RunState.QUARANTINED, state
                break
            assert state.waiting
            assert decision.wake_at > now
            if not data.draw(st.booleans(), label="wake up"):
                break
            # Waking at wake_at always makes progress: the wait expires or the deadline passes.
            now = decision.wake_at
            decision = decide(snap(obj), now=now, epoch=epoch, planner=PLANNER, settings=SETTINGS)
            assert isinstance(decision, Commit)
            assert decision.event in (RunEvent.WAIT_EXPIRED, RunEvent.DEADLINE_EXCEEDED)
        assert isinstance(decision, Commit)
        before = RunState(obj.get("status", {}).get("state", "pending"))
        assert (before, decision.event) in TRANSITIONS
        assert decision.event is not RunEvent.QUARANTINE
        assert_well_formed(obj, decision, epoch)
        events.append(decision.event.value)
        obj = apply(obj, decision)
    else:
        raise AssertionError("the run neither finished nor idled")

    status = obj["status"]
    event(f"final state: {status['state']}, last event: {events[-1]}")
    assert status["stateVersion"] == len(events)
    assert [h["stateVersion"] for h in status["history"]] == list(range(1, len(events) + 1))
    assert [h["event"] for h in status["history"]] == events
    if fully_supplied:
        assert status["state"] == "completed"
        assert events == expected_events(obj["spec"]["steps"])
