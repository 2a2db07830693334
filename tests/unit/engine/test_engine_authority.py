"""The engine acts only on authority it can verify: a run's ServiceAccount, approval decisions,
cancellations and quarantine retries count only with the stamp of the operator's admission
webhook. Anything else is never acted on and never consumed: refused once, with a condition."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from tests.unit.builders import (
    CREATED,
    CREATOR,
    DONE,
    KEYRING,
    READ,
    SETTINGS,
    advance,
    apply,
    apply_status,
    ask,
    at,
    cancel,
    commit_of,
    condition_view,
    conditions,
    cp_of,
    decide_on,
    decision,
    effect,
    expect,
    iso,
    new_run,
    patch_spec,
    retry_request,
    settings_with,
    snap,
    walk,
)

from durable_agents.api.v1alpha1 import REFUSED_LIMIT, ActionTier, Identity
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.authority import stamp_creator
from durable_agents.core.checkpoint import FIRST_STAMPED_SCHEMA_VERSION, Fencing
from durable_agents.core.engine import Idle, NeedRead, Settings, fence
from durable_agents.core.engine.commits import REQUEST_REFUSED, Refusal
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit

KEYED = replace(SETTINGS, keyring=KEYRING)
APPROVALS = replace(settings_with(tier=ActionTier.CONSEQUENTIAL), keyring=KEYRING)
OTHER_KEYS = Keyring(keys={"k2030": bytes(range(1, 33))}, active_key_id="k2030")
FORGED = "k2030:" + "A" * 43 + "="


def untimed_stamp() -> str:
    """The ``createdBy`` stamp of a release before stamps carried their time (no ``stampedAt``)."""
    proof = {"namespace": "team-a", "name": "run-1", "serviceAccountName": "default"}
    return stamp(KEYRING, Purpose.SERVICE_ACCOUNT, {**proof, "creator": CREATOR.who().wire()})


def refusal_of(decision_: Any) -> Refusal:
    assert isinstance(decision_, Refusal), decision_
    return decision_


# --- the run's ServiceAccount ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("created_by", "reason"),
    [
        (None, "Unstamped"),
        ({"username": "alice", "groups": ["editors"]}, "Unstamped"),
        ({"username": "mallory", "stamp": FORGED}, "StampInvalid"),
        (
            stamp_creator(KEYRING, "team-a", "run-1", "deployer", CREATOR, CREATED),
            "StampInvalid",
        ),  # another SA
        (
            stamp_creator(KEYRING, "team-b", "run-1", "default", CREATOR, CREATED),
            "StampInvalid",
        ),  # another namespace
        (
            stamp_creator(KEYRING, "team-a", "run-2", "default", CREATOR, CREATED),
            "StampInvalid",
        ),  # another run
        (stamp_creator(OTHER_KEYS, "team-a", "run-1", "default", CREATOR, CREATED), "StampInvalid"),
        (
            {**stamp_creator(KEYRING, "team-a", "run-1", "default", CREATOR, CREATED), "username": "mallory"},
            "StampInvalid",
        ),
        # Copied from an earlier run of this name (re-created later): stamped a minute before.
        (
            stamp_creator(KEYRING, "team-a", "run-1", "default", CREATOR, CREATED - timedelta(minutes=1)),
            "StampNotOfThisObject",
        ),
        # ... and its time moved to the new creation: the stamp no longer verifies.
        (
            {
                **stamp_creator(
                    KEYRING, "team-a", "run-1", "default", CREATOR, CREATED - timedelta(minutes=1)
                ),
                "stampedAt": iso(CREATED),
            },
            "StampInvalid",
        ),
        # Stamped by a release before creation stamps carried their time.
        ({**CREATOR.wire(), "stamp": untimed_stamp()}, "StampUntimed"),
    ],
    ids=[
        "none",
        "identity-only",
        "forged",
        "other-sa",
        "other-ns",
        "other-run",
        "other-keys",
        "other-creator",
        "copied-from-an-earlier-object",
        "time-moved",
        "untimed",
    ],
)
def test_a_run_whose_service_account_is_not_proven_fails_at_acceptance(
    created_by: dict[str, Any] | None, reason: str
) -> None:
    obj = new_run(steps=[READ, DONE], createdBy=created_by)
    obj, rejected = expect(obj, at(0), RunEvent.REJECTED, RunState.FAILED, settings=KEYED)
    outcome = rejected.status.outcome
    assert outcome is not None
    assert outcome.reason == "ServiceAccountNotAuthorized"
    assert outcome.message.startswith(f"{reason}: ")
    assert "ServiceAccount 'default'" in outcome.message
    assert condition_view(rejected.status)["Succeeded"] == ("False", "ServiceAccountNotAuthorized")
    assert rejected.intents == ()
    assert rejected.children == ()
    # Nothing is ever read, done or started as that ServiceAccount.
    assert decide_on(obj, at(1), settings=KEYED) == Idle(reason="run is failed")


def test_a_proven_service_account_is_accepted_and_read_as() -> None:
    obj = new_run(steps=[READ, DONE], serviceAccountName="deployer")
    assert obj["spec"]["createdBy"]["stamp"]
    obj, _ = expect(obj, at(0), RunEvent.ACCEPTED, RunState.READY, settings=KEYED)
    assert isinstance(decide_on(obj, at(1), settings=KEYED), NeedRead)


def test_a_pending_run_fenced_before_acceptance_is_still_checked() -> None:
    """A takeover's fencing write gives a pending run its initial checkpoint: still not accepted."""
    obj = new_run(steps=[READ, DONE], createdBy=None)
    status = fence(snap(obj), Fencing(holder="worker-b", lease_transitions=4), now=at(0), settings=KEYED)
    assert status is not None
    obj = apply_status(obj, status)
    rejected = commit_of(decide_on(obj, at(1), settings=KEYED))
    assert (rejected.event, rejected.state) == (RunEvent.REJECTED, RunState.FAILED)


