"""Retry windows: a failed attempt waits out a backoff and tries again, as the policy allows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from tests.unit.builders import (
    DONE,
    EFFECTS,
    NOT_FOUND,
    READ,
    RETRY_3,
    UID,
    advance,
    at,
    checkpoint_of,
    cp_of,
    decide_on,
    effect,
    evidence_for,
    expect,
    failed_read,
    new_run,
    settings_with,
    waiting_on_action,
    walk,
)

from durable_agents.api.v1alpha1 import ActionState, RetryPolicy
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import (
    ActionObservation,
    Idle,
    NeedActions,
    NeedRead,
    ReadResult,
    Settings,
    retry_backoff,
)
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit


# --- retry windows -------------------------------------------------------------------------------


def test_a_failed_read_is_retried_in_a_window_until_attempts_are_exhausted() -> None:
    policy = RETRY_3.policy
    assert policy is not None
    obj = walk(new_run(steps=[READ, DONE]), RunState.READY, settings=RETRY_3)
    now = at(1)
    bounds = {1: (1.6, 2.0), 2: (3.2, 4.0)}  # initialBackoff 2s, doubling, jitter 0.2 (down only)
    for attempt in (1, 2):
        need = decide_on(obj, now, settings=RETRY_3)
        assert isinstance(need, NeedRead), need
        assert need.step_index == 0
        obj, scheduled = expect(
            obj, now, RunEvent.RETRY_SCHEDULED, RunState.WAITING_RETRY, settings=RETRY_3, read=failed_read()
        )
        cp = checkpoint_of(scheduled)
        assert cp.retry.attempts == attempt
        retry_at = cp.retry.retry_at
        assert retry_at is not None
        assert retry_at == now + retry_backoff(policy.retry, attempt, UID)
        low, high = bounds[attempt]
        assert now + timedelta(seconds=low) <= retry_at <= now + timedelta(seconds=high)
        assert scheduled.status.retry_at == retry_at
        assert scheduled.status.waiting_for == f"retry:{retry_at.isoformat()}"
        assert cp.retry.last_failure == f"NotFound: {NOT_FOUND}"
        assert cp.position.step == 0
        assert (cp.evidence, cp.tool_calls) == ([], [])

        # Before the window ends: idle until retryAt.
        assert decide_on(obj, retry_at - timedelta(microseconds=1), settings=RETRY_3) == Idle(
            wake_at=retry_at, reason="retry window"
        )
        obj, due = expect(obj, retry_at, RunEvent.RETRY_DUE, RunState.RESUME_VALIDATION, settings=RETRY_3)
        assert checkpoint_of(due).retry.retry_at is None
        assert checkpoint_of(due).retry.attempts == attempt
        assert due.status.retry_at is None
        obj, _ = expect(obj, retry_at, RunEvent.REVALIDATED, RunState.READY, settings=RETRY_3)
        now = retry_at + timedelta(seconds=1)

    assert isinstance(decide_on(obj, now, settings=RETRY_3), NeedRead)
    obj, failed = expect(
        obj, now, RunEvent.ATTEMPT_FAILED, RunState.FAILED, settings=RETRY_3, read=failed_read()
    )
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "RetriesExhausted"
    assert failed.status.outcome.message == f"3 attempts failed; last: NotFound: {NOT_FOUND}"
    assert failed.status.retry_at is None
    assert decide_on(obj, now + timedelta(hours=1), settings=RETRY_3) == Idle(reason="run is failed")


def test_a_read_that_succeeds_on_retry_records_its_attempt() -> None:
    obj = walk(new_run(steps=[READ, DONE]), RunState.WAITING_RETRY, settings=RETRY_3)
    retry_at = cp_of(obj).retry.retry_at
    assert retry_at is not None
    obj, _ = expect(obj, retry_at, RunEvent.RETRY_DUE, RunState.RESUME_VALIDATION, settings=RETRY_3)
    obj, _ = expect(obj, retry_at, RunEvent.REVALIDATED, RunState.READY, settings=RETRY_3)
    read = ReadResult(0, evidence_for(0, "read-settings"))
    obj, completed = expect(
        obj, retry_at, RunEvent.STEP_COMPLETED, RunState.READY, settings=RETRY_3, read=read
    )
    (call,) = checkpoint_of(completed).tool_calls
    assert (call.outcome, call.attempt) == ("succeeded", 1)
    obj, _ = expect(obj, retry_at, RunEvent.SUCCEEDED, RunState.COMPLETED, settings=RETRY_3)


def test_each_step_gets_its_own_attempts() -> None:
    """maxAttempts bounds the attempts of one step: a failure of an earlier step that was retried
    successfully does not use up the retries of a later one (RETRY_DUE says "attempt N of step K")."""
    settings = settings_with(retry={"maxAttempts": 2, "initialBackoff": "1s"})
    second = {**READ, "name": "read-other"}
    obj = walk(new_run(steps=[READ, second, DONE]), RunState.WAITING_RETRY, settings=settings)
    retry_at = cp_of(obj).retry.retry_at
    assert retry_at is not None
    obj, _ = expect(obj, retry_at, RunEvent.RETRY_DUE, RunState.RESUME_VALIDATION, settings=settings)
    obj, _ = expect(obj, retry_at, RunEvent.REVALIDATED, RunState.READY, settings=settings)
    read = ReadResult(0, evidence_for(0, "read-settings"))
    obj, _ = expect(obj, retry_at, RunEvent.STEP_COMPLETED, RunState.READY, settings=settings, read=read)
    # The second read fails for the first time: it is retried, not failed as exhausted.
    obj, scheduled = advance(obj, retry_at, settings=settings, read=failed_read(1))
    assert (scheduled.event, scheduled.state) == (RunEvent.RETRY_SCHEDULED, RunState.WAITING_RETRY), (
        scheduled.status.outcome
    )


@pytest.mark.parametrize("settings", [Settings(), settings_with()], ids=["no-policy", "default-retry"])
def test_without_a_retry_policy_a_failed_read_fails_the_run_with_its_reason(settings: Settings) -> None:
    obj = walk(new_run(steps=[READ, DONE]), RunState.READY, settings=settings)
    obj, failed = expect(
        obj, at(1), RunEvent.ATTEMPT_FAILED, RunState.FAILED, settings=settings, read=failed_read()
    )
    assert failed.status.outcome is not None
    assert (failed.status.outcome.reason, failed.status.outcome.message) == ("NotFound", NOT_FOUND)
    assert checkpoint_of(failed).retry.attempts == 0
    assert failed.status.retry_at is None


def test_retry_backoff_doubles_then_caps_without_jitter() -> None:
    policy = RetryPolicy.model_validate({"initialBackoff": "1s", "maxBackoff": "5s", "jitter": 0})
    assert [retry_backoff(policy, n, UID).total_seconds() for n in range(1, 7)] == [1, 2, 4, 5, 5, 5]


def test_retry_backoff_is_deterministic_per_run_and_attempt_and_jitters_down_only() -> None:
    policy = RetryPolicy.model_validate({"initialBackoff": "2s", "maxBackoff": "1m", "jitter": 0.5})
    for attempt in range(1, 12):
        capped = min(2.0 * 2 ** (attempt - 1), 60.0)
        value = retry_backoff(policy, attempt, UID)
        assert value == retry_backoff(policy, attempt, UID), "a recomputation agrees"
        assert capped * 0.5 <= value.total_seconds() <= capped
    others = [retry_backoff(policy, n, "another-run-uid") for n in range(1, 12)]
    assert others != [retry_backoff(policy, n, UID) for n in range(1, 12)], "runs do not retry in lockstep"


# --- an effect that definitely failed: a retry is a new action -----------------------------------


def test_a_failed_effect_is_retried_as_a_new_action_with_its_own_key() -> None:
    settings = settings_with(retry={"maxAttempts": 2, "initialBackoff": "1s"})
    obj, first = waiting_on_action(settings, [effect("pay"), DONE])
    assert first.idempotency_key == idempotency_key(UID, 0, "pay") == f"{UID}/0/pay"
    first_name = action_record_name(first.idempotency_key)

    failed = {first_name: ActionObservation(ActionState.FAILED, reason="Upstream500", message="bad gateway")}
    obj, received = expect(
        obj, at(2), RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION, settings=settings, actions=failed
    )
    cp = checkpoint_of(received)
    assert cp.position.step == 0
    assert [(c.outcome, c.attempt) for c in cp.tool_calls] == [("failed", 0)]
    obj, scheduled = expect(obj, at(3), RunEvent.RETRY_SCHEDULED, RunState.WAITING_RETRY, settings=settings)
    retry = checkpoint_of(scheduled).retry
    assert retry.attempts == 1
    assert retry.last_failure is not None
    assert retry.last_failure.startswith("ActionFailed: http.post: Upstream500")
    assert retry.retry_at is not None

    obj, _ = expect(obj, retry.retry_at, RunEvent.RETRY_DUE, RunState.RESUME_VALIDATION, settings=settings)
    obj, _ = expect(obj, retry.retry_at, RunEvent.REVALIDATED, RunState.READY, settings=settings)
    obj, again = expect(
        obj, retry.retry_at, RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL, settings=settings
    )
    (second,) = again.intents
    assert second.idempotency_key == f"{UID}/0/pay/attempt-1"
    second_name = action_record_name(second.idempotency_key)
    assert second_name != first_name
    assert [p.action_record_name for p in checkpoint_of(again).pending_actions] == [second_name]
    assert again.status.waiting_for == f"action:{second_name}"
    assert decide_on(obj, at(10), settings=settings) == NeedActions({second_name: second}, cancel=False)

    failed = {second_name: ActionObservation(ActionState.FAILED, reason="Upstream500")}
    obj, _ = expect(
        obj, at(11), RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION, settings=settings, actions=failed
    )
    obj, exhausted = expect(obj, at(12), RunEvent.ATTEMPT_FAILED, RunState.FAILED, settings=settings)
    assert exhausted.status.outcome is not None
    assert exhausted.status.outcome.reason == "RetriesExhausted"


def test_a_failed_effect_without_retry_fails_the_run() -> None:
    obj, spec = waiting_on_action(EFFECTS, [effect("pay"), DONE])
    failed = {
        action_record_name(spec.idempotency_key): ActionObservation(ActionState.FAILED, reason="Upstream500")
    }
    obj, _ = expect(
        obj, at(2), RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION, settings=EFFECTS, actions=failed
    )
    obj, done = expect(obj, at(3), RunEvent.ATTEMPT_FAILED, RunState.FAILED, settings=EFFECTS)
    assert done.status.outcome is not None
    assert done.status.outcome.reason == "ActionFailed"
