"""The deployment a run meets: a new operator version, and runtime configuration no longer allowed."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import DONE, T0, ask, at, checkpoint_of, expect, new_run, settings_with

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import Settings
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit


# --- deployment changes: resume validation under the new operator --------------------------------


@pytest.mark.parametrize("recorded", ["0.1.0", None])
def test_a_deployment_change_goes_through_resume_validation(recorded: str | None) -> None:
    old = Settings(operator_version=recorded)
    new = Settings(operator_version="0.2.0")
    obj, accepted = expect(
        new_run(steps=[ask("confirm"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY, settings=old
    )
    assert accepted.checkpoint is not None
    assert accepted.checkpoint["runtimeConfig"].get("operator") == recorded

    obj, required = expect(
        obj, at(1), RunEvent.REVALIDATION_REQUIRED, RunState.RESUME_VALIDATION, settings=new
    )
    assert f"operator {recorded or 'unrecorded'} -> 0.2.0" in required.detail
    obj, revalidated = expect(obj, at(2), RunEvent.REVALIDATED, RunState.READY, settings=new)
    assert checkpoint_of(revalidated).position.step == 0, "revalidation does not skip the step"
    # Once stamped, the same deployment does not revalidate again: the step proceeds.
    obj, asked = expect(obj, at(3), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT, settings=new)
    for commit in (required, revalidated, asked):
        assert commit.checkpoint is not None
        assert commit.checkpoint["runtimeConfig"]["operator"] == "0.2.0"


def test_the_same_or_an_unchecked_operator_version_is_no_deployment_change() -> None:
    v1 = Settings(operator_version="0.1.0")
    obj, _ = expect(new_run(steps=[ask("confirm"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY, settings=v1)
    _, same = expect(obj, at(1), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT, settings=v1)
    _, unchecked = expect(obj, at(1), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT, settings=Settings())
    assert unchecked.checkpoint is not None
    assert unchecked.checkpoint["runtimeConfig"]["operator"] == "0.1.0", "not stamped when unknown"
    assert same.checkpoint is not None
    assert same.checkpoint["runtimeConfig"]["operator"] == "0.1.0"


# --- runtime configuration no longer available ---------------------------------------------------

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
    obj, _ = expect(new_run(agent=AGENT, steps=[ask("confirm"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY)
    settings = settings_with(operator_version="0.2.0", runtime={**runtime, "onUnavailable": "fail"})
    obj, _ = expect(obj, at(1), RunEvent.REVALIDATION_REQUIRED, RunState.RESUME_VALIDATION, settings=settings)
    obj, failed = expect(obj, at(2), RunEvent.ATTEMPT_FAILED, RunState.FAILED, settings=settings)
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "RuntimeConfigUnavailable"
    assert what in failed.status.outcome.message


def test_an_unavailable_runtime_config_continues_when_the_policy_says_so() -> None:
    obj, _ = expect(new_run(agent=AGENT, steps=[ask("confirm"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY)
    settings = settings_with(
        operator_version="0.2.0", runtime={"models": ["m2"], "onUnavailable": "continue"}
    )
    obj, _ = expect(obj, at(1), RunEvent.REVALIDATION_REQUIRED, RunState.RESUME_VALIDATION, settings=settings)
    obj, revalidated = expect(obj, at(2), RunEvent.REVALIDATED, RunState.READY, settings=settings)
    assert "model 'm1' unavailable, continuing per policy" in revalidated.detail
    obj, _ = expect(obj, at(3), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT, settings=settings)


def test_a_listed_runtime_config_revalidates() -> None:
    obj, _ = expect(new_run(agent=AGENT, steps=[ask("confirm"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY)
    settings = settings_with(operator_version="0.2.0", runtime={"models": ["m2", "m1"], "prompts": ["p1"]})
    obj, _ = expect(obj, at(1), RunEvent.REVALIDATION_REQUIRED, RunState.RESUME_VALIDATION, settings=settings)
    obj, revalidated = expect(obj, at(2), RunEvent.REVALIDATED, RunState.READY, settings=settings)
    assert "unavailable" not in revalidated.detail
