"""The run engine, purely: a whole run commit by commit, expiry, deadline, fencing, quarantine.

No cluster: an AgentRun is a plain dict shaped like the API server's answer, and :func:`apply`
stands in for the store (it writes a commit's status and bumps the resourceVersion).
"""

from __future__ import annotations

import copy
import itertools
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from pydantic import ValidationError

from durable_agents.api.v1alpha1 import (
    HISTORY_LIMIT,
    AgentRunStatus,
    Condition,
    ConditionStatus,
    ObjectReference,
    WaitExpiries,
)
from durable_agents.api.v1alpha1.states import NON_TERMINAL_STATES, TERMINAL_STATES, RunState
from durable_agents.core.checkpoint import (
    CURRENT_SCHEMA_VERSION,
    Checkpoint,
    ExternalEvidenceRef,
    Fencing,
    KubernetesEvidenceRef,
    Loaded,
    PendingExternal,
    PendingInput,
    PolicyRef,
    Position,
    RuntimeConfig,
    ToolCallRecord,
    load_checkpoint,
)
from durable_agents.core.digest import canonical_digest
from durable_agents.core.engine import (
    Commit,
    Decision,
    Idle,
    NeedRead,
    ReadResult,
    RunSnapshot,
    Settings,
    decide,
    fence,
)
from durable_agents.core.planner import ScriptedPlanner
from durable_agents.core.statemachine import TRANSITIONS, RunEvent
from durable_agents_testkit.runs import EXPECTED_EVENTS, assert_history_is_gapless, read_ask_await_complete

pytestmark = pytest.mark.unit

S, E = RunState, RunEvent
T, F, U = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
EPOCH = Fencing(holder="worker-a", lease_transitions=3)
PLANNER = ScriptedPlanner()
SETTINGS = Settings(policy_name="default-policy", policy_version="v7")
AGENT = {"model": "model-2030-01", "prompt": "prompt-v3", "toolSet": "read-only-v1"}


# --- helpers ---------------------------------------------------------------------------------


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def new_run(**spec: Any) -> dict[str, Any]:
    """An AgentRun as the API server returns it right after creation (no status yet)."""
    return {
        "apiVersion": "durable-agents.io/v1alpha1",
        "kind": "AgentRun",
        "metadata": {
            "uid": "5f0b6c1e-0000-4000-8000-000000000001",
            "name": "run-1",
            "namespace": "team-a",
            "generation": 1,
            "resourceVersion": "100",
        },
        "spec": {"taskType": "unit", "objective": "exercise the engine", **spec},
    }


def snap(obj: dict[str, Any]) -> RunSnapshot:
    return RunSnapshot.from_object(obj)


def step(
    obj: dict[str, Any],
    now: datetime,
    *,
    epoch: Fencing = EPOCH,
    read: ReadResult | None = None,
    settings: Settings = SETTINGS,
) -> Decision:
    """One call of decide, checking on the way that the record it was given is left untouched."""
    before = copy.deepcopy(obj)
    decision = decide(snap(obj), now=now, epoch=epoch, planner=PLANNER, settings=settings, read=read)
    assert obj == before, "decide must not mutate the record it reads"
    return decision


def commit_of(decision: Decision) -> Commit:
    assert isinstance(decision, Commit), decision
    return decision


def apply(obj: dict[str, Any], commit: Commit) -> dict[str, Any]:
    """What the store does with a commit: one write of the whole status, a new resourceVersion."""
    out = copy.deepcopy(obj)
    out["status"] = copy.deepcopy(commit.wire_status())
    out["metadata"]["resourceVersion"] = str(int(out["metadata"]["resourceVersion"]) + 1)
    return out


