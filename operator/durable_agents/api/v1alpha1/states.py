"""The persisted positions of a run: part of the public API (``status.state``).

The transitions between them are the core's (:mod:`durable_agents.core.statemachine`).
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    """The persisted position of a run. The string values are the public API."""

    PENDING = "pending"
    READY = "ready"
    WAITING_INPUT = "waiting_input"
    WAITING_APPROVAL = "waiting_approval"
    WAITING_EXTERNAL = "waiting_external"
    WAITING_RETRY = "waiting_retry"
    RESUME_VALIDATION = "resume_validation"
    CANCEL_REQUESTED = "cancel_requested"
    QUARANTINED = "quarantined"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def waiting(self) -> bool:
        return self in WAITING_STATES


TERMINAL_STATES: frozenset[RunState] = frozenset(
    {RunState.COMPLETED, RunState.FAILED, RunState.CANCELED, RunState.EXPIRED}
)
WAITING_STATES: frozenset[RunState] = frozenset(
    {RunState.WAITING_INPUT, RunState.WAITING_APPROVAL, RunState.WAITING_EXTERNAL, RunState.WAITING_RETRY}
)
NON_TERMINAL_STATES: frozenset[RunState] = frozenset(RunState) - TERMINAL_STATES
