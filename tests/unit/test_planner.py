"""The scripted planner: each step kind, running off the end, expiries, errors, plugin loading."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import AgentRunSpec, ObjectReference
from durable_agents.core.checkpoint import Checkpoint, Position, Timestamps
from durable_agents.core.planner import (
    BUILTIN,
    AskHuman,
    AwaitEvent,
    Finish,
    PlannerError,
    PlanningContext,
    ReadObject,
    ScriptedPlanner,
)

pytestmark = pytest.mark.unit

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

STEPS: list[dict[str, Any]] = [
    {"name": "read-settings", "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": "cfg"}}},
    {
        "name": "read-other",
        "read": {
            "object": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "namespace": "prod"}
        },
    },
    {"name": "confirm", "ask": {"question": "proceed?", "expiresIn": "1h30m"}},
    {"name": "confirm-again", "ask": {"question": "really?"}},
    {"name": "window", "await": {"event": "window-open", "expiresIn": "90s"}},
    {"name": "window-again", "await": {"event": "window-closed"}},
    {"name": "done", "complete": {"result": "ok"}},
    {"name": "done-quietly", "complete": {}},
]


def context(steps: list[dict[str, Any]], index: int) -> PlanningContext:
    spec = AgentRunSpec.model_validate({"taskType": "unit", "objective": "plan", "steps": steps})
    checkpoint = Checkpoint(
        position=Position(state="ready", step=index, state_version=index + 1),
        timestamps=Timestamps(created_at=T0, updated_at=T0, entered_state_at=T0),
    )
    return PlanningContext(spec, checkpoint)


def plan(steps: list[dict[str, Any]], index: int) -> object:
    return ScriptedPlanner().next_step(context(steps, index))


def test_the_scripted_planner_is_the_builtin_named_scripted() -> None:
    assert ScriptedPlanner.name == "scripted"
    assert isinstance(BUILTIN["scripted"], ScriptedPlanner)


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (0, ReadObject("read-settings", ObjectReference(api_version="v1", kind="ConfigMap", name="cfg"))),
        (
            1,
            ReadObject(
                "read-other",
                ObjectReference(api_version="apps/v1", kind="Deployment", name="web", namespace="prod"),
            ),
        ),
        (2, AskHuman("confirm", "confirm", "proceed?", timedelta(hours=1, minutes=30))),
        (3, AskHuman("confirm-again", "confirm-again", "really?", None)),
        (4, AwaitEvent("window", "window", "window-open", timedelta(seconds=90))),
        (5, AwaitEvent("window-again", "window-again", "window-closed", None)),
        (6, Finish("done", "ok")),
        (7, Finish("done-quietly", "")),
    ],
)
def test_each_step_kind_maps_to_its_planned_step(index: int, expected: object) -> None:
    assert plan(STEPS, index) == expected


def test_the_request_id_of_a_wait_is_the_step_name() -> None:
    ask = plan(STEPS, 2)
    wait = plan(STEPS, 4)
    assert isinstance(ask, AskHuman)
    assert isinstance(wait, AwaitEvent)
    assert (ask.request_id, wait.request_id) == ("confirm", "window")
    assert wait.event == "window-open"  # the event name, not the step name, is what spec.events keys


@pytest.mark.parametrize("index", [len(STEPS), len(STEPS) + 1, 63])
def test_running_past_the_last_step_finishes(index: int) -> None:
    assert plan(STEPS, index) == Finish(name="end", result="")


def test_a_run_without_steps_finishes_at_once() -> None:
    assert plan([], 0) == Finish(name="end", result="")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1.5h", timedelta(minutes=90)),
        ("250ms", timedelta(milliseconds=250)),
        ("0s", timedelta(0)),
        ("2h0m30s", timedelta(hours=2, seconds=30)),
    ],
)
def test_expires_in_is_parsed_as_a_go_duration(text: str, expected: timedelta) -> None:
    steps = [
        {"name": "ask", "ask": {"question": "q", "expiresIn": text}},
        {"name": "wait", "await": {"event": "e", "expiresIn": text}},
    ]
    ask, wait = plan(steps, 0), plan(steps, 1)
    assert isinstance(ask, AskHuman)
    assert isinstance(wait, AwaitEvent)
    assert ask.expires_in == expected
    assert wait.expires_in == expected


def test_a_step_naming_no_kind_is_a_planner_error() -> None:
    # The CRD's CEL rule forbids this; the planner must still answer with a defined error.
    with pytest.raises(PlannerError, match="'empty'"):
        plan([{"name": "empty"}], 0)


def test_the_planner_reads_only_the_position_and_the_steps() -> None:
    # The same position gives the same step, however often it is asked: planning is pure.
    ctx = context(STEPS, 2)
    planner = ScriptedPlanner()
    assert planner.next_step(ctx) == planner.next_step(ctx) == plan(STEPS, 2)