def apply_status(obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["status"] = copy.deepcopy(status)
    out["metadata"]["resourceVersion"] = str(int(out["metadata"]["resourceVersion"]) + 1)
    return out


def patch_spec(obj: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A user's patch of the spec: the API server bumps generation and resourceVersion."""
    out = copy.deepcopy(obj)
    out["spec"].update(fields)
    out["metadata"]["generation"] += 1
    out["metadata"]["resourceVersion"] = str(int(out["metadata"]["resourceVersion"]) + 1)
    return out


def evidence_for(index: int, name: str, *, at_: datetime = T0, rv: str = "4711") -> KubernetesEvidenceRef:
    return KubernetesEvidenceRef(
        id=f"evidence-{index}-{name}",
        step_index=index,
        recorded_at=at_,
        api_version="v1",
        kind="ConfigMap",
        namespace="team-a",
        name="settings",
        uid="cm-uid-1",
        resource_version=rv,
        content_digest=canonical_digest({"data": {"index": index}}),
    )


def checkpoint_of(source: Commit | dict[str, Any] | None) -> Checkpoint:
    raw = source.checkpoint if isinstance(source, Commit) else source
    result = load_checkpoint(raw)
    assert isinstance(result, Loaded), result
    return result.checkpoint


def conditions(status: AgentRunStatus) -> dict[str, Condition]:
    return {c.type: c for c in status.conditions}


def condition_view(status: AgentRunStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status.value, c.reason) for c in status.conditions}


def drive(
    obj: dict[str, Any],
    now: datetime,
    *,
    epoch: Fencing = EPOCH,
    settings: Settings = SETTINGS,
    limit: int = 400,
) -> tuple[dict[str, Any], list[Commit], Idle]:
    """Decide and apply until the engine is idle; reads succeed. Returns the record, commits, idle."""
    commits: list[Commit] = []
    for _ in range(limit):
        decision = step(obj, now, epoch=epoch, settings=settings)
        if isinstance(decision, NeedRead):
            read = ReadResult(decision.step_index, evidence_for(decision.step_index, decision.step_name))
            decision = step(obj, now, epoch=epoch, settings=settings, read=read)
            assert not isinstance(decision, NeedRead), "a read result for the step must be consumed"
        if isinstance(decision, Idle):
            return obj, commits, decision
        commit = commit_of(decision)
        commits.append(commit)
        obj = apply(obj, commit)
    raise AssertionError(f"no idle after {limit} decisions")


QUARANTINE_IDLE = "quarantined: retry (spec.retryQuarantine) or cancel"


def run_in(state: RunState, **spec: Any) -> dict[str, Any]:
    """An accepted run whose record has been moved to ``state`` (the engine trusts status.state)."""
    obj = apply(new_run(**spec), commit_of(step(new_run(**spec), T0)))
    obj["status"]["state"] = state.value
    obj["status"]["checkpoint"]["position"]["state"] = state.value
    return obj


def assert_well_formed(before: dict[str, Any], commit: Commit, epoch: Fencing = EPOCH) -> None:
    """What every non-quarantine commit guarantees: one table row, version + 1, fencing stamped."""
    old = AgentRunStatus.model_validate({k: v for k, v in (before.get("status") or {}).items()})
    assert TRANSITIONS[(old.state, commit.event)] is commit.state
    assert commit.status.state_version == old.state_version + 1
    cp = checkpoint_of(commit)
    assert cp.position.state_version == commit.status.state_version
    assert cp.position.state == commit.state.value
    assert cp.fencing == epoch
    last = commit.status.history[-1]
    assert (last.from_state, last.to_state, last.event) == (old.state, commit.state, commit.event.value)
    assert (last.holder, last.epoch, last.state_version) == (
        epoch.holder,
        epoch.lease_transitions,
        commit.status.state_version,
    )


# --- the whole run, commit by commit ---------------------------------------------------------

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
    assert (accepted.event, accepted.state, accepted.status.state_version) == (E.ACCEPTED, S.READY, 1)
    cp = checkpoint_of(accepted)
    assert accepted.checkpoint is not None
    assert accepted.checkpoint["schemaVersion"] == CURRENT_SCHEMA_VERSION == 2
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
    }
    assert all(c.last_transition_time == times[0] for c in accepted.status.conditions)
    entry = accepted.status.history[0]
    assert (entry.from_state, entry.to_state, entry.event, entry.at, entry.detail) == (
        S.PENDING,
        S.READY,
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
    assert (read.event, read.state) == (E.STEP_COMPLETED, S.READY)
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
    assert (asked.event, asked.state) == (E.INPUT_REQUESTED, S.WAITING_INPUT)
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
    assert (waiting.status, waiting.reason, waiting.message) == (T, "WaitingInput", "input:confirm")
    assert waiting.last_transition_time == times[2]
    succeeded = conditions(asked.status)["Succeeded"]
    assert (succeeded.status, succeeded.reason) == (U, "WaitingInput")
    assert succeeded.last_transition_time == times[0], "an unchanged condition status keeps its time"

    # Unanswered: nothing to commit, wake at the expiry.
    assert step(obj, times[3]) == Idle(wake_at=times[2] + timedelta(hours=1), reason="waiting")

    # The answer arrives: recorded as a reference with a digest, never as text.
    obj = patch_spec(obj, answers={"confirm": ANSWER})
    received = commit_at(times[4])
    assert (received.event, received.state) == (E.INPUT_RECEIVED, S.RESUME_VALIDATION)
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
    assert (waiting.status, waiting.reason, waiting.last_transition_time) == (F, "ResumeValidation", times[4])

    revalidated = commit_at(times[5])
    assert (revalidated.event, revalidated.state) == (E.REVALIDATED, S.READY)

    # await -> waiting_external, in the same way.
    awaited = commit_at(times[6])
    assert (awaited.event, awaited.state) == (E.EXTERNAL_AWAITED, S.WAITING_EXTERNAL)
    cp = checkpoint_of(awaited)
    assert cp.pending_external == PendingExternal(
        request_id="window", event="window-open", expires_at=times[6] + timedelta(hours=1)
    )
    assert awaited.status.waiting_for == "event:window-open"
    assert condition_view(awaited.status)["Waiting"] == ("True", "WaitingExternal")
    assert step(obj, times[7]) == Idle(wake_at=times[6] + timedelta(hours=1), reason="waiting")

    obj = patch_spec(obj, events={"window-open": EVENT_PAYLOAD})
    delivered = commit_at(times[8])
    assert (delivered.event, delivered.state) == (E.EXTERNAL_RECEIVED, S.RESUME_VALIDATION)
    cp = checkpoint_of(delivered)
    assert [r.id for r in cp.input_refs] == ["answer-confirm", "event-window"]
    event_ref = cp.input_refs[1]
    assert isinstance(event_ref, ExternalEvidenceRef)
    assert event_ref.uri == "agentrun://team-a/run-1/spec.events/window-open"
    assert event_ref.content_digest == canonical_digest(EVENT_PAYLOAD)
    assert (event_ref.step_index, cp.position.step, cp.pending_external) == (2, 3, None)

    assert commit_at(times[9]).event is E.REVALIDATED

    # complete -> completed, with the result.
    done = commit_at(times[10])
    assert (done.event, done.state) == (E.SUCCEEDED, S.COMPLETED)
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
    assert AgentRunStatus.model_validate(obj["status"]).state is S.COMPLETED


def test_the_walk_completes_without_stopping_when_everything_is_supplied() -> None:
    obj = new_run(**read_ask_await_complete("settings", answered=True))
    obj, commits, idle = drive(obj, T0)
    assert [c.event.value for c in commits] == EXPECTED_EVENTS
    assert idle == Idle(wake_at=None, reason="run is completed")
    assert_history_is_gapless(obj)


def test_without_a_policy_the_checkpoint_names_none_and_runtime_config_is_empty() -> None:
    commit = commit_of(step(new_run(), T0, settings=Settings()))
    assert commit.checkpoint is not None
    assert "policy" not in commit.checkpoint
    assert checkpoint_of(commit).runtime_config == RuntimeConfig()


@pytest.mark.parametrize(
    ("kind", "wait_expiries", "expected"),
    [
        ("ask", WaitExpiries(), timedelta(hours=24)),
        ("ask", WaitExpiries(input="5m"), timedelta(minutes=5)),
        ("await", WaitExpiries(), timedelta(hours=24)),
        ("await", WaitExpiries(external="7m30s"), timedelta(minutes=7, seconds=30)),
    ],
)
def test_a_wait_without_expires_in_uses_the_policy_expiry(
    kind: str, wait_expiries: WaitExpiries, expected: timedelta
) -> None:
    body = {"question": "q"} if kind == "ask" else {"event": "go"}
    settings = Settings(wait_expiries=wait_expiries)
    obj, _, idle = drive(new_run(steps=[{"name": "wait", kind: body}]), T0, settings=settings)
    assert idle.wake_at == T0 + expected
    cp = checkpoint_of(obj["status"]["checkpoint"])
    pending = cp.pending_input if kind == "ask" else cp.pending_external
    assert pending is not None
    assert pending.expires_at == T0 + expected


# --- expiry and deadline ---------------------------------------------------------------------

WAITS = {
    "ask": ({"question": "proceed?", "expiresIn": "10m"}, S.WAITING_INPUT, "InputExpired"),
    "await": ({"event": "window-open", "expiresIn": "10m"}, S.WAITING_EXTERNAL, "ExternalEventExpired"),
}


@pytest.mark.parametrize("kind", sorted(WAITS))
def test_an_unanswered_wait_is_idle_until_its_expiry_then_expires(kind: str) -> None:
    body, waiting_state, reason = WAITS[kind]
    obj, _, idle = drive(new_run(steps=[{"name": "confirm", kind: body}]), T0)
    expiry = T0 + timedelta(minutes=10)
    assert obj["status"]["state"] == waiting_state.value
    assert idle == Idle(wake_at=expiry, reason="waiting")
    assert step(obj, expiry - timedelta(microseconds=1)) == Idle(wake_at=expiry, reason="waiting")

    for now in (expiry, expiry + timedelta(days=3)):
        expired = commit_of(step(obj, now))
        assert_well_formed(obj, expired)
        assert (expired.event, expired.state) == (E.WAIT_EXPIRED, S.EXPIRED)
        assert expired.status.outcome is not None
        assert expired.status.outcome.reason == reason
        assert expiry.isoformat() in expired.status.outcome.message
        assert expired.status.waiting_for is None
        assert condition_view(expired.status) == {
            "Waiting": ("False", "Expired"),
            "Succeeded": ("False", reason),
            "Finished": ("True", "Expired"),
            "Quarantined": ("False", "Expired"),
        }
    assert step(apply(obj, expired), expiry) == Idle(wake_at=None, reason="run is expired")


@pytest.mark.parametrize("kind", sorted(WAITS))
def test_an_answer_present_at_the_expiry_still_wins(kind: str) -> None:
    body, _, _ = WAITS[kind]
    obj, _, _ = drive(new_run(steps=[{"name": "confirm", kind: body}]), T0)
    obj = patch_spec(
        obj, **({"answers": {"confirm": "y"}} if kind == "ask" else {"events": {"window-open": "y"}})
    )
    late = commit_of(step(obj, T0 + timedelta(hours=5)))
    assert late.event in (E.INPUT_RECEIVED, E.EXTERNAL_RECEIVED)


@pytest.mark.parametrize("kind", sorted(WAITS))
@pytest.mark.parametrize(
    ("deadline_after", "wake_after"),
    [
        (timedelta(minutes=5), timedelta(minutes=5)),  # deadline first: wake at the deadline
        (timedelta(minutes=10), timedelta(minutes=10)),
        (timedelta(minutes=30), timedelta(minutes=10)),  # expiry first: wake at the expiry
    ],
)
def test_wake_at_is_the_earlier_of_expiry_and_deadline(
    kind: str, deadline_after: timedelta, wake_after: timedelta
) -> None:
    body, _, _ = WAITS[kind]
    obj = new_run(steps=[{"name": "confirm", kind: body}], deadline=iso(T0 + deadline_after))
    obj, _, idle = drive(obj, T0)
    assert idle == Idle(wake_at=T0 + wake_after, reason="waiting")


@pytest.mark.parametrize("kind", sorted(WAITS))
def test_waking_at_a_deadline_before_the_expiry_expires_the_run(kind: str) -> None:
    body, _, _ = WAITS[kind]
    deadline = T0 + timedelta(minutes=5)
    obj, _, idle = drive(new_run(steps=[{"name": "confirm", kind: body}], deadline=iso(deadline)), T0)
    assert idle.wake_at == deadline
    commit = commit_of(step(obj, deadline))
    assert_well_formed(obj, commit)
    assert (commit.event, commit.state) == (E.DEADLINE_EXCEEDED, S.EXPIRED)
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "DeadlineExceeded"
    assert condition_view(commit.status)["Succeeded"] == ("False", "DeadlineExceeded")


@pytest.mark.parametrize("state", sorted(NON_TERMINAL_STATES - {S.QUARANTINED, S.CANCEL_REQUESTED}))
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
        assert (commit.event, commit.state) == (E.DEADLINE_EXCEEDED, S.EXPIRED)
        assert commit.status.outcome is not None
        assert commit.status.outcome.reason == "DeadlineExceeded"
        assert deadline.isoformat() in commit.status.outcome.message
        assert commit.status.history[-1].from_state is state


def test_a_read_step_past_the_deadline_expires_instead_of_reading() -> None:
    deadline = at(60)
    obj = new_run(steps=read_ask_await_complete("settings")["steps"], deadline=iso(deadline))
    obj = apply(obj, commit_of(step(obj, T0)))
    assert isinstance(step(obj, deadline - timedelta(seconds=1)), NeedRead)
    assert commit_of(step(obj, deadline)).event is E.DEADLINE_EXCEEDED
    read = ReadResult(0, evidence_for(0, "read-settings"))
    assert commit_of(step(obj, deadline, read=read)).event is E.DEADLINE_EXCEEDED


def test_a_pending_run_past_its_deadline_expires_without_being_accepted() -> None:
    obj = new_run(deadline=iso(T0 - timedelta(hours=1)))
    commit = commit_of(step(obj, T0))
    assert commit.event is E.DEADLINE_EXCEEDED


def test_a_pending_run_before_its_deadline_is_accepted() -> None:
    obj = new_run(deadline=iso(T0 + timedelta(seconds=1)))
    assert commit_of(step(obj, T0)).event is E.ACCEPTED


# --- fencing ---------------------------------------------------------------------------------


def test_every_commit_stamps_the_epoch_of_the_worker_that_made_it() -> None:
    obj = new_run(**read_ask_await_complete("settings", answered=True))
    epochs = [Fencing(holder=f"worker-{i % 2}", lease_transitions=i + 1) for i in range(len(EXPECTED_EVENTS))]
    for epoch in epochs:
        decision = step(obj, T0, epoch=epoch)
        if isinstance(decision, NeedRead):
            read = ReadResult(decision.step_index, evidence_for(decision.step_index, decision.step_name))
            decision = step(obj, T0, epoch=epoch, read=read)
        commit = commit_of(decision)
        assert_well_formed(obj, commit, epoch)
        assert commit.checkpoint is not None
        assert commit.checkpoint["fencing"] == {
            "holder": epoch.holder,
            "leaseTransitions": epoch.lease_transitions,
        }
        obj = apply(obj, commit)
    assert obj["status"]["state"] == "completed"
    assert [(h["holder"], h["epoch"]) for h in obj["status"]["history"]] == [
        (e.holder, e.lease_transitions) for e in epochs
    ]


def test_fence_on_a_run_without_a_checkpoint_writes_the_initial_one() -> None:
    obj = new_run(agent=AGENT, steps=[{"name": "done", "complete": {"result": "ok"}}])
    takeover = Fencing(holder="worker-b", lease_transitions=7)
    status = fence(snap(obj), takeover, now=at(5), settings=SETTINGS)
    assert status is not None
    assert status["state"] == "pending"
    assert status["stateVersion"] == 0
    assert status.get("history", []) == []
    cp = checkpoint_of(status["checkpoint"])
    assert cp.position == Position(state="pending", step=0, state_version=0)
    assert cp.fencing == takeover
    assert cp.runtime_config == RuntimeConfig(
        model="model-2030-01", prompt="prompt-v3", tool_set="read-only-v1"
    )
    assert cp.policy == PolicyRef(name="default-policy", version="v7")
    assert cp.timestamps.created_at == at(5)
    AgentRunStatus.model_validate(status)

    # The fenced run is accepted from that checkpoint, by whoever commits next.
    fenced = apply_status(obj, status)
    accepted = commit_of(step(fenced, at(9)))
    assert_well_formed(fenced, accepted)
    assert (accepted.event, accepted.state, accepted.status.state_version) == (E.ACCEPTED, S.READY, 1)
    cp = checkpoint_of(accepted)
    assert cp.timestamps.created_at == at(5), "the checkpoint written by the fence is kept"
    assert cp.runtime_config.model == "model-2030-01"
    assert (cp.fencing, cp.timestamps.entered_state_at) == (EPOCH, at(9))


@pytest.mark.parametrize("state", [S.READY, S.WAITING_INPUT, S.WAITING_EXTERNAL, S.COMPLETED])
def test_fence_on_a_loaded_checkpoint_changes_only_the_fencing(state: RunState) -> None:
    steps = [
        {"name": "confirm", "ask": {"question": "q", "expiresIn": "1h"}},
        {"name": "window", "await": {"event": "window-open"}},
    ]
    supplied: dict[str, Any] = {
        S.READY: {},
        S.WAITING_INPUT: {},
        S.WAITING_EXTERNAL: {"answers": {"confirm": "y"}},
        S.COMPLETED: {"answers": {"confirm": "y"}, "events": {"window-open": "y"}},
    }[state]
    if state is S.READY:
        obj = run_in(S.READY, steps=steps)
    else:
        obj, _, _ = drive(new_run(steps=steps, **supplied), T0)
    assert obj["status"]["state"] == state.value

    takeover = Fencing(holder="worker-b", lease_transitions=4)
    before = copy.deepcopy(obj)
    status = fence(snap(obj), takeover, now=at(3600), settings=Settings(policy_name="other"))
    assert obj == before
    expected = copy.deepcopy(obj["status"])
    expected["checkpoint"]["fencing"] = {"holder": "worker-b", "leaseTransitions": 4}
    assert status == expected


@pytest.mark.parametrize(
    "raw",
    [
        {"schemaVersion": 99, "position": {"state": "ready"}},
        {"schemaVersion": 1, "position": {"state": "ready", "step": -1, "stateVersion": 1}},
        {"schemaVersion": "1"},
    ],
    ids=["newer", "invalid", "not-an-integer-version"],
)
def test_fence_never_rewrites_an_unreadable_checkpoint(raw: dict[str, Any]) -> None:
    obj = run_in(S.READY)
    obj["status"]["checkpoint"] = raw
    before = copy.deepcopy(obj)
    assert fence(snap(obj), Fencing(holder="worker-b", lease_transitions=9), now=T0) is None
    assert obj == before


# --- quarantine ------------------------------------------------------------------------------

FUTURE_CHECKPOINT: dict[str, Any] = {
    "schemaVersion": 99,
    "position": {"state": "ready", "step": 3, "stateVersion": 1},
    "fencing": {"holder": "worker-from-the-future", "leaseTransitions": 12},
    "hologram": {"layers": [{"depth": 1, "ids": ["a", "b"]}, {"depth": 2, "ids": []}]},
}


@pytest.mark.parametrize("state", [S.PENDING, S.READY, S.WAITING_INPUT, S.RESUME_VALIDATION])
def test_an_unknown_schema_version_quarantines_and_keeps_the_checkpoint_as_stored(state: RunState) -> None:
    obj = run_in(state)
    obj["status"]["checkpoint"] = copy.deepcopy(FUTURE_CHECKPOINT)
    stored = copy.deepcopy(obj["status"]["checkpoint"])

    commit = commit_of(step(obj, at(30)))
    assert (commit.event, commit.state) == (E.QUARANTINE, S.QUARANTINED)
    assert commit.status.state_version == 2
    assert commit.checkpoint == stored
    assert commit.wire_status()["checkpoint"] == stored
    assert obj["status"]["checkpoint"] == stored, "the stored checkpoint must not be touched"
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "UnknownSchemaVersion"
    assert "schemaVersion 99" in commit.status.outcome.message
    quarantined = conditions(commit.status)["Quarantined"]
    assert (quarantined.status, quarantined.reason) == (T, "UnknownSchemaVersion")
    assert "schemaVersion 99" in quarantined.message
    assert quarantined.last_transition_time == at(30)
    assert condition_view(commit.status)["Finished"] == ("False", "Quarantined")
    entry = commit.status.history[-1]
    assert (entry.from_state, entry.to_state, entry.event, entry.holder, entry.epoch) == (
        state,
        S.QUARANTINED,
        "quarantine",
        "worker-a",
        3,
    )

    # Once quarantined, the run waits for a person: no commit, no wake-up, no fence.
    parked = apply(obj, commit)
    assert parked["status"]["checkpoint"] == stored
    assert step(parked, at(60)) == Idle(wake_at=None, reason=QUARANTINE_IDLE)
    assert fence(snap(parked), Fencing(holder="worker-b", lease_transitions=13), now=at(60)) is None


@pytest.mark.parametrize(
    "mangle",
    [
        lambda cp: cp["position"].update(stateVersion=-1),
        lambda cp: cp.pop("timestamps"),
        lambda cp: cp.update(unknownField=True),
        lambda cp: cp.update(schemaVersion="1"),
        lambda cp: cp.update(schemaVersion=True),
        lambda cp: cp.update(
            toolCalls=[
                {
                    "id": "c",
                    "tool": "t",
                    "stepIndex": 0,
                    "startedAt": "2030-01-01T00:00:00Z",
                    "finishedAt": "2030-01-01T00:00:00Z",
                    "outcome": "succeeded",
                    "resultRef": "missing",
                }
            ]
        ),
    ],
    ids=[
        "negative-version",
        "no-timestamps",
        "unknown-field",
        "string-version",
        "bool-version",
        "dangling-ref",
    ],
)
def test_an_invalid_checkpoint_quarantines_with_invalid_checkpoint(mangle: Any) -> None:
    obj = run_in(S.READY)
    mangle(obj["status"]["checkpoint"])
    stored = copy.deepcopy(obj["status"]["checkpoint"])
    commit = commit_of(step(obj, at(30)))
    assert (commit.event, commit.state) == (E.QUARANTINE, S.QUARANTINED)
    assert commit.checkpoint == stored
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "InvalidCheckpoint"
    assert condition_view(commit.status)["Quarantined"] == ("True", "InvalidCheckpoint")


def test_a_quarantined_run_stays_idle_whatever_arrives() -> None:
    obj = run_in(S.QUARANTINED, deadline=iso(T0), answers={"confirm": "y"}, events={"window-open": "y"})
    read = ReadResult(0, evidence_for(0, "x"))
    for now in (T0, T0 + timedelta(days=365)):
        assert step(obj, now, read=read) == Idle(wake_at=None, reason=QUARANTINE_IDLE)


def test_a_checkpoint_with_an_oversized_key_is_quarantined_not_a_crash() -> None:
    obj = run_in(S.READY)
    obj["status"]["checkpoint"]["x" * 5000] = 1
    commit = commit_of(step(obj, at(30)))
    assert commit.event is E.QUARANTINE


# --- failures and terminal states ------------------------------------------------------------


def test_a_forbidden_read_fails_the_run_with_its_reason_and_message() -> None:
    obj = new_run(**read_ask_await_complete("kube-root-ca.crt"))
    obj = apply(obj, commit_of(step(obj, T0)))
    need = step(obj, at(1))
    assert isinstance(need, NeedRead)
    message = "ServiceAccount team-a/default may not read ConfigMap team-a/kube-root-ca.crt"
    failed = commit_of(step(obj, at(1), read=ReadResult(0, error_reason="Forbidden", error_message=message)))
    assert_well_formed(obj, failed)
    assert (failed.event, failed.state) == (E.ATTEMPT_FAILED, S.FAILED)
    assert failed.status.outcome is not None
    assert (failed.status.outcome.reason, failed.status.outcome.message) == ("Forbidden", message)
    assert failed.detail == "read ConfigMap/kube-root-ca.crt failed"
    cp = checkpoint_of(failed)
    assert (cp.evidence, cp.tool_calls) == ([], [])
    assert cp.position.step == 0
    assert condition_view(failed.status) == {
        "Waiting": ("False", "Failed"),
        "Succeeded": ("False", "Forbidden"),
        "Finished": ("True", "Failed"),
        "Quarantined": ("False", "Failed"),
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
    assert [c.event for c in commits] == [E.ACCEPTED, E.ATTEMPT_FAILED]
    assert commits[-1].status.outcome is not None
    assert commits[-1].status.outcome.reason == "PlannerError"
    assert "'nothing'" in commits[-1].status.outcome.message
    assert idle.wake_at is None


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


def test_a_cancellation_in_progress_finishes_even_past_the_deadline() -> None:
    obj = run_in(S.CANCEL_REQUESTED, deadline=iso(T0))
    commit = commit_of(step(obj, at(60)))
    assert (commit.event, commit.state) == (E.CANCEL_FINISHED, S.CANCELED)


def test_a_pending_run_with_a_checkpoint_is_accepted_again() -> None:
    obj = run_in(S.PENDING)
    commit = commit_of(step(obj, at(1)))
    assert_well_formed(obj, commit)
    assert (commit.event, commit.state) == (E.ACCEPTED, S.READY)


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (S.WAITING_INPUT, E.INPUT_RECEIVED),
        (S.WAITING_EXTERNAL, E.EXTERNAL_RECEIVED),
        (S.WAITING_APPROVAL, E.APPROVAL_DECIDED),
    ],
)
def test_a_wait_with_nothing_recorded_is_left(state: RunState, event: RunEvent) -> None:
    obj = run_in(state)
    commit = commit_of(step(obj, at(1)))
    assert_well_formed(obj, commit)
    assert (commit.event, commit.state) == (event, S.RESUME_VALIDATION)


