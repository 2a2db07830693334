"""Approval digests and the rules a decision must pass (everything but the RBAC question)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durable_agents.api.v1alpha1 import ActionTier, ApprovalDecision, ApprovalRequest, Identity
from durable_agents.core.approvals import approval_digest, check_decision

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
FIELDS = {
    "effect": "http.post",
    "arguments": {"amount": 120},
    "target": {"url": "http://billing/effects"},
    "service_account": "billing",
    "policy_version": "v1",
    "run_uid": "uid-1",
    "request_id": "pay-1",
}
DIGEST = approval_digest(**FIELDS)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "other"),
    [
        ("effect", "http.put"),
        ("arguments", {"amount": 121}),
        ("target", {"url": "http://x"}),
        ("service_account", "default"),
        ("policy_version", "v2"),
        ("run_uid", "uid-2"),
        ("request_id", "pay-2"),
    ],
)
def test_every_consequential_field_changes_the_digest(field: str, other: object) -> None:
    assert approval_digest(**{**FIELDS, field: other}) != DIGEST  # type: ignore[arg-type]


def test_the_digest_is_canonical() -> None:
    reordered = {**FIELDS, "arguments": {"b": 1, "a": 2}}
    again = {**FIELDS, "arguments": {"a": 2, "b": 1}}
    assert approval_digest(**reordered) == approval_digest(**again)  # type: ignore[arg-type]
    assert DIGEST.startswith("sha256:")
    assert len(DIGEST) == 71


REQUEST = ApprovalRequest(
    request_id="pay-1",
    digest=DIGEST,
    step="pay",
    effect="http.post",
    tier=ActionTier.CONSEQUENTIAL,
    policy_reason="r",
    approver_role="approve on agentruns",
    expires_at=NOW + timedelta(hours=1),
    allowed_decisions=["approve"],
)
ALICE = Identity(username="alice", groups=["approvers"])


def check(**overrides: object) -> str | None:
    args: dict[str, object] = {
        "request": REQUEST,
        "request_id": "pay-1",
        "decision": ApprovalDecision(digest=DIGEST, decision="approve"),
        "now": NOW,
        "user": ALICE,
        "creator": Identity(username="carol"),
        "four_eyes": True,
    }
    return check_decision(**{**args, **overrides})  # type: ignore[arg-type]


def test_a_good_decision_passes() -> None:
    assert check() is None


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"request": None}, "unknown approval request 'pay-1'"),
        ({"request_id": "pay-9"}, "unknown approval request 'pay-9'"),
        ({"decision": ApprovalDecision(digest="sha256:" + "0" * 64, decision="approve")}, "wrong digest"),
        ({"now": NOW + timedelta(hours=2)}, "expired"),
        ({"decision": ApprovalDecision(digest=DIGEST, decision="reject")}, "not allowed"),
        ({"creator": ALICE}, "four-eyes policy"),
    ],
)
def test_refusals_say_why(overrides: dict[str, object], expected: str) -> None:
    reason = check(**overrides)
    assert reason is not None
    assert expected in reason


def test_the_creator_may_approve_without_four_eyes() -> None:
    assert check(creator=ALICE, four_eyes=False) is None