def test_a_status_without_a_checkpoint_never_runs_as_an_unproven_service_account() -> None:
    """No checkpoint, yet not pending: the operator did not write that status. Quarantined."""
    obj = new_run(steps=[READ, DONE], createdBy=None)
    obj["status"] = {"state": "ready", "stateVersion": 1}
    commit = commit_of(decide_on(obj, at(1), settings=KEYED))
    assert (commit.event, commit.state) == (RunEvent.QUARANTINE, RunState.QUARANTINED)
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "ServiceAccountNotAuthorized"
    assert commit.checkpoint is None


def test_a_run_an_earlier_operator_accepted_goes_on_without_a_stamp() -> None:
    """Runs created before stamps: their checkpoint says an operator accepted them.

    See "Runs created before stamps" in docs/security/authority.md.
    """
    legacy = walk(new_run(steps=[ask("confirm"), READ, DONE]), RunState.WAITING_INPUT, settings=KEYED)
    del legacy["spec"]["createdBy"]  # as runs created before createdBy was stamped
    legacy = patch_spec(legacy, answers={"confirm": "yes"})
    legacy, _ = expect(legacy, at(1), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION, settings=KEYED)
    legacy, _ = expect(legacy, at(2), RunEvent.REVALIDATED, RunState.READY, settings=KEYED)
    assert isinstance(decide_on(legacy, at(3), settings=KEYED), NeedRead)


def test_without_a_keyring_nothing_is_verified() -> None:
    """Pure tests and tools only: the operator does not start without its keys."""
    expect(new_run(steps=[DONE], createdBy=None), at(0), RunEvent.ACCEPTED, RunState.READY, settings=SETTINGS)


# --- approval decisions ------------------------------------------------------------------------


def waiting_approval() -> tuple[dict[str, Any], dict[str, Any]]:
    obj = walk(new_run(steps=[effect("pay"), DONE]), RunState.WAITING_APPROVAL, settings=APPROVALS)
    return obj, obj["status"]["approvalRequest"]


def test_the_approval_request_shows_the_service_account_and_its_digest_covers_it() -> None:
    _, request = waiting_approval()
    assert request["serviceAccount"] == "default"
    other = walk(
        new_run(steps=[effect("pay"), DONE], serviceAccountName="deployer"),
        RunState.WAITING_APPROVAL,
        settings=APPROVALS,
    )
    assert other["status"]["approvalRequest"]["serviceAccount"] == "deployer"
    assert other["status"]["approvalRequest"]["digest"] != request["digest"]


