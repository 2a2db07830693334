"""Quorum approvals, the pure rules: how decisions are counted (:func:`tally`), what the webhook
refuses (:func:`check_decision` with the decisions already given), and when a quorum nobody can
reach makes a run stuck (:func:`durable_agents.core.stuck.approver_holders`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_agents.api.v1alpha1 import (
    ActionTier,
    AgentRunSpec,
    AgentRunStatus,
    ApprovalDecision,
    ApprovalRequest,
    Identity,
)
from durable_agents.core import stuck as core
from durable_agents.core.approvals import check_decision, next_decision_key, request_of_key, tally

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
DIGEST = "sha256:" + "a" * 64
PEOPLE = ["alice", "bob", "carol", "dave", "erin"]


def _decision(who: str, verdict: str = "approve", digest: str = DIGEST, **extra: Any) -> ApprovalDecision:
    return ApprovalDecision(
        digest=digest, decision=verdict, approver=Identity(username=who), decided_at=NOW, **extra
    )  # type: ignore[arg-type]


def _unchecked(digest: str) -> ApprovalDecision:
    """A decision the schema would refuse (the webhook checks again, for a CRD without it)."""
    return _decision("carol").model_copy(update={"digest": digest})


def _request(quorum: int = 2, request_id: str = "pay-2", **extra: Any) -> ApprovalRequest:
    return ApprovalRequest(
        request_id=request_id,
        digest=DIGEST,
        step="pay",
        effect="http.post",
        tier=ActionTier.CONSEQUENTIAL,
        policy_reason="r",
        approver_role="approve on agentruns",
        expires_at=NOW + timedelta(hours=1),
        allowed_decisions=["approve", "reject"],
        quorum=quorum,
        **extra,
    )


def _keys(decisions: list[tuple[str, str]], request_id: str = "pay-2") -> dict[str, ApprovalDecision]:
    out: dict[str, ApprovalDecision] = {}
    for who, verdict in decisions:
        out[next_decision_key(out, request_id)] = _decision(who, verdict)
    return out


# --- counting -----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    decisions=st.lists(
        st.tuples(st.sampled_from(PEOPLE), st.sampled_from(["approve", "reject"])), max_size=8
    ),
    quorum=st.integers(min_value=1, max_value=5),
    four_eyes=st.booleans(),
)
def test_approved_iff_a_quorum_of_distinct_non_creator_approvals_and_no_rejection(
    decisions: list[tuple[str, str]], quorum: int, four_eyes: bool
) -> None:
    creator = "alice"
    counted = tally(_keys(decisions), "pay-2", quorum=quorum, creator=creator, four_eyes=four_eyes)
    eligible = [(who, v) for who, v in decisions if not (four_eyes and who == creator)]
    approvers = {who for who, v in eligible if v == "approve"}
    rejected = any(v == "reject" for _, v in eligible)
    expected = "rejected" if rejected else "approved" if len(approvers) >= quorum else None
    assert counted.outcome == expected
    assert len({vote.approver for vote in counted.approvals}) == len(counted.approvals), "each once"
    if not four_eyes or creator not in {w for w, _ in decisions}:
        return
    assert creator not in {vote.approver for vote in counted.approvals}


def test_keys_name_their_request_and_number_on() -> None:
    given_ = _keys([("bob", "approve"), ("carol", "approve")])
    assert list(given_) == ["pay-2", "pay-2.2"]
    assert next_decision_key(given_, "pay-2") == "pay-2.3"
    assert request_of_key("pay-2.3") == "pay-2"
    assert request_of_key("pay-2") == "pay-2"
    assert request_of_key("a.b-1.2") == "a.b-1"
    counted = tally(given_, "pay-2", quorum=3, creator=None, four_eyes=False)
    assert [(v.approver, v.key) for v in counted.approvals] == [("bob", "pay-2"), ("carol", "pay-2.2")]
    assert counted.missing == 1


# --- what the webhook refuses --------------------------------------------------------------------


def check(key: str = "pay-2.2", **overrides: Any) -> str | None:
    args: dict[str, Any] = {
        "request": _request(),
        "request_id": key,
        "decision": _decision("carol"),
        "now": NOW,
        "user": Identity(username="carol"),
        "creator": Identity(username="alice"),
        "four_eyes": True,
        "decided": _keys([("bob", "approve")]),
    }
    return check_decision(**{**args, **overrides})


def test_a_second_approver_under_the_next_key_passes() -> None:
    assert check() is None
    assert check(key="pay-2.7") is None, "a gap in the numbering harms nobody"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"user": Identity(username="bob"), "decision": _decision("bob")},
            "'bob' already decided approval request 'pay-2' (under 'pay-2')",
        ),
        (
            {"decided": _keys([("bob", "approve"), ("dave", "approve")])},
            "already decided: approved by 'bob', 'dave' (quorum 2)",
        ),
        ({"decided": _keys([("dave", "reject")])}, "already decided: rejected by 'dave' ('pay-2')"),
        ({"request": None}, "approval request 'pay-2' is already decided (under 'pay-2')"),
        ({"request": None, "decided": {}}, "unknown approval request 'pay-2.2'"),
        ({"key": "pay-1"}, "approval request 'pay-1' was superseded by 'pay-2' (digest sha256:"),
        ({"key": "pay-1.3"}, "approval request 'pay-1' was superseded by 'pay-2'"),
        ({"key": "pay-9"}, "unknown approval request 'pay-9': the pending request is 'pay-2'"),
        ({"decision": _unchecked("sha256:" + "A" * 64)}, "malformed digest"),
        ({"decision": _unchecked("sha256:" + "a" * 63 + "\n")}, "malformed digest"),
        ({"decision": _decision("carol", digest="sha256:" + "b" * 64)}, "wrong digest"),
        ({"now": NOW + timedelta(hours=2)}, "expired"),
        (
            {"user": Identity(username="alice"), "decision": _decision("alice")},
            "four-eyes policy: 'alice' created this run",
        ),
        (
            {"decision": _decision("carol", reason="ok\x1b[2J")},
            "spec.approvals['pay-2.2'].reason: the reason holds control character 0x1b at offset 2",
        ),
        ({"decision": _decision("carol", reason="ok\x85")}, "control character 0x85"),
    ],
    ids=[
        "same-person",
        "quorum-reached",
        "rejected",
        "decided-and-gone",
        "unknown",
        "superseded",
        "superseded-quorum-key",
        "unknown-later",
        "uppercase-digest",
        "short-digest",
        "wrong-digest",
        "expired",
        "creator",
        "escape-in-reason",
        "c1-control-in-reason",
    ],
)
def test_refusals_say_why(overrides: dict[str, Any], expected: str) -> None:
    reason = check(**overrides)
    assert reason is not None
    assert expected in reason


def test_a_reason_may_hold_newlines_and_tabs() -> None:
    assert check(decision=_decision("carol", reason="line one\n\tline two")) is None


def test_the_api_type_refuses_a_digest_of_the_wrong_case_or_length() -> None:
    """The CRD's pattern (the same in the schema the API server applies) catches these first."""
    for bad in ("sha256:" + "A" * 64, "sha256:" + "a" * 65, "sha256:" + "a" * 63, "SHA256:" + "a" * 64):
        with pytest.raises(ValueError, match="digest"):
            ApprovalDecision.model_validate({"digest": bad, "decision": "approve"})


