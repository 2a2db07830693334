"""Waits for an answer or an event: expiry, wake-ups, and going back into a recorded wait."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.builders import (
    DONE,
    FUTURE_CHECKPOINT,
    T0,
    advance_untouched,
    apply,
    assert_well_formed,
    at,
    checkpoint_of,
    commit_of,
    condition_view,
    decide_on,
    drive,
    effect,
    expect,
    iso,
    new_run,
    patch_spec,
    reach,
    run_in,
    settings_with,
    step,
    waiting_on_action,
)

from durable_agents.api.v1alpha1 import ActionTier, WaitExpiries
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import Idle, NeedActions, Settings
from durable_agents.core.ledger import action_record_name
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit


# --- entering a wait -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "wait_expiries", "expected"),
    [
        ("ask", WaitExpiries(), timedelta(hours=24)),
        ("ask", WaitExpiries(input="5m"), timedelta(minutes=5)),
        ("await", WaitExpiries(), timedelta(hours=24)),
        ("await", WaitExpiries(external="7m30s"), timedelta(minutes=7, seconds=30)),
    ],
)
def test_a_wait_without_expires_in_uses_the_policy_expiry(
    kind: str, wait_expiries: WaitExpiries, expected: timedelta
) -> None:
    body = {"question": "q"} if kind == "ask" else {"event": "go"}
    settings = Settings(wait_expiries=wait_expiries)
    obj, _, idle = drive(new_run(steps=[{"name": "wait", kind: body}]), T0, settings=settings)
    assert idle.wake_at == T0 + expected
    cp = checkpoint_of(obj["status"]["checkpoint"])
    pending = cp.pending_input if kind == "ask" else cp.pending_external
    assert pending is not None
    assert pending.expires_at == T0 + expected


# --- expiry and deadline -------------------------------------------------------------------------

WAITS = {
    "ask": ({"question": "proceed?", "expiresIn": "10m"}, RunState.WAITING_INPUT, "InputExpired"),
    "await": (
        {"event": "window-open", "expiresIn": "10m"},
        RunState.WAITING_EXTERNAL,
        "ExternalEventExpired",
    ),
}


@pytest.mark.parametrize("kind", sorted(WAITS))
def test_an_unanswered_wait_is_idle_until_its_expiry_then_expires(kind: str) -> None:
    body, waiting_state, reason = WAITS[kind]
    obj, _, idle = drive(new_run(steps=[{"name": "confirm", kind: body}]), T0)
    expiry = T0 + timedelta(minutes=10)
    assert obj["status"]["state"] == waiting_state.value
    assert idle == Idle(wake_at=expiry, reason="waiting")
    assert step(obj, expiry - timedelta(microseconds=1)) == Idle(wake_at=expiry, reason="waiting")

    for now in (expiry, expiry + timedelta(days=3)):
        expired = commit_of(step(obj, now))
        assert_well_formed(obj, expired)
        assert (expired.event, expired.state) == (RunEvent.WAIT_EXPIRED, RunState.EXPIRED)
        assert expired.status.outcome is not None
        assert expired.status.outcome.reason == reason
        assert expiry.isoformat() in expired.status.outcome.message
        assert expired.status.waiting_for is None
        assert condition_view(expired.status) == {
            "Waiting": ("False", "Expired"),
            "Succeeded": ("False", reason),
            "Finished": ("True", "Expired"),
            "Quarantined": ("False", "Expired"),
            "Reconciling": ("False", "Expired"),
            "Ready": ("False", reason),
            "Stalled": ("True", reason),
        }
    assert step(apply(obj, expired), expiry) == Idle(wake_at=None, reason="run is expired")


@pytest.mark.parametrize("kind", sorted(WAITS))
def test_an_answer_present_at_the_expiry_still_wins(kind: str) -> None:
    body, _, _ = WAITS[kind]
    obj, _, _ = drive(new_run(steps=[{"name": "confirm", kind: body}]), T0)
    obj = patch_spec(
        obj, **({"answers": {"confirm": "y"}} if kind == "ask" else {"events": {"window-open": "y"}})
    )
    late = commit_of(step(obj, T0 + timedelta(hours=5)))
    assert late.event in (RunEvent.INPUT_RECEIVED, RunEvent.EXTERNAL_RECEIVED)


@pytest.mark.parametrize("kind", sorted(WAITS))
@pytest.mark.parametrize(
    ("deadline_after", "wake_after"),
    [
        (timedelta(minutes=5), timedelta(minutes=5)),  # deadline first: wake at the deadline
        (timedelta(minutes=10), timedelta(minutes=10)),
        (timedelta(minutes=30), timedelta(minutes=10)),  # expiry first: wake at the expiry
    ],
)
def test_wake_at_is_the_earlier_of_expiry_and_deadline(
    kind: str, deadline_after: timedelta, wake_after: timedelta
) -> None:
    body, _, _ = WAITS[kind]
    obj = new_run(steps=[{"name": "confirm", kind: body}], deadline=iso(T0 + deadline_after))
    obj, _, idle = drive(obj, T0)
    assert idle == Idle(wake_at=T0 + wake_after, reason="waiting")


@pytest.mark.parametrize("kind", sorted(WAITS))
def test_waking_at_a_deadline_before_the_expiry_expires_the_run(kind: str) -> None:
    body, _, _ = WAITS[kind]
    deadline = T0 + timedelta(minutes=5)
    obj, _, idle = drive(new_run(steps=[{"name": "confirm", kind: body}], deadline=iso(deadline)), T0)
    assert idle.wake_at == deadline
    commit = commit_of(step(obj, deadline))
    assert_well_formed(obj, commit)
    assert (commit.event, commit.state) == (RunEvent.DEADLINE_EXCEEDED, RunState.EXPIRED)
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "DeadlineExceeded"
    assert condition_view(commit.status)["Succeeded"] == ("False", "DeadlineExceeded")


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (RunState.WAITING_INPUT, RunEvent.INPUT_RECEIVED),
        (RunState.WAITING_EXTERNAL, RunEvent.EXTERNAL_RECEIVED),
        (RunState.WAITING_APPROVAL, RunEvent.APPROVAL_DECIDED),
    ],
)
def test_a_wait_with_nothing_recorded_is_left(state: RunState, event: RunEvent) -> None:
    obj = run_in(state)
    commit = commit_of(step(obj, at(1)))
    assert_well_formed(obj, commit)
    assert (commit.event, commit.state) == (event, RunState.RESUME_VALIDATION)


# --- released from quarantine: back into the wait the checkpoint records -------------------------


def _released_from(obj: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Quarantine ``obj`` as a v1-only operator would (checkpoint untouched), then retry it here."""
    readable = copy.deepcopy(obj["status"]["checkpoint"])
    obj["status"]["checkpoint"] = copy.deepcopy(FUTURE_CHECKPOINT)
    obj, _ = advance_untouched(obj, at(5))
    obj["status"]["checkpoint"] = readable
    obj = patch_spec(obj, retryQuarantine="after-upgrade")
    obj, _ = expect(obj, at(6), RunEvent.RELEASE_QUARANTINE, RunState.RESUME_VALIDATION, settings=settings)
    return obj


