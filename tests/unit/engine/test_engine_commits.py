"""Every commit: stamped with the epoch of the worker that made it and, where the operator has
keys, with the integrity stamp over its checkpoint; with a bounded history."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.builders import (
    SETTINGS,
    T0,
    UID,
    apply,
    assert_well_formed,
    commit_of,
    drive,
    evidence_for,
    new_run,
    snap,
    step,
)

from durable_agents.api.v1alpha1 import HISTORY_LIMIT
from durable_agents.core.checkpoint import Fencing, verify_integrity
from durable_agents.core.engine import NeedRead, ReadResult
from durable_agents.core.sealing import Keyring
from durable_agents_testkit.runs import EXPECTED_EVENTS, read_ask_await_complete

pytestmark = pytest.mark.unit


# --- fencing tokens in every commit --------------------------------------------------------------


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


# --- bounded history -----------------------------------------------------------------------------


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


# --- the integrity stamp: the last thing a commit does --------------------------------------------

KEYRING = Keyring(keys={"k2030": bytes(range(32))}, active_key_id="k2030")


def test_every_commit_stamps_its_checkpoint_bound_to_the_recorded_run_id() -> None:
    keyed = replace(SETTINGS, keyring=KEYRING)
    obj = new_run(**read_ask_await_complete("settings", answered=True))
    obj, commits, _ = drive(obj, T0, settings=keyed)
    assert obj["status"]["state"] == "completed"
    assert len(commits) == len(EXPECTED_EVENTS)
    for commit in commits:
        assert commit.checkpoint is not None
        assert commit.status.run_id == UID
        assert commit.checkpoint["integrity"].startswith("k2030:")
        assert verify_integrity(commit.checkpoint, keyring=KEYRING, run_id=UID) is None, commit.event
        assert verify_integrity(commit.checkpoint, keyring=KEYRING, run_id="another-run") is not None


def test_a_restored_run_keeps_its_run_id_and_its_stamps_verify() -> None:
    keyed = replace(SETTINGS, keyring=KEYRING)
    obj = new_run(**read_ask_await_complete("settings", answered=False))
    obj, _, _ = drive(obj, T0, settings=keyed)
    assert obj["status"]["state"] == "waiting_input"
    obj["metadata"]["uid"] = "restored-uid"  # a restore from backup: a new uid, status.runId kept
    obj["spec"]["answers"] = {"confirm": "yes"}
    commit = commit_of(step(obj, T0, settings=keyed))
    assert commit.event.value == "input_received"
    assert verify_integrity(commit.checkpoint or {}, keyring=KEYRING, run_id=UID) is None
