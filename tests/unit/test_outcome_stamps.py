"""The outcome stamp's rule: which ActionRecord status is believed (core/outcome_stamps.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.unit.builders import KEYRING

from durable_agents.api.v1alpha1 import ActionRecordStatus, ActionState
from durable_agents.core.ledger import next_status
from durable_agents.core.outcome_stamps import (
    DEFAULT_CLAIM_TTL,
    INTEGRITY_FAILED,
    believed,
    stamp_outcome,
)
from durable_agents.core.retention import blockers
from durable_agents.core.sealing import Keyring

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
NAME, KEY = "act-0123", "run-uid/0/pay"


def record(status: dict[str, Any] | None, *, marked: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "idempotencyKey": KEY,
        "runRef": {"name": "r", "uid": "run-uid"},
        "stepIndex": 0,
        "effect": "http.post",
        "tier": "consequential",
    }
    if marked:
        spec["statusStamped"] = True
    out: dict[str, Any] = {"metadata": {"name": NAME, "namespace": "ns"}, "spec": spec}
    if status is not None:
        out["status"] = status
    return out


def written(status: ActionRecordStatus, keyring: Keyring = KEYRING) -> dict[str, Any]:
    """The status as the ActionStore writes it (stamped), then as the API server returns it."""
    return {**status.wire(), "stamp": stamp_outcome(keyring, NAME, KEY, status)}


SUCCEEDED = ActionRecordStatus(
    state=ActionState.SUCCEEDED, attempts=1, outcome={"status": 201, "receipt": "r-1"}, finished_at=NOW
)


def test_a_stamped_status_is_believed_as_written() -> None:
    belief = believed(record(written(SUCCEEDED)), KEYRING, NOW)
    assert belief.forged is None
    assert belief.status.state is ActionState.SUCCEEDED
    assert belief.status.outcome == {"status": 201, "receipt": "r-1"}


@pytest.mark.parametrize("state", ["succeeded", "failed", "canceled", "outcome_unknown"])
def test_an_unstamped_settled_or_unknown_state_is_believed_unknown(state: str) -> None:
    forged = {"state": state, "attempts": 0, "outcome": {"status": 201, "receipt": "made-up"}}
    belief = believed(record(forged), KEYRING, NOW)
    assert belief.status.state is ActionState.OUTCOME_UNKNOWN
    assert belief.status.reason == INTEGRITY_FAILED
    assert belief.status.outcome is None, "a forged outcome is never passed on"
    assert belief.forged is not None
    assert f"status {state!r}" in belief.forged
    assert "not written by the operator" in (belief.status.message or "")


@pytest.mark.parametrize(
    "change",
    [
        {"state": "failed"},
        {"outcome": {"status": 201, "receipt": "other"}},
        {"attempts": 2},
        {"reason": "AlreadyApplied"},
    ],
)
def test_a_stamped_status_changed_in_any_covered_field_is_not_believed(change: dict[str, Any]) -> None:
    forged = {**written(SUCCEEDED), **change}
    belief = believed(record(forged), KEYRING, NOW)
    assert belief.status.state is ActionState.OUTCOME_UNKNOWN
    assert belief.status.reason == INTEGRITY_FAILED


def test_a_stamp_of_another_record_or_keyring_does_not_verify() -> None:
    other = {**SUCCEEDED.wire(), "stamp": stamp_outcome(KEYRING, "act-other", KEY, SUCCEEDED)}
    assert believed(record(other), KEYRING, NOW).status.reason == INTEGRITY_FAILED
    stranger = Keyring(keys={"k2030": bytes(32)}, active_key_id="k2030")
    assert believed(record(written(SUCCEEDED, stranger)), KEYRING, NOW).status.reason == INTEGRITY_FAILED


@pytest.mark.parametrize("status", [None, {}, {"state": "intent", "attempts": 3}])
def test_an_intent_needs_no_stamp(status: dict[str, Any] | None) -> None:
    belief = believed(record(status), KEYRING, NOW)
    assert belief.forged is None
    assert belief.status.state is ActionState.INTENT


def test_an_unverified_claim_is_believed_within_one_claim_ttl_and_not_beyond() -> None:
    near = {"state": "dispatching", "attempts": 1, "claimExpiresAt": (NOW + DEFAULT_CLAIM_TTL).isoformat()}
    assert believed(record(near), KEYRING, NOW).status.state is ActionState.DISPATCHING
    far = {"state": "dispatching", "attempts": 1, "claimExpiresAt": (NOW + timedelta(days=3650)).isoformat()}
    belief = believed(record(far), KEYRING, NOW)
    assert belief.status.state is ActionState.OUTCOME_UNKNOWN
    assert belief.status.reason == INTEGRITY_FAILED
    assert belief.status.claim_expires_at is None
    stamped = next_status(
        ActionRecordStatus(), ActionState.DISPATCHING, NOW, "d-1", timedelta(days=3650), claim=True
    )
    assert believed(record(written(stamped)), KEYRING, NOW).status.state is ActionState.DISPATCHING


def test_records_from_before_outcome_stamps_are_believed_as_written() -> None:
    """No spec.statusStamped (created by an earlier release): its status is believed, as before."""
    legacy = {"state": "succeeded", "attempts": 1, "outcome": {"status": 201}}
    belief = believed(record(legacy, marked=False), KEYRING, NOW)
    assert belief.forged is None
    assert belief.status.state is ActionState.SUCCEEDED


def test_the_believed_unknown_is_reconciled_from_as_any_unknown_outcome() -> None:
    """The dispatcher writes from the believed status: unknown -> succeeded (applied) or
    dispatching (not applied, same key); both legal transitions of the ledger."""
    status = believed(record({"state": "failed", "reason": "Boom"}), KEYRING, NOW).status
    applied = next_status(status, ActionState.SUCCEEDED, NOW, "d", DEFAULT_CLAIM_TTL, outcome={"ok": True})
    assert applied.state is ActionState.SUCCEEDED
    assert applied.outcome == {"ok": True}
    again = next_status(status, ActionState.DISPATCHING, NOW, "d", DEFAULT_CLAIM_TTL, claim=True)
    assert again.state is ActionState.DISPATCHING
    assert again.attempts == status.attempts + 1


def test_retention_does_not_let_a_run_go_on_a_forged_settled_action() -> None:
    forged = record({"state": "succeeded", "attempts": 1})
    assert blockers([forged], (), KEYRING, NOW) == [f"action {NAME} is outcome_unknown"]
    assert blockers([record(written(SUCCEEDED))], (), KEYRING, NOW) == []
    assert blockers([forged], ()) == [], "without a keyring (tests of the rule alone): as written"
