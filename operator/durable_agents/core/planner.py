"""Planners: the plugin interface that gives a run its next step, and the built-in ``scripted`` one.

A planner sees the run's reconstructed context (its spec and its checkpoint) and names the next
step. It never performs I/O and never commits anything: the engine turns the step into a
transition, and the shell performs the reads or effects a step needs. Third-party planners
register under an entry-point group (the shell loads them: :mod:`durable_agents.shell.effects.plugins`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from durable_agents.api.v1alpha1 import ActionTier, AgentRunSpec, ChildStep, ObjectReference
from durable_agents.core.checkpoint import Checkpoint
from durable_agents.core.durations import parse_duration


@dataclass(frozen=True)
class ReadObject:
    """A read-only tool step: read a Kubernetes object as the run's ServiceAccount."""

    name: str
    ref: ObjectReference


@dataclass(frozen=True)
class AskHuman:
    name: str
    request_id: str
    question: str
    expires_in: timedelta | None


@dataclass(frozen=True)
class AwaitEvent:
    name: str
    request_id: str
    event: str
    expires_in: timedelta | None


@dataclass(frozen=True)
class PerformEffect:
    """A side effect: committed as an intent first, dispatched by the ledger, then reconciled."""

    name: str
    effect: str
    target: dict[str, Any]
    arguments: dict[str, Any]
    compensates: str | None = None  # the name of the earlier effect step this one compensates
    tool: str | None = None  # the model's tool name, for a call the model planner proposed
    tier: ActionTier | None = None  # fixed by the step (an MCP tool's), else the effect's


@dataclass(frozen=True)
class StartChild:
    """Start a child run and wait for its terminal outcome."""

    name: str
    child: ChildStep


@dataclass(frozen=True)
class StartSubAgent:
    """The model calls another Agent: start a child run of it and wait for its answer."""

    name: str
    agent_ref: str
    objective: str


@dataclass(frozen=True)
class Finish:
    name: str
    result: str


@dataclass(frozen=True)
class ReadTool:
    """A read-only call of a tool on an MCP server: performed by the shell, repeated after a
    crash (like a read), its result told to the model. A consequential one is a PerformEffect."""

    name: str
    server: str
    url: str
    tool: str
    arguments: dict[str, Any]


PlannedStep = (
    ReadObject | AskHuman | AwaitEvent | PerformEffect | StartChild | StartSubAgent | Finish | ReadTool
)


@dataclass(frozen=True)
class PlanningContext:
    spec: AgentRunSpec
    checkpoint: Checkpoint


class PlannerError(Exception):
    """The planner cannot name a next step: a defined attempt that cannot continue. ``reason`` is
    the outcome's reason when the attempt fails on it."""

    reason: str = "PlannerError"


class Planner(Protocol):
    name: str

    def next_step(self, context: PlanningContext) -> PlannedStep: ...


def _expiry(text: str | None) -> timedelta | None:
    return parse_duration(text) if text else None


class ScriptedPlanner:
    """Steps declared in ``spec.steps``, taken in order; running off the end completes the run."""

    name = "scripted"

    def next_step(self, context: PlanningContext) -> PlannedStep:
        index = context.checkpoint.position.step
        steps = context.spec.steps
        if index >= len(steps):
            return Finish(name="end", result="")
        step = steps[index]
        if step.read is not None:
            return ReadObject(step.name, step.read.object)
        if step.ask is not None:
            return AskHuman(step.name, step.name, step.ask.question, _expiry(step.ask.expires_in))
        if step.await_ is not None:
            return AwaitEvent(step.name, step.name, step.await_.event, _expiry(step.await_.expires_in))
        if step.effect is not None:
            e = step.effect
            return PerformEffect(step.name, e.effect, e.target, e.arguments, e.compensates)
        if step.complete is not None:
            return Finish(step.name, step.complete.result)
        if step.child is not None:
            return StartChild(step.name, step.child)
        raise PlannerError(f"step {step.name!r} names no step kind")


BUILTIN: dict[str, Planner] = {"scripted": ScriptedPlanner()}
