"""Retries: a failed attempt waits out a backoff window and tries the step again, if the policy allows."""

from __future__ import annotations

import hashlib
from datetime import timedelta

from durable_agents.api.v1alpha1 import Outcome, RetryPolicy
from durable_agents.core.checkpoint import Checkpoint, RetryState, ToolCallRecord
from durable_agents.core.durations import parse_duration
from durable_agents.core.engine.commits import CommitBuilder
from durable_agents.core.engine.decisions import Commit, Decision, Idle
from durable_agents.core.engine.snapshot import Settings
from durable_agents.core.statemachine import RunEvent


def retry_backoff(policy: RetryPolicy, attempts: int, run_uid: str) -> timedelta:
    """Exponential backoff with jitter, deterministic per (run, attempt): a recomputation agrees."""
    base = parse_duration(policy.initial_backoff).total_seconds() * 2 ** max(0, attempts - 1)
    capped = min(base, parse_duration(policy.max_backoff).total_seconds())
    draw = int.from_bytes(hashlib.sha256(f"{run_uid}/{attempts}".encode()).digest()[:8], "big") / 2**64
    return timedelta(seconds=capped * (1 - policy.jitter * draw))


def attempt_failed(
    builder: CommitBuilder, settings: Settings, reason: str, message: str, detail: str
) -> Commit:
    """A defined attempt that cannot continue: a retry window if the policy allows one, else failed."""
    cp = builder.cp
    policy = settings.policy.retry if settings.policy is not None else RetryPolicy()
    attempts = cp.retry.attempts + 1
    failure = f"{reason}: {message}"[:1024]
    if attempts < policy.max_attempts:
        retry_at = builder.now + retry_backoff(policy, attempts, builder.run.run_id)
        commit = builder.commit(
            RunEvent.RETRY_SCHEDULED,
            checkpoint=cp.model_copy(
                update={"retry": RetryState(attempts=attempts, retry_at=retry_at, last_failure=failure)}
            ),
            waiting_for=f"retry:{retry_at.isoformat()}",
            detail=f"{detail}: {failure}; attempt {attempts + 1}/{policy.max_attempts}"
            f" at {retry_at.isoformat()}",
        )
        commit.status.retry_at = retry_at
        return commit
    if policy.max_attempts > 1:
        reason, message = "RetriesExhausted", f"{policy.max_attempts} attempts failed; last: {failure}"
    return builder.commit(
        RunEvent.ATTEMPT_FAILED,
        checkpoint=cp.model_copy(update={"retry": cp.retry.model_copy(update={"last_failure": failure})}),
        outcome=Outcome(reason=reason, message=message),
        detail=f"{detail}: {failure}",  # the Event says why, not only that (cut to the history's bound)
    )


def retry_when_due(builder: CommitBuilder) -> Decision:
    """In the retry window: leave it once it ends, else stay idle until then (or the deadline)."""
    cp, now = builder.cp, builder.now
    due = cp.retry.retry_at
    if due is None or now >= due:
        retry = cp.retry.model_copy(update={"retry_at": None})
        return builder.commit(
            RunEvent.RETRY_DUE,
            checkpoint=cp.model_copy(update={"retry": retry}),
            detail=f"attempt {cp.retry.attempts + 1} of step {cp.position.step}",
        )
    deadline = builder.run.spec.deadline
    return Idle(wake_at=min(due, deadline) if deadline else due, reason="retry window")


def failed_call_of_step(cp: Checkpoint) -> ToolCallRecord | None:
    """The failed call of the current step in the current attempt (earlier attempts were retried)."""
    calls = [
        call
        for call in cp.tool_calls
        if call.step_index == cp.position.step and call.attempt == cp.retry.attempts
    ]
    return calls[-1] if calls and calls[-1].outcome == "failed" else None
