"""Approvals: request, decision, expiry per policy."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from tests.unit.builders import T0, apply, at, commit_of, new_run, step

from durable_agents.api.v1alpha1 import ActionTier, AgentPolicySpec
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import Idle, Settings
from durable_agents.core.engine.commits import Refusal
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit


def _approval_settings(**freshness: str) -> Settings:
    policy = AgentPolicySpec.model_validate(
        {"version": "v7", "approvalExpiry": "10m", "freshness": freshness}
    )
    return Settings(
        policy_name="default-policy",
        policy_version="v7",
        tiers={"http.post": ActionTier.CONSEQUENTIAL},
        policy=policy,
        available_effects=frozenset({"http.post"}),
    )


def _pay_run() -> dict[str, Any]:
    return new_run(
        steps=[
            {
                "name": "pay",
                "effect": {"effect": "http.post", "target": {"url": "http://b"}, "arguments": {"n": 1}},
            },
            {"name": "done", "complete": {"result": "paid"}},
        ]
    )


def _to_waiting_approval(settings: Settings) -> dict[str, Any]:
    obj = _pay_run()
    obj = apply(obj, commit_of(step(obj, T0, settings=settings)))  # accepted
    commit = commit_of(step(obj, at(1), settings=settings))
    assert (commit.event, commit.state) == (RunEvent.APPROVAL_REQUESTED, RunState.WAITING_APPROVAL)
    assert commit.status.approval_request is not None
    assert commit.intents == (), "nothing is intended, let alone dispatched, before approval"
    return apply(obj, commit)


def test_a_consequential_effect_requests_approval_in_one_commit() -> None:
    settings = _approval_settings()
    obj = _to_waiting_approval(settings)
    request = obj["status"]["approvalRequest"]
    assert request["requestId"] == "pay-1"
    expires = datetime.fromisoformat(request["expiresAt"].replace("Z", "+00:00"))
    assert expires == at(1) + timedelta(minutes=10)
    assert obj["status"]["checkpoint"]["approvals"][0]["digest"] == request["digest"]
    assert obj["status"]["waitingFor"] == "approval:pay-1"
    assert step(obj, at(2), settings=settings) == Idle(
        wake_at=at(1) + timedelta(minutes=10), reason="approval"
    )


@pytest.mark.parametrize(
    ("policy", "event", "state"),
    [
        ("expire", RunEvent.WAIT_EXPIRED, RunState.EXPIRED),
        ("reapprove", RunEvent.REVALIDATION_REQUIRED, RunState.RESUME_VALIDATION),
    ],
)
def test_an_expired_approval_request_moves_the_run_as_the_policy_says(
    policy: str, event: RunEvent, state: RunState
) -> None:
    settings = _approval_settings(approvalExpired=policy)
    obj = _to_waiting_approval(settings)
    commit = commit_of(step(obj, at(1) + timedelta(minutes=10), settings=settings))
    assert (commit.event, commit.state) == (event, state)
    if policy == "reapprove":
        again = commit_of(step(apply(obj, commit), at(700), settings=settings))
        assert (again.event, again.state) == (RunEvent.REAPPROVAL_REQUIRED, RunState.WAITING_APPROVAL)
        assert again.status.approval_request is not None
        assert again.status.approval_request.request_id == "pay-2"


@pytest.mark.parametrize(
    ("decision", "reason"),
    [
        ({"decision": "approve"}, "Unstamped"),
        (
            {"digest": "sha256:" + "1" * 64, "decision": "approve", "approver": {"username": "a"}},
            "DigestMismatch",
        ),
    ],
    ids=["no-approver", "wrong-digest"],
)
def test_an_unstamped_or_mismatched_decision_is_not_acted_on(decision: dict[str, Any], reason: str) -> None:
    """Refused (recorded once) and asked again: never taken as a decision (stamps: test_engine_authority)."""
    settings = _approval_settings()
    obj = _to_waiting_approval(settings)
    request = obj["status"]["approvalRequest"]
    obj["spec"]["approvals"] = {"pay-1": {"digest": request["digest"], **decision}}
    refused = step(obj, at(2), settings=settings)
    assert isinstance(refused, Refusal)
    assert (refused.refused.key, refused.refused.reason) == ("pay-1", reason)
    assert (refused.event, refused.state) == (RunEvent.REVALIDATION_REQUIRED, RunState.RESUME_VALIDATION)
    again = commit_of(step(apply(obj, refused), at(3), settings=settings))
    assert (again.event, again.state) == (RunEvent.REAPPROVAL_REQUIRED, RunState.WAITING_APPROVAL)
    assert again.intents == ()


def test_a_rejection_fails_the_attempt_with_the_reason() -> None:
    settings = _approval_settings()
    obj = _to_waiting_approval(settings)
    request = obj["status"]["approvalRequest"]
    obj["spec"]["approvals"] = {
        "pay-1": {"digest": request["digest"], "decision": "reject", "approver": {"username": "alice"}}
    }
    obj = apply(obj, commit_of(step(obj, at(2), settings=settings)))
    assert obj["status"]["state"] == "resume_validation"
    commit = commit_of(step(obj, at(3), settings=settings))
    assert (commit.event, commit.state) == (RunEvent.ATTEMPT_FAILED, RunState.FAILED)
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "ApprovalRejected"
