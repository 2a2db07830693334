"""Tasks as ledger handles, the pure rules (issue 36, item 2): a record with a task is polled, never
claimed or sent again, whoever's claim it was; polls back off from the server's interval; a new
attempt drops an earlier attempt's task; a task ID someone else wrote is not believed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.unit.builders import KEYRING
from tests.unit.test_outcome_stamps import record, written

from durable_agents.api.v1alpha1 import ActionRecordStatus, ActionState, ActionTask, FirstClaim
from durable_agents.core import ledger
from durable_agents.core.outcome_stamps import INTEGRITY_FAILED, believed

A = ActionState
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
TASK = ActionTask(id="t-1", server="http://127.0.0.1:1/mcp", status="working", created_at=NOW)


def with_task(state: ActionState, **task: Any) -> ActionRecordStatus:
    return ActionRecordStatus(state=state, attempts=1, task=TASK.model_copy(update=task))


@pytest.mark.parametrize("state", [A.INTENT, A.DISPATCHING])
def test_a_record_with_a_task_is_polled_never_claimed_or_given_up(state: ActionState) -> None:
    first = FirstClaim(holder="someone-else", expires_at=NOW - timedelta(hours=1))  # long expired
    step = ledger.next_dispatch_step(with_task(state), NOW + timedelta(hours=2), first, "me")
    assert step == ledger.PollTask(NOW), "the first poll comes when the task was recorded"
    polled = with_task(state, polls=1, polled_at=NOW + timedelta(seconds=3), poll_interval_ms=2000)
    step = ledger.next_dispatch_step(polled, NOW, first, "me")
    assert step == ledger.PollTask(NOW + timedelta(seconds=5))


@pytest.mark.parametrize("state", [A.SUCCEEDED, A.FAILED, A.OUTCOME_UNKNOWN])
def test_a_settled_or_unknown_record_keeps_its_task_for_history_and_is_not_polled(state: ActionState) -> None:
    step = ledger.next_dispatch_step(with_task(state), NOW)
    assert not isinstance(step, ledger.PollTask)


def test_polls_back_off_from_the_servers_interval_to_a_bound() -> None:
    assert ledger.task_poll_delay(0, None) == timedelta(seconds=ledger.TASK_POLL_MIN)
    assert ledger.task_poll_delay(0, 50) == timedelta(seconds=1), "never more often than a second"
    assert ledger.task_poll_delay(0, 4000) == timedelta(seconds=4)
    delays = [ledger.task_poll_delay(polls, 1000) for polls in range(0, 60, 5)]
    assert delays == sorted(delays), "never shorter with more polls"
    assert delays[-1] == timedelta(seconds=ledger.TASK_POLL_MAX)
    assert ledger.task_poll_delay(10_000, 10**9) == timedelta(seconds=ledger.TASK_POLL_MAX)


def test_a_new_attempt_drops_the_earlier_attempts_task() -> None:
    unknown = with_task(A.OUTCOME_UNKNOWN)
    claimed = ledger.next_status(unknown, A.DISPATCHING, NOW, "me", timedelta(seconds=11), claim=True)
    assert claimed.task is None
    settled = ledger.next_status(with_task(A.DISPATCHING), A.SUCCEEDED, NOW, "me", timedelta(seconds=11))
    assert settled.task == TASK, "the task stays with the outcome, for people"


def test_a_stamped_task_is_believed_and_a_written_over_one_is_not() -> None:
    status = with_task(A.DISPATCHING)
    assert believed(record(written(status)), KEYRING, NOW).forged is None
    swapped = {**written(status), "task": {**status.wire()["task"], "id": "someone-elses"}}
    belief = believed(record(swapped), KEYRING, NOW)
    assert (belief.status.state, belief.status.reason) == (A.OUTCOME_UNKNOWN, INTEGRITY_FAILED)
    assert belief.status.task is None


def test_an_intent_carrying_a_task_needs_a_stamp() -> None:
    forged = with_task(A.INTENT).wire()
    belief = believed(record(forged), KEYRING, NOW)
    assert (belief.status.state, belief.status.reason) == (A.OUTCOME_UNKNOWN, INTEGRITY_FAILED)
    assert believed(record(written(with_task(A.INTENT))), KEYRING, NOW).forged is None


def test_a_status_without_a_task_is_stamped_as_before() -> None:
    """Records written before tasks existed keep verifying (the stamp's payload is unchanged)."""
    from durable_agents.core.outcome_stamps import outcome_payload

    assert "task" not in outcome_payload("n", "k", ActionRecordStatus(state=A.SUCCEEDED))