# --- bounded history -------------------------------------------------------------------------


def test_history_keeps_only_the_last_history_limit_entries() -> None:
    questions = 25
    steps = [{"name": f"q{i}", "ask": {"question": f"question {i}?"}} for i in range(questions)]
    obj = new_run(steps=steps, answers={f"q{i}": "y" for i in range(questions)})
    obj, commits, idle = drive(obj, T0)
    total = 1 + 3 * questions + 1
    assert len(commits) == total > HISTORY_LIMIT
    assert idle.wake_at is None
    history = obj["status"]["history"]
    assert len(history) == HISTORY_LIMIT
    assert [h["stateVersion"] for h in history] == list(range(total - HISTORY_LIMIT + 1, total + 1))
    assert history[-1]["event"] == "succeeded"
    assert obj["status"]["stateVersion"] == obj["status"]["checkpoint"]["position"]["stateVersion"] == total
    assert [c.status.state_version for c in commits] == list(range(1, total + 1))
    assert all(len(c.status.history) <= HISTORY_LIMIT for c in commits)
    snap(obj)  # the bounded status still validates (history has a maxItems)


# --- input the engine must never see: refused by the API types (and so by the CRD schema) ----


def test_an_empty_question_is_refused_by_the_api_types() -> None:
    with pytest.raises(ValidationError, match="question"):
        RunSnapshot.from_object(new_run(steps=[{"name": "confirm", "ask": {"question": ""}}]))