# --- stuck: a quorum nobody can reach ------------------------------------------------------------

NS, RUN = "team-a", "pay"
GROUP = "durable-agents.io"
ROLE = {
    "metadata": {"name": "approver", "namespace": NS},
    "rules": [{"apiGroups": [GROUP], "resources": ["agentruns"], "verbs": ["approve"]}],
}


def _binding(*subjects: dict[str, str], ns: str | None = NS) -> dict[str, Any]:
    return {
        "metadata": {"name": "b", "namespace": ns},
        "roleRef": {"kind": "Role", "name": "approver"},
        "subjects": list(subjects),
    }


def holders(*subjects: dict[str, str]) -> frozenset[str] | None:
    return core.approver_holders(
        core.ApproverRule(),
        NS,
        RUN,
        group=GROUP,
        roles=[ROLE],
        cluster_roles=[],
        role_bindings=[_binding(*subjects)],
        cluster_role_bindings=[],
    )


def user(name: str) -> dict[str, str]:
    return {"kind": "User", "name": name}


def test_holders_are_users_and_service_accounts_and_a_group_is_unknown() -> None:
    sa = {"kind": "ServiceAccount", "name": "bot"}
    assert holders(user("bob"), user("bob"), sa) == {"bob", f"system:serviceaccount:{NS}:bot"}
    assert holders(user("bob"), {"kind": "Group", "name": "approvers"}) is None


def _judge(quorum: int, people: frozenset[str] | None, **request: Any) -> core.Stuck | None:
    spec = AgentRunSpec.model_validate(
        {"taskType": "t", "objective": "o", "createdBy": {"username": "alice"}}
    )
    status = AgentRunStatus.model_validate(
        {
            "state": "waiting_approval",
            "stateVersion": 3,
            "approvalRequest": _request(quorum, **request).wire(),
        }
    )
    facts = core.Facts(now=NOW, approver_held=True, approver_holders=people)
    return core.stuck(NS, RUN, spec, status, facts)


def test_a_quorum_larger_than_its_possible_approvers_is_stuck() -> None:
    verdict = _judge(3, frozenset({"bob", "carol"}))
    assert verdict is not None
    assert verdict.reason == core.NO_APPROVER
    assert "needs 3 more approval(s) (quorum 3) and only 2 other person(s)" in verdict.message
    assert "(bob, carol)" in verdict.message
    assert _judge(2, frozenset({"bob", "carol"})) is None
    assert _judge(3, None) is None, "a Group holds it: unknown, never stuck on a guess"


def test_the_creator_under_four_eyes_and_those_who_approved_are_not_counted() -> None:
    people = frozenset({"alice", "bob", "carol"})
    assert _judge(3, people) is None
    verdict = _judge(3, people, four_eyes=True)
    assert verdict is not None
    assert "the creator does not count under four-eyes" in verdict.message
    approved = [{"approver": "bob", "key": "pay-2"}]
    assert _judge(2, frozenset({"bob"}), approved_by=approved) is not None, "bob cannot approve twice"
    assert _judge(2, frozenset({"bob", "carol"}), approved_by=approved) is None


def test_kubectl_status_shows_who_approved_and_how_many_are_missing() -> None:
    from durable_agents.kubectl.main import describe

    request = _request(2, approved_by=[{"approver": "alice", "key": "pay-2"}]).wire()
    run = {"metadata": {"name": "r"}, "status": {"state": "waiting_approval", "approvalRequest": request}}
    assert "  approvals:   1 of 2 (alice); missing 1" in describe(run).splitlines()
    single = {**run, "status": {**run["status"], "approvalRequest": _request(1).wire()}}
    assert "approvals:" not in describe(single), "one approval decides: nothing to count"