def test_a_run_released_mid_action_goes_back_to_waiting_on_that_action() -> None:
    settings = settings_with(tier=ActionTier.REVERSIBLE)
    obj, spec = waiting_on_action(settings, [effect("pay"), DONE])
    obj = _released_from(obj, settings)
    obj, back = expect(obj, at(7), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL, settings=settings)
    assert back.intents == (), "no second intent for the same step"
    assert back.status.waiting_for == f"action:{action_record_name(spec.idempotency_key)}"
    assert [p.idempotency_key for p in checkpoint_of(back).pending_actions] == [spec.idempotency_key]
    need = decide_on(obj, at(8), settings=settings)
    assert isinstance(need, NeedActions)


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (RunState.WAITING_INPUT, RunEvent.INPUT_REQUESTED),
        (RunState.WAITING_EXTERNAL, RunEvent.EXTERNAL_AWAITED),
        (RunState.WAITING_RETRY, RunEvent.RETRY_SCHEDULED),
    ],
)
def test_a_run_released_mid_wait_goes_back_to_that_wait(state: RunState, event: RunEvent) -> None:
    obj, settings = reach(state)
    before = checkpoint_of(obj["status"]["checkpoint"])
    obj = _released_from(obj, settings)
    obj, back = expect(obj, at(7), event, state, settings=settings)
    after = checkpoint_of(back)
    assert (after.pending_input, after.pending_external, after.retry.retry_at) == (
        before.pending_input,
        before.pending_external,
        before.retry.retry_at,
    ), "the wait is the one recorded, expiry and all"
