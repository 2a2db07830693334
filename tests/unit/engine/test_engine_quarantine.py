"""Quarantine: an unreadable checkpoint parks the run untouched; a retry or a cancel moves it."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.builders import (
    DONE,
    FUTURE_CHECKPOINT,
    QUARANTINE_IDLE,
    SETTINGS,
    T0,
    advance_untouched,
    apply,
    ask,
    at,
    cancel,
    checkpoint_of,
    commit_of,
    condition_view,
    conditions,
    decide_on,
    evidence_for,
    expect,
    iso,
    new_run,
    patch_spec,
    run_in,
    snap,
    step,
    walk,
)

from durable_agents.api.v1alpha1 import CancelScope, ConditionStatus
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import CURRENT_SCHEMA_VERSION, Fencing
from durable_agents.core.engine import Idle, ReadResult, fence
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit


# --- an unreadable checkpoint quarantines the run ------------------------------------------------


@pytest.mark.parametrize(
    "state", [RunState.PENDING, RunState.READY, RunState.WAITING_INPUT, RunState.RESUME_VALIDATION]
)
def test_an_unknown_schema_version_quarantines_and_keeps_the_checkpoint_as_stored(state: RunState) -> None:
    obj = run_in(state)
    obj["status"]["checkpoint"] = copy.deepcopy(FUTURE_CHECKPOINT)
    stored = copy.deepcopy(obj["status"]["checkpoint"])

    commit = commit_of(step(obj, at(30)))
    assert (commit.event, commit.state) == (RunEvent.QUARANTINE, RunState.QUARANTINED)
    assert commit.status.state_version == 2
    assert commit.checkpoint == stored
    assert commit.wire_status()["checkpoint"] == stored
    assert obj["status"]["checkpoint"] == stored, "the stored checkpoint must not be touched"
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "UnknownSchemaVersion"
    assert "schemaVersion 99" in commit.status.outcome.message
    quarantined = conditions(commit.status)["Quarantined"]
    assert (quarantined.status, quarantined.reason) == (ConditionStatus.TRUE, "UnknownSchemaVersion")
    assert "schemaVersion 99" in quarantined.message
    assert quarantined.last_transition_time == at(30)
    assert condition_view(commit.status)["Finished"] == ("False", "Quarantined")
    entry = commit.status.history[-1]
    assert (entry.from_state, entry.to_state, entry.event, entry.holder, entry.epoch) == (
        state,
        RunState.QUARANTINED,
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
    obj = run_in(RunState.READY)
    mangle(obj["status"]["checkpoint"])
    stored = copy.deepcopy(obj["status"]["checkpoint"])
    commit = commit_of(step(obj, at(30)))
    assert (commit.event, commit.state) == (RunEvent.QUARANTINE, RunState.QUARANTINED)
    assert commit.checkpoint == stored
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "InvalidCheckpoint"
    assert condition_view(commit.status)["Quarantined"] == ("True", "InvalidCheckpoint")


def test_a_quarantined_run_stays_idle_whatever_arrives() -> None:
    obj = run_in(
        RunState.QUARANTINED, deadline=iso(T0), answers={"confirm": "y"}, events={"window-open": "y"}
    )
    read = ReadResult(0, evidence_for(0, "x"))
    for now in (T0, T0 + timedelta(days=365)):
        assert step(obj, now, read=read) == Idle(wake_at=None, reason=QUARANTINE_IDLE)


def test_a_checkpoint_with_an_oversized_key_is_quarantined_not_a_crash() -> None:
    obj = run_in(RunState.READY)
    obj["status"]["checkpoint"]["x" * 5000] = 1
    commit = commit_of(step(obj, at(30)))
    assert commit.event is RunEvent.QUARANTINE


# --- quarantine controls: retry after an upgrade, or cancel --------------------------------------


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
    obj = walk(new_run(steps=[ask("confirm"), DONE], **spec), RunState.READY, settings=SETTINGS)
    readable = copy.deepcopy(obj["status"]["checkpoint"])
    obj["status"]["checkpoint"] = copy.deepcopy(FUTURE_CHECKPOINT)
    obj, commit = advance_untouched(obj, at(1))
    assert (commit.event, commit.state) == (RunEvent.QUARANTINE, RunState.QUARANTINED)
    return obj, readable


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
    obj, released = expect(obj, at(2), RunEvent.RELEASE_QUARANTINE, RunState.RESUME_VALIDATION)
    assert released.migrated_from == 1
    assert released.status.quarantine_retried == "t1"
    assert released.checkpoint is not None
    assert released.checkpoint["schemaVersion"] == CURRENT_SCHEMA_VERSION
    assert "attempt" not in released.checkpoint
    assert checkpoint_of(released).retry.attempts == 2
    assert "t1" in released.detail
    assert "migrated from schemaVersion 1" in released.detail
    # From here the run goes on as usual.
    obj, _ = expect(obj, at(3), RunEvent.REVALIDATED, RunState.READY)
    obj, _ = expect(obj, at(4), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT)


def test_a_retry_token_acts_once() -> None:
    obj, readable = quarantined()
    obj["status"]["checkpoint"] = as_v1(readable)
    obj["status"]["quarantineRetried"] = "t1"
    obj = patch_spec(obj, retryQuarantine="t1")
    assert decide_on(obj, at(2)) == Idle(reason=QUARANTINE_IDLE)
    obj = patch_spec(obj, retryQuarantine="t2")
    assert commit_of(decide_on(obj, at(3))).event is RunEvent.RELEASE_QUARANTINE


@pytest.mark.parametrize("retry_token", [None, "t1"])
def test_a_cancellation_of_a_quarantined_run_leaves_the_checkpoint_untouched(retry_token: str | None) -> None:
    obj, _ = quarantined()
    if retry_token is not None:
        obj = patch_spec(obj, retryQuarantine=retry_token)  # cancel wins over retry
    obj = cancel(obj, {"stop-1": {"reason": "give up", "requestedAt": iso(at(1))}})
    obj, requested = advance_untouched(obj, at(2))
    assert (requested.event, requested.state) == (RunEvent.CANCEL_REQUESTED, RunState.CANCEL_REQUESTED)
    cancellation = requested.status.cancellation
    assert cancellation is not None
    assert (cancellation.request_id, cancellation.scope, cancellation.reason) == (
        "stop-1",
        CancelScope.TASK,
        "give up",
    )
    assert requested.status.history[-1].from_state is RunState.QUARANTINED

    obj, finished = advance_untouched(obj, at(3))
    assert (finished.event, finished.state) == (RunEvent.CANCEL_FINISHED, RunState.CANCELED)
    assert finished.status.outcome is not None
    assert finished.status.outcome.reason == "Canceled"
    assert "unreadable checkpoint" in finished.status.outcome.message
    assert finished.status.cancellation == cancellation
    assert obj["status"]["checkpoint"] == FUTURE_CHECKPOINT
    assert decide_on(obj, at(4)) == Idle(reason="run is canceled")


def test_a_step_cancellation_handled_before_quarantine_does_not_cancel_the_quarantined_run() -> None:
    """Quarantine controls are a task cancellation or a retry token: an old turn-scope request,
    already acted on while the checkpoint was readable, must not end the run."""
    obj = walk(new_run(steps=[ask("first"), ask("second"), DONE]), RunState.WAITING_INPUT, settings=SETTINGS)
    obj = cancel(obj, {"skip-1": {"scope": "turn"}})
    obj, _ = expect(obj, at(1), RunEvent.STEP_CANCELED, RunState.RESUME_VALIDATION)
    obj, _ = expect(obj, at(2), RunEvent.REVALIDATED, RunState.READY)
    obj, _ = expect(obj, at(3), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT)
    obj["status"]["checkpoint"] = copy.deepcopy(FUTURE_CHECKPOINT)
    obj, commit = advance_untouched(obj, at(4))
    assert commit.event is RunEvent.QUARANTINE
    assert decide_on(obj, at(5)) == Idle(reason=QUARANTINE_IDLE)
