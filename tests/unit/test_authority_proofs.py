"""Stamps on requests: what each covers, and that a change to any covered field, another run,
another purpose or another key makes it fail (durable_agents.core.authority)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import (
    AgentRunSpec,
    ApprovalDecision,
    CancelRequest,
    CancelScope,
    ControlRequest,
    Identity,
)
from durable_agents.core.authority import (
    CREATION_SKEW,
    STAMP_NOT_OF_THIS_OBJECT,
    STAMP_UNTIMED,
    cancellation_unproven,
    creation_unbound,
    decision_proof,
    decision_unproven,
    instant,
    retry_unproven,
    service_account_unproven,
    stamp_cancellation,
    stamp_creator,
    stamp_decision,
    stamp_retry,
)
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp

pytestmark = pytest.mark.unit

KEYS = Keyring(keys={"k1": bytes(range(32))}, active_key_id="k1")
ROTATED = Keyring(keys={"k1": bytes(range(32)), "k2": bytes(range(1, 33))}, active_key_id="k2")
RETIRED = Keyring(keys={"k2": bytes(range(1, 33))}, active_key_id="k2")
ALICE = Identity(username="alice", groups=["approvers", "system:authenticated"], uid="u-1")
WHEN = datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
DIGEST = "sha256:" + "a" * 64


def wire_round_trip(model: Any) -> Any:
    """What the engine reads back: the JSON the API server stored, parsed again."""
    return type(model).model_validate(json.loads(json.dumps(model.wire())))


def stamped_decision(**changes: Any) -> ApprovalDecision:
    decision = ApprovalDecision(
        digest=DIGEST, decision="approve", reason="ok", approver=ALICE, decided_at=WHEN
    )
    signed = decision.model_copy(update={"stamp": stamp_decision(KEYS, "run-1", "pay-1", decision)})
    return signed.model_copy(update=changes)


def test_a_stamped_decision_verifies_after_the_api_server_stored_it() -> None:
    assert decision_unproven(KEYS, "run-1", "pay-1", wire_round_trip(stamped_decision())) is None


def test_times_are_stamped_in_one_form_whatever_their_zone() -> None:
    assert instant(WHEN) == "2030-01-01T12:00:00.123456Z"
    assert instant(WHEN.astimezone(timezone(timedelta(hours=2)))) == instant(WHEN)


@pytest.mark.parametrize(
    "changes",
    [
        {"decision": "reject"},
        {"digest": "sha256:" + "b" * 64},
        {"reason": "changed"},
        {"approver": Identity(username="mallory")},
        {"approver": ALICE.model_copy(update={"groups": ["system:masters"]})},
        {"decided_at": WHEN + timedelta(microseconds=1)},
    ],
    ids=["decision", "digest", "reason", "approver", "groups", "time"],
)
def test_every_covered_field_of_a_decision_is_bound(changes: dict[str, Any]) -> None:
    problem = decision_unproven(KEYS, "run-1", "pay-1", stamped_decision(**changes))
    assert problem is not None
    assert problem.reason == "StampInvalid"


def test_a_decision_stamp_is_bound_to_its_run_and_request() -> None:
    decision = stamped_decision()
    assert decision_unproven(KEYS, "run-2", "pay-1", decision) is not None
    assert decision_unproven(KEYS, "run-1", "pay-2", decision) is not None


def test_a_stamp_for_another_purpose_never_verifies() -> None:
    decision = stamped_decision()
    proof = decision_proof("run-1", "pay-1", decision)
    assert proof is not None
    as_control = decision.model_copy(update={"stamp": stamp(KEYS, Purpose.CONTROL, proof)})
    assert decision_unproven(KEYS, "run-1", "pay-1", as_control) is not None


def test_unstamped_forged_and_unknown_keys_say_which() -> None:
    unstamped = decision_unproven(KEYS, "run-1", "pay-1", stamped_decision(stamp=None))
    assert unstamped is not None
    assert unstamped.reason == "Unstamped"
    no_approver = decision_unproven(KEYS, "run-1", "pay-1", stamped_decision(approver=None))
    assert no_approver is not None
    assert no_approver.reason == "Unstamped"
    forged = decision_unproven(KEYS, "run-1", "pay-1", stamped_decision(stamp="k1:" + "A" * 43 + "="))
    assert forged is not None
    assert forged.reason == "StampInvalid"
    retired = decision_unproven(RETIRED, "run-1", "pay-1", stamped_decision())
    assert retired is not None
    assert "'k1', which is not in this operator's keyring" in retired.message


def test_stamps_survive_a_key_rotation_while_the_old_key_is_kept() -> None:
    assert decision_unproven(ROTATED, "run-1", "pay-1", stamped_decision()) is None


def test_without_a_keyring_nothing_is_verified() -> None:
    assert decision_unproven(None, "run-1", "pay-1", stamped_decision(stamp=None)) is None


def test_cancellations_and_retries_bind_what_was_asked() -> None:
    request = CancelRequest(
        scope=CancelScope.TURN, reason="wrong ticket", requested_by=ALICE, requested_at=WHEN
    )
    signed = request.model_copy(update={"stamp": stamp_cancellation(KEYS, "run-1", "c1", request)})
    assert cancellation_unproven(KEYS, "run-1", "c1", wire_round_trip(signed)) is None
    for changes in ({"scope": CancelScope.TASK}, {"reason": ""}, {"requested_by": Identity(username="bob")}):
        assert cancellation_unproven(KEYS, "run-1", "c1", signed.model_copy(update=changes)) is not None
    assert cancellation_unproven(KEYS, "run-1", "c2", signed) is not None

    asked = ControlRequest(requested_by=ALICE, requested_at=WHEN)
    retry = asked.model_copy(update={"stamp": stamp_retry(KEYS, "run-1", "t1", asked)})
    assert retry_unproven(KEYS, "run-1", "t1", wire_round_trip(retry)) is None
    assert retry_unproven(KEYS, "run-1", "t2", retry) is not None
    assert retry_unproven(KEYS, "run-1", "t1", None) is not None


def spec(**fields: Any) -> AgentRunSpec:
    return AgentRunSpec.model_validate({"taskType": "t", "objective": "o", **fields})


def test_a_creator_stamp_binds_namespace_run_service_account_and_creator() -> None:
    created = stamp_creator(KEYS, "team-a", "run-1", "deployer", ALICE, WHEN)
    good = spec(serviceAccountName="deployer", createdBy=created)
    # creationTimestamp has whole seconds, rounded down: 12:00:00 for a stamp at 12:00:00.123456.
    made = WHEN.replace(microsecond=0)
    assert service_account_unproven(KEYS, "team-a", "run-1", good, made) is None
    assert service_account_unproven(KEYS, "team-b", "run-1", good, made) is not None
    assert service_account_unproven(KEYS, "team-a", "run-2", good, made) is not None
    other_sa = spec(serviceAccountName="default", createdBy=created)
    problem = service_account_unproven(KEYS, "team-a", "run-1", other_sa, made)
    assert problem is not None
    assert "ServiceAccount 'default'" in problem.message
    other_creator = spec(serviceAccountName="deployer", createdBy={**created, "username": "bob"})
    assert service_account_unproven(KEYS, "team-a", "run-1", other_creator, made) is not None
    nobody = service_account_unproven(KEYS, "team-a", "run-1", spec(), made)
    assert nobody is not None
    assert nobody.reason == "Unstamped"


def test_a_creator_stamp_binds_the_time_of_the_object_s_creation() -> None:
    """A run deleted and created again under its name, its ``createdBy`` copied (the webhook off):
    the API server's creationTimestamp of the new object is not the stamp's time."""
    created = stamp_creator(KEYS, "team-a", "run-1", "deployer", ALICE, WHEN)
    assert created["stampedAt"] == "2030-01-01T12:00:00.123456Z"
    good = spec(serviceAccountName="deployer", createdBy=created)
    later = service_account_unproven(KEYS, "team-a", "run-1", good, WHEN + timedelta(minutes=3))
    assert later is not None
    assert later.reason == STAMP_NOT_OF_THIS_OBJECT
    assert "stamped at 2030-01-01T12:00:00.123456Z" in later.message
    assert "created at 2030-01-01T12:03:00.123456Z" in later.message
    assert "ServiceAccount 'deployer'" in later.message
    # Its time moved to the new object's creation: the stamp does not verify any more.
    moved = spec(serviceAccountName="deployer", createdBy={**created, "stampedAt": "2030-01-01T12:03:00Z"})
    problem = service_account_unproven(KEYS, "team-a", "run-1", moved, WHEN + timedelta(minutes=3))
    assert problem is not None
    assert problem.reason == "StampInvalid"
    # The untimed form of an earlier release (its stamp without stampedAt) is not acted on.
    untimed_proof = {"namespace": "team-a", "name": "run-1", "serviceAccountName": "deployer"}
    untimed = {
        **ALICE.wire(),
        "stamp": stamp(KEYS, Purpose.SERVICE_ACCOUNT, {**untimed_proof, "creator": ALICE.wire()}),
    }
    old = service_account_unproven(
        KEYS, "team-a", "run-1", spec(serviceAccountName="deployer", createdBy=untimed), WHEN
    )
    assert old is not None
    assert old.reason == STAMP_UNTIMED
    # ... unless the run was created before this operator started (it waited across the upgrade).
    waited = spec(serviceAccountName="deployer", createdBy=untimed)
    assert (
        service_account_unproven(KEYS, "team-a", "run-1", waited, WHEN, WHEN + timedelta(seconds=1)) is None
    )
    since = service_account_unproven(KEYS, "team-a", "run-1", waited, WHEN, WHEN)
    assert since is not None
    assert since.reason == STAMP_UNTIMED, "created since this operator started: maybe a copy"
    forged = {**ALICE.wire(), "stamp": "k1:" + "A" * 43 + "="}
    problem = service_account_unproven(
        KEYS, "team-a", "run-1", spec(serviceAccountName="deployer", createdBy=forged), WHEN
    )
    assert problem is not None
    assert problem.reason == "StampInvalid", "a forged stamp is not called untimed"
    # Without a keyring nothing is verified (pure tests and tools), the time included.
    assert service_account_unproven(None, "team-a", "run-1", good, WHEN + timedelta(days=1)) is None


@pytest.mark.parametrize(
    ("stamped", "created", "bound"),
    [
        (WHEN, WHEN.replace(microsecond=0), True),  # the same request; creationTimestamp rounded down
        (WHEN, WHEN.replace(microsecond=0) + timedelta(seconds=1), True),  # it took the request 1 s
        (WHEN, WHEN - CREATION_SKEW, True),  # the operator's clock ahead of the API server's
        (WHEN, WHEN + CREATION_SKEW, True),  # ... or behind it
        (WHEN, WHEN - CREATION_SKEW - timedelta(microseconds=1), False),
        (WHEN, WHEN + CREATION_SKEW + timedelta(microseconds=1), False),
        (WHEN, WHEN + timedelta(hours=1), False),  # re-created an hour later, createdBy copied
        (WHEN, WHEN - timedelta(hours=1), False),
        (WHEN, WHEN.astimezone(timezone(timedelta(hours=2))), True),  # the same instant, written otherwise
        (None, WHEN, False),  # no time: an untimed stamp of an earlier release
        (WHEN, None, False),  # no creationTimestamp (never from an API server)
    ],
)
def test_the_creation_binding_rule(stamped: datetime | None, created: datetime | None, bound: bool) -> None:
    problem = creation_unbound(stamped, created)
    assert (problem is None) is bound, problem
    if stamped is None:
        assert problem is not None
        assert problem.reason == STAMP_UNTIMED
    elif not bound:
        assert problem is not None
        assert problem.reason == STAMP_NOT_OF_THIS_OBJECT
