"""fence(): a worker taking over a run stamps its lease epoch without a transition."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from tests.unit.builders import (
    AGENT,
    EPOCH,
    SETTINGS,
    T0,
    apply_status,
    assert_well_formed,
    at,
    checkpoint_of,
    commit_of,
    drive,
    new_run,
    run_in,
    snap,
    step,
)

from durable_agents.api.v1alpha1 import AgentRunStatus
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import Fencing, PolicyRef, Position, RuntimeConfig
from durable_agents.core.engine import Settings, fence
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit


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
    assert (accepted.event, accepted.state, accepted.status.state_version) == (
        RunEvent.ACCEPTED,
        RunState.READY,
        1,
    )
    cp = checkpoint_of(accepted)
    assert cp.timestamps.created_at == at(5), "the checkpoint written by the fence is kept"
    assert cp.runtime_config.model == "model-2030-01"
    assert (cp.fencing, cp.timestamps.entered_state_at) == (EPOCH, at(9))


@pytest.mark.parametrize(
    "state", [RunState.READY, RunState.WAITING_INPUT, RunState.WAITING_EXTERNAL, RunState.COMPLETED]
)
def test_fence_on_a_loaded_checkpoint_changes_only_the_fencing(state: RunState) -> None:
    steps = [
        {"name": "confirm", "ask": {"question": "q", "expiresIn": "1h"}},
        {"name": "window", "await": {"event": "window-open"}},
    ]
    supplied: dict[str, Any] = {
        RunState.READY: {},
        RunState.WAITING_INPUT: {},
        RunState.WAITING_EXTERNAL: {"answers": {"confirm": "y"}},
        RunState.COMPLETED: {"answers": {"confirm": "y"}, "events": {"window-open": "y"}},
    }[state]
    if state is RunState.READY:
        obj = run_in(RunState.READY, steps=steps)
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
    obj = run_in(RunState.READY)
    obj["status"]["checkpoint"] = raw
    before = copy.deepcopy(obj)
    assert fence(snap(obj), Fencing(holder="worker-b", lease_transitions=9), now=T0) is None
    assert obj == before