def test_an_empty_agent_identifier_is_refused_by_the_api_types() -> None:
    with pytest.raises(ValidationError, match="model"):
        RunSnapshot.from_object(new_run(agent={"model": ""}))


def test_duplicate_step_names_are_refused_by_the_crd() -> None:
    from durable_agents.api import crdgen
    from durable_agents.api.v1alpha1 import AgentRunSpec

    steps = crdgen.openapi_schema(AgentRunSpec)["properties"]["steps"]
    rules = [r["rule"] for r in steps["x-kubernetes-validations"]]
    assert "self.all(s, self.exists_one(t, t.name == s.name))" in rules


# --- property: any script, any supplied answers, any clock -----------------------------------

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
            decision = decide(snap(obj), now=now, epoch=epoch, planner=PLANNER, settings=SETTINGS, read=read)
            assert not isinstance(decision, NeedRead)
        if isinstance(decision, Idle):
            state = RunState(obj["status"]["state"])
            if decision.wake_at is None:
                assert state.terminal or state is S.QUARANTINED, state
                break
            assert state.waiting
            assert decision.wake_at > now
            if not data.draw(st.booleans(), label="wake up"):
                break
            # Waking at wake_at always makes progress: the wait expires or the deadline passes.
            now = decision.wake_at
            decision = decide(snap(obj), now=now, epoch=epoch, planner=PLANNER, settings=SETTINGS)
            assert isinstance(decision, Commit)
            assert decision.event in (E.WAIT_EXPIRED, E.DEADLINE_EXCEEDED)
        assert isinstance(decision, Commit)
        before = RunState(obj.get("status", {}).get("state", "pending"))
        assert (before, decision.event) in TRANSITIONS
        assert decision.event is not E.QUARANTINE
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


