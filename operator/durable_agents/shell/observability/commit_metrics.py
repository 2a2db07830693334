"""What one committed transition tells the seed's metrics: how long a wait lasted, how long an
approval took, why a resume validation failed, a checkpoint that could not be migrated, and a
model-planned run's calls and tokens when it ends.

Everything is read from the commit itself (its history and its checkpoint): no request, no state
kept here. Label values are bounded: waiting states, event names and outcome reasons the operator
writes, schema versions (anything else is counted as ``other``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, get_args

from durable_agents.api.v1alpha1 import HistoryEntry
from durable_agents.api.v1alpha1.states import WAITING_STATES, RunState
from durable_agents.core.checkpoint import CURRENT_SCHEMA_VERSION, MIGRATIONS, QuarantineReason
from durable_agents.core.engine import Commit
from durable_agents.core.engine.quarantine import INTERNAL_ERROR
from durable_agents.core.statemachine import RunEvent
from durable_agents.shell.ground import metrics

# The quarantines that say a stored checkpoint could not be brought to the current schema.
MIGRATION_FAILURES = frozenset({"MigrationFailed", "UnknownSchemaVersion"})
# Leaving resume validation any other way than these is a resume failure: it resumed, went back
# into the wait its checkpoint records, or a person's cancellation came first.
RESUMED = frozenset(
    {
        RunEvent.REVALIDATED,
        RunEvent.INPUT_REQUESTED,
        RunEvent.EXTERNAL_AWAITED,
        RunEvent.CANCEL_REQUESTED,
        RunEvent.CANCEL_RECORDED,
    }
)
# The resume failures known at start-up (initialised, so their series exist at 0).
RESUME_FAILURE_REASONS = (
    "RefreshRequired",
    "ReapprovalRequired",
    "RetryScheduled",
    "ActionFailed",
    "RuntimeConfigUnavailable",
    "ChildFailed",
    "DeadlineExceeded",
)
_REASON = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,63}$")


def initialise() -> None:
    """Create every labelled series whose label values are known before anything happens."""
    for state in WAITING_STATES:
        metrics.OLDEST_WAITING.labels(state.value).set(0)
        metrics.WAITING_RUNS.labels(state.value).set(0)
        metrics.WAITING_SECONDS.labels(state.value)
    for reason in RESUME_FAILURE_REASONS:
        metrics.RESUME_FAILURES.labels(reason)
    for version in sorted(MIGRATIONS):
        metrics.CHECKPOINT_MIGRATION_ERRORS.labels(str(version))
    for kind in ("input", "output"):
        metrics.MODEL_TOKENS.labels(kind)
    metrics.MODEL_CALLS.labels("Answered")
    for quarantine in (*get_args(QuarantineReason), INTERNAL_ERROR):
        metrics.QUARANTINES.labels(quarantine)
    for kind in ("shard", "region"):
        metrics.OWNERSHIP_CHANGES.labels(kind)


def entered_at(history: Sequence[HistoryEntry], state: RunState) -> datetime | None:
    """When the run last entered ``state``, from the history before its newest entry (the commit
    that leaves it); None if the history no longer reaches back that far."""
    for entry in reversed(history[:-1]):
        if entry.to_state is not state:
            return None
        if entry.from_state is not state:  # the entry into the state, not a self-transition
            return entry.at
    return None


def camel(event: RunEvent) -> str:
    return "".join(part.capitalize() for part in event.value.split("_"))


def bounded(reason: str) -> str:
    return reason if _REASON.match(reason) else "other"


def observe_commit(before: RunState, commit: Commit) -> None:
    """Count what ``commit`` (a transition from ``before``, already written) says."""
    status = commit.status
    after = status.state
    if before.waiting and after is not before and status.history:
        since = entered_at(status.history, before)
        now = status.history[-1].at
        if since is not None:
            waited = max(0.0, (now - since).total_seconds())
            metrics.WAITING_SECONDS.labels(before.value).observe(waited)
            if before is RunState.WAITING_APPROVAL and commit.event is RunEvent.APPROVAL_DECIDED:
                metrics.APPROVAL_LATENCY.observe(waited)
    if before is RunState.RESUME_VALIDATION and commit.event not in RESUMED:
        ended = after.terminal or after is RunState.QUARANTINED
        reason = status.outcome.reason if ended and status.outcome else camel(commit.event)
        metrics.RESUME_FAILURES.labels(bounded(reason)).inc()
    if (
        commit.event is RunEvent.QUARANTINE
        and status.outcome is not None
        and status.outcome.reason in MIGRATION_FAILURES
    ):
        metrics.CHECKPOINT_MIGRATION_ERRORS.labels(stored_version(commit.checkpoint)).inc()
    if after.terminal and not before.terminal:
        observe_model_run(commit.checkpoint)


def stored_version(checkpoint: dict[str, Any] | None) -> str:
    """The schema version a quarantined checkpoint was stored with (it is left as stored)."""
    version = (checkpoint or {}).get("schemaVersion")
    known = type(version) is int and 0 < version <= CURRENT_SCHEMA_VERSION + 8
    return str(version) if known else "other"


def observe_model_run(checkpoint: dict[str, Any] | None) -> None:
    """A model-planned run ended: its model calls and tokens, from the checkpoint's totals."""
    agent = (checkpoint or {}).get("agent")
    if not isinstance(agent, dict):
        return  # not a model-planned run (or an unreadable checkpoint)
    usage = agent.get("usageTotal") or {}
    tokens = int(usage.get("inputTokens") or 0) + int(usage.get("outputTokens") or 0)
    metrics.MODEL_CALLS_PER_RUN.observe(int(agent.get("modelCallsTotal") or 0))
    metrics.MODEL_TOKENS_PER_RUN.observe(tokens)
