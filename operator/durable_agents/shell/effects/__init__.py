"""Effect plugins: the interface (:mod:`.base`) and the built-in effects (``http``, ``kubernetes``)."""

from __future__ import annotations

from durable_agents.shell.effects.base import (
    Action,
    Applied,
    DispatchResult,
    Effect,
    EffectContext,
    Failed,
    InputRequired,
    NotApplied,
    QueryResult,
    Tasked,
    TaskEffect,
    TaskPollResult,
    Unknown,
)

__all__ = [
    "Action",
    "Applied",
    "DispatchResult",
    "Effect",
    "EffectContext",
    "Failed",
    "InputRequired",
    "NotApplied",
    "QueryResult",
    "TaskEffect",
    "TaskPollResult",
    "Tasked",
    "Unknown",
]
