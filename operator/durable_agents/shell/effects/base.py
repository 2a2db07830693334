"""Effect plugins: one interface for every side effect the action ledger dispatches.

An effect dispatches with an idempotency key, answers a query by that key from the authoritative
system, declares its tier, and says whether (and by which effect) it can be compensated.
Dispatch answers are definite (:class:`Applied`, :class:`Failed`) or :class:`Unknown`: a timeout,
a dropped connection or an ambiguous error is never a failure. Built in: ``http.post`` and
``kubernetes.apply``; third-party effects register under an entry-point group
(:mod:`durable_agents.shell.effects.plugins`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from durable_agents.api.v1alpha1 import ActionTier
from durable_agents.shell.ground.kube import Kube


@dataclass(frozen=True)
class Applied:
    """The effect happened; ``outcome`` is what the authoritative system says about it."""

    outcome: dict[str, Any]


@dataclass(frozen=True)
class Failed:
    """The effect definitely did not happen and will not by retrying (403, 4xx, invalid)."""

    reason: str
    message: str


@dataclass(frozen=True)
class Unknown:
    """We cannot tell whether it happened: ask the authoritative system before anything else."""

    reason: str
    message: str


@dataclass(frozen=True)
class NotApplied:
    """The authoritative system has no record of this key: another dispatch is allowed."""


@dataclass(frozen=True)
class Tasked:
    """The system answered with a durable handle instead of a result (an MCP task): the call was
    taken; its outcome comes from polling the handle (:class:`TaskEffect`), never from a resend."""

    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None
    protocol: str | None = None
    """The task's form (an MCP task: ``2025-11-25`` or the extension's); kept with the handle."""
    session: str | None = None
    """The session the task lives in, when the form has one."""


@dataclass(frozen=True)
class InputRequired:
    """The system asks for a person's input before it completes the call (an MCP server's
    ``InputRequiredResult``); nothing was applied. ``questions``: each request's key and its
    question as a person reads it; ``refused``: requests no person is asked (key: why), declined
    on the retry; ``request_state``: echoed on the retry, byte for byte."""

    questions: dict[str, str]
    refused: dict[str, str]
    request_state: str | None


DispatchResult = Applied | Failed | Unknown | Tasked | InputRequired
QueryResult = Applied | NotApplied | Unknown
TaskPollResult = Applied | Failed | Unknown | Tasked
"""A poll's answer: settled (applied, failed), unknown (the system no longer knows the handle),
or the task as it stands (poll again)."""


@dataclass(frozen=True)
class EffectContext:
    """Who the effect acts as, and how long a dispatch may take before its outcome is unknown."""

    kube: Kube
    namespace: str  # the run's
    service_account: str
    timeout: float = 5.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Action:
    key: str
    target: dict[str, Any]
    arguments: dict[str, Any]


class Effect(Protocol):
    name: str
    tier: ActionTier
    reversible: bool
    compensation: str | None  # the effect that compensates this one, if any

    async def dispatch(self, ctx: EffectContext, action: Action) -> DispatchResult: ...

    async def query(self, ctx: EffectContext, action: Action) -> QueryResult: ...


@runtime_checkable
class TaskEffect(Effect, Protocol):
    """An effect whose dispatch may answer :class:`Tasked`: it polls and cancels the handle."""

    async def poll(
        self,
        ctx: EffectContext,
        action: Action,
        task_id: str,
        *,
        protocol: str | None = None,
        session: str | None = None,
    ) -> TaskPollResult: ...

    async def cancel(
        self,
        ctx: EffectContext,
        action: Action,
        task_id: str,
        *,
        protocol: str | None = None,
        session: str | None = None,
    ) -> str: ...