# --- approvals: request, decision, expiry per policy -----------------------------------------


def _approval_settings(**freshness: str) -> Settings:
    from durable_agents.api.v1alpha1 import ActionTier, AgentPolicySpec

    policy = AgentPolicySpec.model_validate(
        {"version": "v7", "approvalExpiry": "10m", "freshness": freshness}
    )
    return Settings(
        policy_name="default-policy",
        policy_version="v7",
        tiers={"http.post": ActionTier.CONSEQUENTIAL},
        policy=policy,
        available_effects=frozenset({"http.post"}),
    )


def _pay_run() -> dict[str, Any]:
    return new_run(
        steps=[
            {
                "name": "pay",
                "effect": {"effect": "http.post", "target": {"url": "http://b"}, "arguments": {"n": 1}},
            },
            {"name": "done", "complete": {"result": "paid"}},
        ]
    )


def _to_waiting_approval(settings: Settings) -> dict[str, Any]:
    obj = _pay_run()
    obj = apply(obj, commit_of(step(obj, T0, settings=settings)))  # accepted
    commit = commit_of(step(obj, at(1), settings=settings))
    assert (commit.event, commit.state) == (E.APPROVAL_REQUESTED, S.WAITING_APPROVAL)
    assert commit.status.approval_request is not None
    assert commit.intents == (), "nothing is intended, let alone dispatched, before approval"
    return apply(obj, commit)


