"""The ledger's pure rules and the effect plugin registry (no cluster)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import ActionRecordStatus, ActionState, ActionTier
from durable_agents.core import ledger
from durable_agents.shell import effects as effects_module
from durable_agents.shell.effects import Action, Applied, EffectContext, NotApplied, load_effects

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
        (A.INTENT, A.SUCCEEDED),
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


def test_query_backoff_grows_and_is_capped() -> None:
    waits = [ledger.query_backoff(n).total_seconds() for n in range(12)]
    assert waits == sorted(waits)
    assert waits[0] == 1
    assert waits[-1] == 60


class _Ticket:
    name = "ticket.open"
    tier = ActionTier.REVERSIBLE
    reversible = True
    compensation: str | None = "ticket.close"

    async def dispatch(self, ctx: EffectContext, action: Action) -> Applied:
        return Applied({"ticket": action.key})

    async def query(self, ctx: EffectContext, action: Action) -> NotApplied:
        return NotApplied()


class _EntryPoint:
    def __init__(self, name: str, factory: Any) -> None:
        self.name = name
        self._factory = factory

    def load(self) -> Any:
        return self._factory


def test_third_party_effects_register_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_entry_points(*, group: str) -> list[_EntryPoint]:
        assert group == "durable_agents.effects"
        return [_EntryPoint("ticket.open", _Ticket), _EntryPoint("http.post", _Ticket)]

    monkeypatch.setattr(effects_module, "entry_points", fake_entry_points)
    loaded = load_effects()
    assert isinstance(loaded["ticket.open"], _Ticket)
    assert loaded["ticket.open"].tier is ActionTier.REVERSIBLE
    # A plugin cannot replace a built-in effect.
    assert type(loaded["http.post"]).__name__ == "HttpPost"
    assert loaded["kubernetes.apply"].reversible
