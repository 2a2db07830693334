"""A quorum: a request that needs N distinct approvers. The engine counts each verified decision
once per person, never the creator under four-eyes, lets one rejection decide, and shows the
approvals so far on the request without a transition (the second line: the webhook may be off)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.builders import (
    DONE,
    KEYRING,
    apply,
    at,
    checkpoint_of,
    commit_of,
    cp_of,
    decide_on,
    decision,
    effect,
    expect,
    new_run,
    patch_spec,
    settings_with,
    walk,
)

from durable_agents.api.v1alpha1 import ActionTier
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.approvals import next_decision_key
from durable_agents.core.engine import Idle, Settings
from durable_agents.core.engine.commits import Refusal, StatusNote
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit


def _settings(quorum: int = 2, *, four_eyes: bool = False, **approvers: Any) -> Settings:
    rule = {"quorum": quorum, "fourEyes": four_eyes, **approvers}
    return replace(settings_with(tier=ActionTier.CONSEQUENTIAL, approvers=rule), keyring=KEYRING)


QUORUM_2 = _settings()


def _waiting(settings: Settings = QUORUM_2) -> tuple[dict[str, Any], dict[str, Any]]:
    obj = walk(new_run(steps=[effect("pay"), DONE]), RunState.WAITING_APPROVAL, settings=settings)
    return obj, obj["status"]["approvalRequest"]


def _decide(obj: dict[str, Any], key: str, by: str, verdict: str = "approve") -> dict[str, Any]:
    digest = obj["status"]["approvalRequest"]["digest"]
    approvals = {**obj["spec"].get("approvals", {}), key: decision(obj, key, digest, verdict, by=by)}
    return patch_spec(obj, approvals=approvals)


def _shown(obj: dict[str, Any]) -> list[tuple[str, str]]:
    return [(v["approver"], v["key"]) for v in obj["status"]["approvalRequest"].get("approvedBy", [])]


def test_the_request_and_its_record_carry_the_quorum() -> None:
    obj, request = _waiting(_settings(3, quorumByTier={"consequential": 2}))
    assert (request["quorum"], request["approverVerb"], request["fourEyes"]) == (2, "approve", False)
    record = obj["status"]["checkpoint"]["approvals"][0]
    assert record["quorum"] == 2, "counted by the integrity-stamped checkpoint, not the status"


def test_at_quorum_one_nothing_new_is_stored_or_written() -> None:
    obj, request = _waiting(_settings(1))
    assert request["quorum"] == 1
    record = obj["status"]["checkpoint"]["approvals"][0]
    assert {"quorum", "fourEyes", "approvedBy"}.isdisjoint(record), "the stored form is as before"
    assert isinstance(decide_on(obj, at(2), settings=_settings(1)), Idle)
    obj = _decide(obj, "pay-1", "carol")
    obj, _decided = expect(
        obj, at(3), RunEvent.APPROVAL_DECIDED, RunState.RESUME_VALIDATION, settings=_settings(1)
    )
    assert "approvedBy" not in obj["status"]["checkpoint"]["approvals"][0]


def test_one_approval_waits_shows_it_and_two_distinct_approvers_decide() -> None:
    obj, _ = _waiting()
    obj = _decide(obj, "pay-1", "carol")
    note = decide_on(obj, at(2), settings=QUORUM_2)
    assert isinstance(note, StatusNote), "shown without a transition"
    assert (note.state, note.status.state_version) == (
        RunState.WAITING_APPROVAL,
        obj["status"]["stateVersion"],
    )
    assert len(note.status.history) == len(obj["status"]["history"]), "no history entry"
    assert note.checkpoint == obj["status"]["checkpoint"], "the checkpoint as stored"
    obj = apply(obj, note)
    assert _shown(obj) == [("carol", "pay-1")]
    assert isinstance(decide_on(obj, at(3), settings=QUORUM_2), Idle), "shown once"
    # The same person again, under the next key (the webhook off): counted once.
    obj = _decide(obj, "pay-1.2", "carol")
    assert isinstance(decide_on(obj, at(4), settings=QUORUM_2), Idle)
    obj = _decide(obj, "pay-1.3", "dave")
    obj, decided = expect(
        obj, at(5), RunEvent.APPROVAL_DECIDED, RunState.RESUME_VALIDATION, settings=QUORUM_2
    )
    record = cp_of(obj).approvals[0]
    assert (record.decision, record.decided_by, record.approved_by) == ("approved", "dave", ["carol", "dave"])
    assert decided.status.approval_request is None
    obj, _ = expect(obj, at(6), RunEvent.REVALIDATED, RunState.READY, settings=QUORUM_2)
    obj, intent = expect(obj, at(7), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL, settings=QUORUM_2)
    assert len(intent.intents) == 1


def test_one_rejection_decides_whatever_the_approvals() -> None:
    obj, _ = _waiting()
    obj = _decide(_decide(obj, "pay-1", "carol"), "pay-1.2", "dave", "reject")
    obj, _ = expect(obj, at(2), RunEvent.APPROVAL_DECIDED, RunState.RESUME_VALIDATION, settings=QUORUM_2)
    record = cp_of(obj).approvals[0]
    assert (record.decision, record.decided_by, record.approved_by) == ("rejected", "dave", None)
    obj, failed = expect(obj, at(3), RunEvent.ATTEMPT_FAILED, RunState.FAILED, settings=QUORUM_2)
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "ApprovalRejected"


def test_the_creator_never_counts_under_four_eyes() -> None:
    settings = _settings(2, four_eyes=True)
    obj, _ = _waiting(settings)
    obj = _decide(obj, "pay-1", "alice")  # the creator (builders.CREATOR), stamped: webhook misconfigured
    refused = decide_on(obj, at(2), settings=settings)
    assert isinstance(refused, Refusal)
    assert not refused.moved, "refused in place: the others' approvals stand"
    assert (refused.refused.key, refused.refused.reason) == ("pay-1", "FourEyes")
    obj = apply(obj, refused)
    obj = _decide(obj, "pay-1.2", "carol")
    obj = apply(obj, commit_of(decide_on(obj, at(3), settings=settings)))
    assert _shown(obj) == [("carol", "pay-1.2")], "the creator is not among the approvals"
    obj = _decide(obj, "pay-1.3", "dave")
    obj, _ = expect(obj, at(4), RunEvent.APPROVAL_DECIDED, RunState.RESUME_VALIDATION, settings=settings)
    assert cp_of(obj).approvals[0].approved_by == ["carol", "dave"]


def test_an_unproven_decision_under_a_quorum_keeps_the_verified_approvals() -> None:
    obj, request = _waiting()
    obj = _decide(obj, "pay-1", "carol")
    forged = {"digest": request["digest"], "decision": "approve", "approver": {"username": "dave"}}
    obj = patch_spec(obj, approvals={**obj["spec"]["approvals"], "pay-1.2": forged})
    refused = decide_on(obj, at(2), settings=QUORUM_2)
    assert isinstance(refused, Refusal)
    assert not refused.moved
    assert (refused.refused.key, refused.refused.reason) == ("pay-1.2", "Unstamped")
    obj = apply(obj, refused)
    obj = apply(obj, commit_of(decide_on(obj, at(3), settings=QUORUM_2)))  # the approvals shown
    assert _shown(obj) == [("carol", "pay-1")]
    assert obj["status"]["state"] == "waiting_approval", "one verified approval of two: waiting"
    assert isinstance(decide_on(obj, at(4), settings=QUORUM_2), Idle), "refused once"
    obj = _decide(obj, "pay-1.3", "erin")
    obj, _ = expect(obj, at(5), RunEvent.APPROVAL_DECIDED, RunState.RESUME_VALIDATION, settings=QUORUM_2)
    assert cp_of(obj).approvals[0].approved_by == ["carol", "erin"]


def test_an_unproven_rejection_decides_nothing() -> None:
    obj, request = _waiting()
    forged = {"digest": request["digest"], "decision": "reject", "approver": {"username": "mallory"}}
    obj = patch_spec(obj, approvals={"pay-1": forged})
    obj = apply(obj, decide_on(obj, at(2), settings=QUORUM_2))  # type: ignore[arg-type]
    assert obj["status"]["state"] == "waiting_approval"
    assert [r["key"] for r in obj["status"]["refusedRequests"]] == ["pay-1"]


def test_a_partly_approved_request_expires_as_any() -> None:
    obj, request = _waiting()
    obj = _decide(obj, "pay-1", "carol")
    obj = apply(obj, commit_of(decide_on(obj, at(2), settings=QUORUM_2)))
    expires = datetime.fromisoformat(request["expiresAt"].replace("Z", "+00:00"))
    expired = commit_of(decide_on(obj, expires, settings=QUORUM_2))
    assert (expired.event, expired.state) == (RunEvent.WAIT_EXPIRED, RunState.EXPIRED)


# --- for any set of decisions ---------------------------------------------------------------------

PEOPLE = ["alice", "carol", "dave", "erin"]  # alice is the creator (builders.CREATOR)
WAITING = {q: _waiting(_settings(q, four_eyes=True))[0] for q in (1, 2, 3)}
WAITING_OPEN = {q: _waiting(_settings(q))[0] for q in (1, 2, 3)}


def _outcome(obj: dict[str, Any], settings: Settings) -> str | None:
    """Decide until the engine rests or moves: ``approved``, ``rejected`` or None (waiting, or
    asked again under a new request)."""
    for n in range(40):
        decided = decide_on(obj, at(2 + n), settings=settings)
        if isinstance(decided, Idle):
            return None
        commit = commit_of(decided)
        if isinstance(commit, StatusNote) or (isinstance(commit, Refusal) and not commit.moved):
            obj = apply(obj, commit)
            continue
        if commit.event is not RunEvent.APPROVAL_DECIDED:
            return None
        return checkpoint_of(commit).approvals[0].decision
    raise AssertionError("the engine did not rest")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    decisions=st.lists(
        st.tuples(st.sampled_from(PEOPLE), st.sampled_from(["approve", "reject"]), st.booleans()),
        max_size=6,
    ),
    quorum=st.sampled_from([1, 2, 3]),
    four_eyes=st.booleans(),
)
def test_approved_iff_a_quorum_of_distinct_verified_non_creator_approvals_and_no_verified_rejection(
    decisions: list[tuple[str, str, bool]], quorum: int, four_eyes: bool
) -> None:
    rules = _settings(quorum, four_eyes=four_eyes)
    obj = (WAITING if four_eyes else WAITING_OPEN)[quorum]
    digest = obj["status"]["approvalRequest"]["digest"]
    written: dict[str, Any] = {}
    for who, verdict, stamped in decisions:
        key = next_decision_key(written, "pay-1")
        written[key] = (
            decision(obj, key, digest, verdict, by=who)
            if stamped
            else {"digest": digest, "decision": verdict, "approver": {"username": who}}
        )
    eligible = [(w, v) for w, v, stamped in decisions if stamped and not (four_eyes and w == "alice")]
    if any(v == "reject" for _, v in eligible):
        expected: str | None = "rejected"
    elif len({w for w, v in eligible if v == "approve"}) >= quorum:
        expected = "approved"
    else:
        expected = None
    assert _outcome(patch_spec(obj, approvals=written), rules) == expected