def test_a_consequential_effect_requests_approval_in_one_commit() -> None:
    settings = _approval_settings()
    obj = _to_waiting_approval(settings)
    request = obj["status"]["approvalRequest"]
    assert request["requestId"] == "pay-1"
    expires = datetime.fromisoformat(request["expiresAt"].replace("Z", "+00:00"))
    assert expires == at(1) + timedelta(minutes=10)
    assert obj["status"]["checkpoint"]["approvals"][0]["digest"] == request["digest"]
    assert obj["status"]["waitingFor"] == "approval:pay-1"
    assert step(obj, at(2), settings=settings) == Idle(
        wake_at=at(1) + timedelta(minutes=10), reason="approval"
    )


@pytest.mark.parametrize(
    ("policy", "event", "state"),
    [
        ("expire", E.WAIT_EXPIRED, S.EXPIRED),
        ("reapprove", E.REVALIDATION_REQUIRED, S.RESUME_VALIDATION),
    ],
)
def test_an_expired_approval_request_moves_the_run_as_the_policy_says(
    policy: str, event: RunEvent, state: RunState
) -> None:
    settings = _approval_settings(approvalExpired=policy)
    obj = _to_waiting_approval(settings)
    commit = commit_of(step(obj, at(1) + timedelta(minutes=10), settings=settings))
    assert (commit.event, commit.state) == (event, state)
    if policy == "reapprove":
        again = commit_of(step(apply(obj, commit), at(700), settings=settings))
        assert (again.event, again.state) == (E.REAPPROVAL_REQUIRED, S.WAITING_APPROVAL)
        assert again.status.approval_request is not None
        assert again.status.approval_request.request_id == "pay-2"


