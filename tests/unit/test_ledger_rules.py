"""The ledger's pure rules and the effect plugin registry (no cluster)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durable_agents.api.v1alpha1 import ActionRecordStatus, ActionState, FirstClaim
from durable_agents.core import ledger

A = ActionState
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_keys_are_stable_and_names_are_dns_labels() -> None:
    key = ledger.idempotency_key("uid-1", 3, "pay")
    assert key == ledger.idempotency_key("uid-1", 3, "pay")
    assert key != ledger.idempotency_key("uid-1", 4, "pay")
    name = ledger.action_record_name(key)
    assert name == ledger.action_record_name(key)
    assert name.startswith("act-")
    assert len(name) <= 63
    assert name.replace("-", "").isalnum()


@pytest.mark.parametrize(
    ("state", "target"),
    [
        (A.OUTCOME_UNKNOWN, A.FAILED),
        (A.FAILED, A.DISPATCHING),
        (A.SUCCEEDED, A.DISPATCHING),
        (A.DISPATCHING, A.INTENT),
    ],
)
def test_illegal_action_transitions_raise(state: ActionState, target: ActionState) -> None:
    with pytest.raises(ledger.IllegalActionTransition):
        ledger.check_action_transition(state, target)


def test_timeout_never_means_failure_in_the_table() -> None:
    # From an unknown outcome the only ways out are "it happened" or a new dispatch.
    assert ledger.ACTION_TRANSITIONS[A.OUTCOME_UNKNOWN] == {A.SUCCEEDED, A.DISPATCHING}
    assert {A.SUCCEEDED, A.FAILED, A.CANCELED} == ledger.TERMINAL_ACTION_STATES


def test_next_dispatch_step() -> None:
    assert isinstance(ledger.next_dispatch_step(ActionRecordStatus(), NOW), ledger.Claim)
    live = ActionRecordStatus(state=A.DISPATCHING, claim_expires_at=NOW + timedelta(seconds=5))
    assert ledger.next_dispatch_step(live, NOW) == ledger.WaitUntil(NOW + timedelta(seconds=5))
    expired = ActionRecordStatus(state=A.DISPATCHING, claim_expires_at=NOW - timedelta(seconds=1))
    assert isinstance(ledger.next_dispatch_step(expired, NOW), ledger.GiveUpClaim)
    assert isinstance(
        ledger.next_dispatch_step(ActionRecordStatus(state=A.OUTCOME_UNKNOWN), NOW), ledger.Query
    )
    assert ledger.next_dispatch_step(ActionRecordStatus(state=A.SUCCEEDED), NOW) == ledger.WaitUntil(None)


def test_an_intent_under_a_first_claim_is_its_holders_to_send_until_it_expires() -> None:
    first = FirstClaim(holder="op-a", expires_at=NOW + timedelta(seconds=3))
    intent = ActionRecordStatus()
    assert isinstance(ledger.next_dispatch_step(intent, NOW, first, "op-a"), ledger.SendFirst)
    # Anyone else waits for its expiry: only the holder may send without a claim write.
    assert ledger.next_dispatch_step(intent, NOW, first, "op-b") == ledger.WaitUntil(first.expires_at)
    assert ledger.next_dispatch_step(intent, NOW, first) == ledger.WaitUntil(first.expires_at)
    # Expired unanswered: it may have been sent, so it is given up to outcome_unknown (and queried),
    # never claimed and sent again blindly, not even by its holder.
    later = first.expires_at
    for me in ("op-a", "op-b", None):
        assert isinstance(ledger.next_dispatch_step(intent, later, first, me), ledger.GiveUpClaim)
    # Answered: the first claim no longer matters.
    done = ActionRecordStatus(state=A.SUCCEEDED)
    assert ledger.next_dispatch_step(done, NOW, first, "op-a") == ledger.WaitUntil(None)
    # The table lets the holder's answer (or the give-up) follow the intent directly.
    for target in (A.SUCCEEDED, A.FAILED, A.OUTCOME_UNKNOWN):
        ledger.check_action_transition(A.INTENT, target)


def test_query_backoff_grows_and_is_capped() -> None:
    waits = [ledger.query_backoff(n).total_seconds() for n in range(12)]
    assert waits == sorted(waits)
    assert waits[0] == 1
    assert waits[-1] == 60
