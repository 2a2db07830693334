"""The pure rules of notifications (durable_agents.core.notifications): what a run is due, the event
IDs, the bodies (no sealed value), the record of done deliveries and the backoff schedule."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_agents.api.v1alpha1 import NotificationEvent, NotificationTarget
from durable_agents.core import notifications as core
from durable_agents.core.sealing import Keyring
from durable_agents.shell.admission.destinations import policy_notification_refusal
from durable_agents.shell.observability.notify_http import request_of

KEYRING = Keyring(keys={"k1": b"\x01" * 32}, active_key_id="k1")
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
SEALED = {"sealed": "v1:k1:AAAAciphertextBBBB"}
CE = NotificationTarget(name="ce", url="https://hooks.example/ce")
CHAT = NotificationTarget.model_validate(
    {"name": "chat", "url": "https://hooks.example/slack", "format": "slack", "events": ["approvalRequested"]}
)


def run(state: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "pay", "namespace": "team-a", "uid": "u-1"},
        "spec": {"steps": [{"name": "pay", "effect": {"arguments": SEALED}}]},
        "status": {"state": state, "stateSince": "2026-12-03T11:59:00Z", **status},
    }


def waiting_approval(request_id: str = "pay-1", expires: str = "2026-12-03T13:00:00Z") -> dict[str, Any]:
    request = {
        "requestId": request_id,
        "digest": "sha256:" + "a" * 64,
        "step": "pay",
        "effect": "http.post",
        "tier": "consequential",
        "expiresAt": expires,
        "allowedDecisions": ["approve", "reject"],
        "arguments": SEALED,
        "target": {"url": "https://pay.example/secret-path"},
        "proposal": None,
    }
    return run("waiting_approval", approvalRequest=request)


def test_an_open_approval_request_is_due_one_notice_with_the_pinned_commands() -> None:
    (notice,) = core.notices_for(waiting_approval(), NOW)
    assert notice.id == "u-1.approval.pay-1"
    assert notice.type == "io.durable-agents.approval.requested"
    assert notice.source == "/apis/durable-agents.io/v1alpha1/namespaces/team-a/agentruns/pay"
    assert notice.data["action"] == {"kind": "effect", "name": "http.post"}
    assert notice.data["commands"]["approve"] == (
        "kubectl agentrun approve pay -n team-a --request pay-1 --digest sha256:" + "a" * 64
    )
    assert "reject" in notice.data["commands"]


def test_a_model_proposal_is_a_tool_and_an_expired_request_is_due_nothing() -> None:
    body = waiting_approval()
    body["status"]["approvalRequest"]["proposal"] = {"tool": "refund", "reason": SEALED}
    (notice,) = core.notices_for(body, NOW)
    assert notice.data["action"] == {"kind": "tool", "name": "refund"}
    assert core.notices_for(waiting_approval(expires="2026-12-03T11:00:00Z"), NOW) == []


def test_a_question_an_end_and_a_stuck_condition_each_have_their_own_deterministic_id() -> None:
    asked = run(
        "waiting_input",
        checkpoint={
            "pendingInput": {"requestId": "q", "question": SEALED, "expiresAt": "2026-12-04T00:00:00Z"}
        },
    )
    (question,) = core.notices_for(asked, NOW)
    assert question.id == "u-1.input.q"
    assert "--question q '<answer>'" in question.data["commands"]["answer"], "pinned to the question"
    ended = run("completed", outcome={"reason": "Completed", "result": "secret result"})
    (end,) = core.notices_for(ended, NOW)
    assert (end.id, end.data["reason"]) == ("u-1.ended.completed", "Completed")
    assert "secret result" not in json.dumps(end.data)
    stuck = run(
        "waiting_external",
        conditions=[
            {
                "type": "Stuck",
                "status": "True",
                "reason": "WaitWithoutExpiry",
                "message": "m",
                "lastTransitionTime": "2026-12-03T11:00:00Z",
            }
        ],
    )
    assert [n.id for n in core.notices_for(stuck, NOW)] == ["u-1.stuck.WaitWithoutExpiry.20261203T110000Z"]
    # Ended long ago: not due (a target added later is not flooded with every run kept).
    old = run("completed")
    old["status"]["stateSince"] = (NOW - core.ENDED_WINDOW - timedelta(seconds=1)).isoformat()
    assert core.notices_for(old, NOW) == []
    assert core.notices_for(run("ready"), NOW) == []


def test_no_body_carries_a_sealed_value_or_the_target() -> None:
    for body in (
        waiting_approval(),
        run("waiting_input", checkpoint={"pendingInput": {"requestId": "q", "question": SEALED}}),
    ):
        for notice in core.notices_for(body, NOW):
            for target in (CE, CHAT):
                _, sent = request_of(notice, target.format)
                assert b"ciphertext" not in sent
                assert b"secret-path" not in sent


def test_the_cloudevent_is_structured_json_and_the_slack_body_has_text_and_a_section() -> None:
    (notice,) = core.notices_for(waiting_approval(), NOW)
    headers, body = request_of(notice, CE.format)
    assert headers["content-type"] == "application/cloudevents+json"
    event = json.loads(body)
    assert (event["specversion"], event["id"], event["subject"]) == (
        "1.0",
        "u-1.approval.pay-1",
        "team-a/pay",
    )
    headers, body = request_of(notice, CHAT.format)
    slack = json.loads(body)
    assert set(slack) == {"text", "blocks"}
    assert slack["blocks"] == [{"type": "section", "text": {"type": "mrkdwn", "text": slack["text"]}}]
    assert notice.data["commands"]["approve"] in slack["text"]


def test_deliveries_go_to_the_targets_that_asked_and_the_record_keeps_only_what_is_due() -> None:
    notices = core.notices_for(waiting_approval(), NOW) + core.notices_for(run("completed"), NOW)
    due = core.deliveries(notices, [CE, CHAT])
    assert sorted((d.target.name, d.notice.event) for d in due) == [
        ("ce", NotificationEvent.APPROVAL_REQUESTED),
        ("ce", NotificationEvent.RUN_ENDED),
        ("chat", NotificationEvent.APPROVAL_REQUESTED),
    ]
    keys = {d.key for d in due}
    assert len(keys) == 3
    stale = "f" * core.KEY_LENGTH
    value = core.record(due[:1], keys | {stale}, KEYRING, "u-1")
    assert core.recorded({core.NOTIFIED_ANNOTATION: value}, KEYRING, "u-1") == {due[0].key}
    assert core.recorded(None, KEYRING, "u-1") == frozenset()


def test_a_record_the_operator_did_not_stamp_or_of_another_run_is_ignored() -> None:
    due = core.deliveries(core.notices_for(waiting_approval(), NOW), [CE, CHAT])
    keys = {d.key for d in due}
    value = core.record(due, keys, KEYRING, "u-1")
    listed = value.split(core.STAMP_SEPARATOR)[0]
    other = Keyring(keys={"k9": b"\x09" * 32}, active_key_id="k9")
    for forged in (
        listed,  # written by hand, no stamp
        f"{listed};k1:AAAA",  # a stamp that does not verify
        core.record(due, keys, other, "u-1"),  # another key
    ):
        assert core.recorded({core.NOTIFIED_ANNOTATION: forged}, KEYRING, "u-1") == frozenset(), forged
    assert core.recorded({core.NOTIFIED_ANNOTATION: value}, KEYRING, "u-2") == frozenset()  # copied
    assert core.recorded({core.NOTIFIED_ANNOTATION: value}, KEYRING, "u-1") == keys
    # Another URL (or format) for a target of the same name is another delivery.
    moved = CE.model_copy(update={"url": "https://hooks.example/other"})
    assert core.delivery_key(moved, "x") != core.delivery_key(CE, "x")


@given(attempt=st.integers(min_value=1, max_value=200), seed=st.integers(min_value=0, max_value=2**32))
def test_backoff_grows_is_capped_and_keeps_half_of_its_ceiling(attempt: int, seed: int) -> None:
    entropy = random.Random(seed).randbytes
    pause = core.backoff(attempt, entropy, 1.0, 60.0)
    ceiling = min(60.0, 2.0 ** (attempt - 1))
    assert ceiling / 2 <= pause <= ceiling


def test_backoff_refuses_a_broken_entropy_source() -> None:
    with pytest.raises(ValueError, match="entropy"):
        core.backoff(1, lambda n: b"", 1.0, 60.0)


def test_a_policy_naming_a_target_outside_its_own_allowlist_is_refused_naming_the_field() -> None:
    policy = {
        "spec": {
            "destinations": {"notifications": ["https://hooks.example/ok"]},
            "notifications": [{"url": "https://hooks.example/ok/ce"}, {"url": "https://hooks.example/okay"}],
        }
    }
    problem = policy_notification_refusal(policy)
    assert problem is not None
    assert "spec.notifications[1].url" in problem
    policy["spec"]["notifications"] = policy["spec"]["notifications"][:1]
    assert policy_notification_refusal(policy) is None
    assert policy_notification_refusal({"spec": {"notifications": [{"url": "http://anywhere"}]}}) is None