def _hand_written(request: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A decision an admin writes with the webhook off: approver and time by hand."""
    return {
        "digest": request["digest"],
        "decision": "approve",
        "approver": {"username": "alice"},
        "decidedAt": "2030-01-01T12:00:00.000000Z",
        **extra,
    }


@pytest.mark.parametrize(
    ("written", "reason"),
    [
        (lambda obj, request: _hand_written(request), "Unstamped"),
        (lambda obj, request: _hand_written(request, stamp=FORGED), "StampInvalid"),
        (  # a real stamp, for another run
            lambda obj, request: decision(
                {**obj, "status": {"runId": "another-run"}}, "pay-1", request["digest"]
            ),
            "StampInvalid",
        ),
        (  # a real stamp, then the decision changed under it
            lambda obj, request: {**decision(obj, "pay-1", request["digest"]), "decision": "reject"},
            "StampInvalid",
        ),
        (lambda obj, request: decision(obj, "pay-1", "sha256:" + "1" * 64), "DigestMismatch"),
    ],
    ids=["unstamped", "forged", "other-run", "altered", "wrong-digest"],
)
def test_an_unproven_decision_is_refused_once_and_a_new_request_follows(written: Any, reason: str) -> None:
    obj, request = waiting_approval()
    obj = patch_spec(obj, approvals={"pay-1": written(obj, request)})
    refused = refusal_of(decide_on(obj, at(2), settings=APPROVALS))
    assert refused.moved
    assert (refused.event, refused.state) == (
        RunEvent.REVALIDATION_REQUIRED,
        RunState.RESUME_VALIDATION,
    )
    assert (refused.refused.field, refused.refused.key, refused.refused.reason) == (
        "approvals",
        "pay-1",
        reason,
    )
    assert refused.status.refused_requests == [refused.refused]
    condition = conditions(refused.status)[REQUEST_REFUSED]
    assert (condition.status.value, condition.reason) == ("True", reason)
    assert "approvals[pay-1]" in condition.message
    obj = apply(obj, refused)
    assert [a.decision for a in cp_of(obj).approvals] == [None], "never recorded as a decision"
    obj, again = expect(
        obj, at(3), RunEvent.REAPPROVAL_REQUIRED, RunState.WAITING_APPROVAL, settings=APPROVALS
    )
    assert again.status.approval_request is not None
    assert again.status.approval_request.request_id == "pay-2"
    assert "the decision on pay-1 was refused" in again.status.approval_request.policy_reason
    assert again.intents == (), "nothing intended on a refused decision"
    assert conditions(again.status)[REQUEST_REFUSED].reason == reason, "the condition stays"
    types = [c.type for c in again.status.conditions]
    assert len(types) == len(set(types)), f"conditions are a map by type: {types}"
    assert decide_on(obj, at(4), settings=APPROVALS) == Idle(
        wake_at=again.status.approval_request.expires_at, reason="approval"
    )


def test_a_stamped_decision_after_a_refused_one_is_acted_on() -> None:
    obj, request = waiting_approval()
    obj = patch_spec(obj, approvals={"pay-1": _hand_written(request)})
    obj = apply(obj, commit_of(decide_on(obj, at(2), settings=APPROVALS)))
    obj, _ = expect(obj, at(3), RunEvent.REAPPROVAL_REQUIRED, RunState.WAITING_APPROVAL, settings=APPROVALS)
    second = obj["status"]["approvalRequest"]
    obj = patch_spec(
        obj, approvals={**obj["spec"]["approvals"], "pay-2": decision(obj, "pay-2", second["digest"])}
    )
    obj, _ = expect(obj, at(4), RunEvent.APPROVAL_DECIDED, RunState.RESUME_VALIDATION, settings=APPROVALS)
    assert [(a.request_id, a.decision, a.decided_by) for a in cp_of(obj).approvals] == [
        ("pay-1", None, None),
        ("pay-2", "approved", "carol"),
    ]
    obj, _ = expect(obj, at(5), RunEvent.REVALIDATED, RunState.READY, settings=APPROVALS)
    obj, intent = expect(obj, at(6), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL, settings=APPROVALS)
    assert len(intent.intents) == 1
    assert intent.status.refused_requests[0].key == "pay-1"


def test_an_expired_request_expires_whatever_the_spec_holds() -> None:
    obj, request = waiting_approval()
    obj = patch_spec(obj, approvals={"pay-1": _hand_written(request)})
    expires = datetime.fromisoformat(request["expiresAt"].replace("Z", "+00:00"))
    expired = commit_of(decide_on(obj, expires, settings=APPROVALS))
    assert not isinstance(expired, Refusal)
    assert (expired.event, expired.state) == (RunEvent.WAIT_EXPIRED, RunState.EXPIRED)


# --- cancellations -----------------------------------------------------------------------------


def waiting_input() -> dict[str, Any]:
    return walk(new_run(steps=[ask("confirm"), DONE]), RunState.WAITING_INPUT, settings=KEYED)


def assert_nothing_else_moved(before: dict[str, Any], refused: Refusal) -> None:
    assert not refused.moved
    assert refused.status.state.value == before["status"]["state"]
    assert refused.status.state_version == before["status"]["stateVersion"]
    assert len(refused.status.history) == len(before["status"]["history"])
    assert json.dumps(refused.checkpoint) == json.dumps(before["status"]["checkpoint"])
    assert refused.status.waiting_for == before["status"].get("waitingFor")


@pytest.mark.parametrize("how", ["unstamped", "forged", "altered"])
def test_an_unproven_cancellation_is_refused_once_and_the_run_keeps_waiting(how: str) -> None:
    obj = waiting_input()
    if how == "unstamped":
        obj = cancel(obj, {"stop-1": {"scope": "task"}}, stamped=False)
    else:
        obj = cancel(obj, {"stop-1": {"scope": "turn"}})
        entry = obj["spec"]["cancellations"]["stop-1"]
        entry.update(stamp=FORGED) if how == "forged" else entry.update(scope="task")
    refused = refusal_of(decide_on(obj, at(2), settings=KEYED))
    assert_nothing_else_moved(obj, refused)
    assert (refused.refused.field, refused.refused.key) == ("cancellations", "stop-1")
    assert refused.refused.reason == ("Unstamped" if how == "unstamped" else "StampInvalid")
    obj = apply(obj, refused)
    assert cp_of(obj).cancellations == [], "never recorded as handled"
    idle = decide_on(obj, at(3), settings=KEYED)
    assert isinstance(idle, Idle)
    assert idle.reason == "waiting", "once per request, not once per look"
    # A stamped request afterwards (another request ID) is acted on.
    obj = cancel(obj, {"stop-2": {"scope": "task"}})
    obj, requested = expect(obj, at(4), RunEvent.CANCEL_REQUESTED, RunState.CANCEL_REQUESTED, settings=KEYED)
    assert requested.status.cancellation is not None
    assert requested.status.cancellation.request_id == "stop-2"
    assert condition_view(requested.status)[REQUEST_REFUSED] == ("True", refused.refused.reason)


def test_each_refused_request_is_named_and_counted() -> None:
    obj = cancel(waiting_input(), {"a": {}, "b": {}}, stamped=False)
    obj = apply(obj, refusal_of(decide_on(obj, at(2), settings=KEYED)))
    second = refusal_of(decide_on(obj, at(3), settings=KEYED))
    assert [r.key for r in second.status.refused_requests] == ["a", "b"]
    message = conditions(second.status)[REQUEST_REFUSED].message
    assert message.startswith("cancellations[b] refused: ")
    assert "(2 requests refused in all)" in message


def test_the_record_of_refusals_is_bounded() -> None:
    obj = quarantined()
    for i in range(REFUSED_LIMIT + 3):
        obj = patch_spec(obj, retryQuarantine=f"t{i:02d}")
        obj = apply(obj, refusal_of(decide_on(obj, at(2), settings=KEYED)))
    refused = obj["status"]["refusedRequests"]
    assert len(refused) == REFUSED_LIMIT
    assert refused[-1]["key"] == f"t{REFUSED_LIMIT + 2:02d}"


def test_a_later_transition_keeps_the_refusals_and_the_condition() -> None:
    obj = cancel(waiting_input(), {"x": {}}, stamped=False)
    obj = apply(obj, refusal_of(decide_on(obj, at(2), settings=KEYED)))
    obj = patch_spec(obj, answers={"confirm": "yes"})
    _, received = advance(obj, at(3), settings=KEYED)
    assert not isinstance(received, Refusal)
    assert [r.key for r in received.status.refused_requests] == ["x"]
    since = conditions(received.status)[REQUEST_REFUSED].last_transition_time
    assert since == at(2), "the condition keeps the time it became true"


# --- quarantine controls -----------------------------------------------------------------------

FUTURE = {"schemaVersion": FIRST_STAMPED_SCHEMA_VERSION + 90, "position": {"state": "ready", "step": 0}}


def quarantined() -> dict[str, Any]:
    obj = walk(new_run(steps=[ask("confirm"), DONE]), RunState.READY, settings=KEYED)
    obj["status"]["checkpoint"] = copy.deepcopy(FUTURE)
    commit = commit_of(decide_on(obj, at(1), settings=KEYED))
    assert commit.event is RunEvent.QUARANTINE
    return apply(obj, commit)


def test_an_unstamped_retry_is_refused_and_the_run_stays_quarantined() -> None:
    obj = patch_spec(quarantined(), retryQuarantine="after-upgrade")
    refused = refusal_of(decide_on(obj, at(2), settings=KEYED))
    assert_nothing_else_moved(obj, refused)
    assert (refused.refused.field, refused.refused.key) == ("retryQuarantine", "after-upgrade")
    obj = apply(obj, refused)
    idle = decide_on(obj, at(3), settings=KEYED)
    assert isinstance(idle, Idle)
    assert "refused" in idle.reason
    assert obj["status"].get("quarantineRetried") is None, "never consumed"


def test_a_stamped_retry_token_is_checked_against_the_token() -> None:
    obj = quarantined()
    stamped = retry_request(obj, "t1")
    obj = patch_spec(obj, **{**stamped, "retryQuarantine": "t2"})  # the stamp names t1
    assert refusal_of(decide_on(obj, at(2), settings=KEYED)).refused.reason == "StampInvalid"
    obj = patch_spec(obj, **retry_request(obj, "t3"))
    idle = decide_on(obj, at(3), settings=KEYED)  # stamped, and the checkpoint is still unreadable
    assert isinstance(idle, Idle)
    assert "still unreadable" in idle.reason


def test_an_unstamped_task_cancellation_of_a_quarantined_run_is_refused() -> None:
    obj = cancel(quarantined(), {"give-up": {"scope": "task"}}, stamped=False)
    refused = refusal_of(decide_on(obj, at(2), settings=KEYED))
    assert_nothing_else_moved(obj, refused)
    obj = apply(obj, refused)
    obj = cancel(obj, {"give-up-2": {"scope": "task"}})
    requested = commit_of(decide_on(obj, at(3), settings=KEYED))
    assert (requested.event, requested.state) == (RunEvent.CANCEL_REQUESTED, RunState.CANCEL_REQUESTED)


def test_the_creator_identity_is_what_the_stamp_covers_not_its_subclass() -> None:
    """``createdBy`` carries its own stamp; the proof covers the identity only (no recursion)."""
    created = stamp_creator(
        KEYRING, "team-a", "run-1", "default", Identity(username="bob", uid="u-1"), CREATED
    )
    assert created == {
        "username": "bob",
        "groups": [],
        "uid": "u-1",
        "stampedAt": "2030-01-01T12:00:00.000000Z",
        "stamp": created["stamp"],
    }
    commit = commit_of(
        decide_on(new_run(steps=[DONE], createdBy=created), at(0), settings=Settings(keyring=KEYRING))
    )
    assert commit.event is RunEvent.ACCEPTED


@pytest.mark.parametrize("how", ["unstamped", "forged"])
def test_an_unproven_reconciliation_is_refused_once_and_blocks_nothing(how: str) -> None:
    """Written with the webhook off (issue 30, item 2): never acted on (the dispatcher's rule),
    recorded once in ``refusedRequests`` with its reason, and the run goes on as it was."""
    act = "act-" + "b" * 40
    claimed: dict[str, Any] = {"applied": True, "attempt": 1, "reconciler": {"username": "mallory"}}
    if how == "forged":
        claimed |= {"reconciledAt": "2030-01-01T12:00:00.000000Z", "stamp": FORGED}
    obj = patch_spec(waiting_input(), reconciliations={act: claimed})
    refused = refusal_of(decide_on(obj, at(2), settings=KEYED))
    assert_nothing_else_moved(obj, refused)
    assert (refused.refused.field, refused.refused.key) == ("reconciliations", act)
    assert refused.refused.reason == ("Unstamped" if how == "unstamped" else "StampInvalid")
    assert refused.refused.message.startswith(f"reconciliations[{act}] refused: reconciliation {act!r}")
    obj = apply(obj, refused)
    idle = decide_on(obj, at(3), settings=KEYED)
    assert isinstance(idle, Idle)
    assert idle.reason == "waiting", "once per entry, not once per look"
    # It stays recorded across later transitions.
    obj = patch_spec(obj, answers={"confirm": "yes"})
    moved = commit_of(decide_on(obj, at(4), settings=KEYED))
    assert [(r.field, r.key) for r in moved.status.refused_requests] == [("reconciliations", act)]


def test_an_unproven_reconciliation_is_refused_while_a_cancellation_finishes() -> None:
    """A cancellation waits for unknown outcomes: the run says why a hand-written answer for one is
    not used, once, and the cancellation goes on."""
    obj = cancel(waiting_input(), {"stop-1": {"scope": "task"}})
    obj, _ = expect(obj, at(2), RunEvent.CANCEL_REQUESTED, RunState.CANCEL_REQUESTED, settings=KEYED)
    act = "act-" + "c" * 40
    obj = patch_spec(obj, reconciliations={act: {"applied": True, "attempt": 1}})
    refused = refusal_of(decide_on(obj, at(3), settings=KEYED))
    assert_nothing_else_moved(obj, refused)
    assert (refused.refused.field, refused.refused.key, refused.refused.reason) == (
        "reconciliations",
        act,
        "Unstamped",
    )
    obj = apply(obj, refused)
    finished = commit_of(decide_on(obj, at(4), settings=KEYED))
    assert finished.event is RunEvent.CANCEL_FINISHED
