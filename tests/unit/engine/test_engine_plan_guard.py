"""The spec policy's second line: the engine acts only on the spec it accepted (core/plan_guard.py).

The AgentRun spec policy (a ValidatingAdmissionPolicy) refuses a change of an immutable field at
admission; where it is not installed, the change reaches the engine, which must not act on it."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from tests.unit.builders import (
    DONE,
    KEYRING,
    READ,
    SETTINGS,
    ask,
    at,
    checkpoint_of,
    commit_of,
    decide_on,
    expect,
    new_run,
    patch_spec,
    walk,
)

from durable_agents.api.v1alpha1 import AgentRunSpec
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.plan_guard import PLAN_FIELDS, plan_digest
from durable_agents.core.statemachine import RunEvent

KEYED = replace(SETTINGS, keyring=KEYRING)


def waiting() -> dict[str, Any]:
    return walk(new_run(steps=[ask("confirm"), READ, DONE]), RunState.WAITING_INPUT, settings=KEYED)


def test_acceptance_records_the_plan_of_the_spec_as_stored() -> None:
    obj = waiting()
    recorded = checkpoint_of(obj["status"]["checkpoint"]).plan
    assert recorded == plan_digest(AgentRunSpec.model_validate(obj["spec"]))
    # Requests to the live run are not part of it; the run goes on with an answer.
    answered = patch_spec(obj, answers={"confirm": "yes"})
    assert plan_digest(AgentRunSpec.model_validate(answered["spec"])) == recorded
    expect(answered, at(1), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION, settings=KEYED)


@pytest.mark.parametrize(
    "change",
    [
        {"steps": [ask("confirm"), DONE]},  # a step dropped
        {"steps": [ask("confirm"), READ, {"name": "done", "complete": {"result": "other"}}]},
        {"objective": "something else"},
        {"taskType": "other"},
        {"serviceAccountName": "deployer"},
        {"policyRef": {"name": "lenient"}},
        {"deadline": "2031-01-01T00:00:00Z"},
        {"owner": "mallory"},
    ],
    ids=[
        "step-dropped",
        "result",
        "objective",
        "task-type",
        "service-account",
        "policy",
        "deadline",
        "owner",
    ],
)
def test_a_spec_changed_after_acceptance_is_quarantined_not_acted_on(change: dict[str, Any]) -> None:
    obj = patch_spec(waiting(), answers={"confirm": "yes"}, **change)
    before = copy.deepcopy(obj["status"]["checkpoint"])
    quarantined = commit_of(decide_on(obj, at(1), settings=KEYED))
    assert (quarantined.event, quarantined.state) == (RunEvent.QUARANTINE, RunState.QUARANTINED)
    outcome = quarantined.status.outcome
    assert outcome is not None
    assert outcome.reason == "SpecChanged"
    assert "cannot change once the run exists" in outcome.message
    assert quarantined.intents == ()
    assert obj["status"]["checkpoint"] == before  # left as stored


def test_a_run_accepted_before_plans_were_recorded_records_it_at_its_next_commit() -> None:
    obj = walk(new_run(steps=[ask("confirm"), READ, DONE]), RunState.WAITING_INPUT, settings=SETTINGS)
    del obj["status"]["checkpoint"]["plan"]  # unstamped here (no keyring): as an earlier release wrote it
    obj = patch_spec(obj, answers={"confirm": "yes"})
    obj, _ = expect(obj, at(1), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION, settings=SETTINGS)
    assert checkpoint_of(obj["status"]["checkpoint"]).plan == plan_digest(
        AgentRunSpec.model_validate(obj["spec"])
    )


def test_the_plan_leaves_out_defaults_so_a_new_defaulted_field_does_not_change_it() -> None:
    spec = AgentRunSpec.model_validate({"taskType": "t", "objective": "o", "steps": [DONE]})
    explicit = AgentRunSpec.model_validate(
        {"taskType": "t", "objective": "o", "steps": [DONE], "serviceAccountName": "default"}
    )
    assert plan_digest(spec) == plan_digest(explicit)
    assert "region" not in {name for name in PLAN_FIELDS}
    moved = spec.model_copy(update={"region": "eu"})
    assert plan_digest(moved) == plan_digest(spec)