def test_an_unstamped_or_mismatched_decision_is_not_acted_on() -> None:
    settings = _approval_settings()
    obj = _to_waiting_approval(settings)
    request = obj["status"]["approvalRequest"]
    unstamped = copy.deepcopy(obj)
    unstamped["spec"]["approvals"] = {"pay-1": {"digest": request["digest"], "decision": "approve"}}
    assert isinstance(step(unstamped, at(2), settings=settings), Idle)
    wrong = copy.deepcopy(obj)
    wrong["spec"]["approvals"] = {
        "pay-1": {"digest": "sha256:" + "1" * 64, "decision": "approve", "approver": {"username": "a"}}
    }
    assert isinstance(step(wrong, at(2), settings=settings), Idle)


def test_a_rejection_fails_the_attempt_with_the_reason() -> None:
    settings = _approval_settings()
    obj = _to_waiting_approval(settings)
    request = obj["status"]["approvalRequest"]
    obj["spec"]["approvals"] = {
        "pay-1": {"digest": request["digest"], "decision": "reject", "approver": {"username": "alice"}}
    }
    obj = apply(obj, commit_of(step(obj, at(2), settings=settings)))
    assert obj["status"]["state"] == "resume_validation"
    commit = commit_of(step(obj, at(3), settings=settings))
    assert (commit.event, commit.state) == (E.ATTEMPT_FAILED, S.FAILED)
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "ApprovalRejected"
