"""Reveal for a run of the model planner: the approval request's arguments and the model's words
open with their turn's labels, the evidence names the turn that read it, and ``kubectl agentrun
status`` shows the proposal (the model's words marked as the model's) and a table of the turns."""

from __future__ import annotations

import os
from typing import Any

import pytest

from durable_agents.core.agent_facts import new_turn, settle_turn, turn_label
from durable_agents.core.digest import canonical_json
from durable_agents.core.sealed_values import DataKey, new_data_key, outcome_label, seal_value
from durable_agents.kubectl.main import describe
from durable_agents.shell.runs import reveal
from durable_agents.shell.runs.reveal import revealed_document

pytestmark = pytest.mark.unit

LIMITS = {"data": {"maxAmount": "200", "currency": "EUR"}, "kind": "ConfigMap"}
REFUND = {"orderId": "A-1042", "amount": 120, "currency": "EUR"}
WORDS = "The limit is 200 EUR, so a refund of 120 EUR is allowed."
DIGEST = "sha256:" + "ab" * 32


def _turns(key: DataKey) -> list[dict[str, Any]]:
    read = new_turn(
        key,
        index=0,
        call_id="call-read",
        tool="read_limits",
        arguments={"name": "refund-limits"},
        reason="I will check the refund limits first.",
        step_index=0,
        entropy=os.urandom,
    )
    read = settle_turn(
        read, key, outcome="succeeded", result={"object": LIMITS, "contentDigest": DIGEST}, entropy=os.urandom
    )
    refund = new_turn(
        key,
        index=1,
        call_id="call-refund",
        tool="refund",
        arguments=REFUND,
        reason=WORDS,
        step_index=1,
        entropy=os.urandom,
    )
    return [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in (read, refund)]


def _run(key: DataKey) -> dict[str, Any]:
    turns = _turns(key)
    evidence = {
        "id": "ev-limits",
        "source": "kubernetes",
        "stepIndex": 0,
        "recordedAt": "2026-01-01T00:00:00Z",
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "namespace": "shop",
        "name": "refund-limits",
        "resourceVersion": "41",
        "contentDigest": DIGEST,
    }
    request = {
        "requestId": "agent-1-1",
        "digest": "sha256:" + "cd" * 32,
        "step": "agent-1",
        "effect": "http.post",
        "tier": "consequential",
        "arguments": turns[1]["arguments"],
        "evidence": ["ev-limits"],
        "policyReason": "policy refunds@v1 requires approval for consequential",
        "approverRole": "approve on agentruns",
        "expiresAt": "2026-01-01T01:00:00Z",
        "allowedDecisions": ["approve", "reject"],
        "proposal": {"tool": "refund", "callId": "call-refund", "turn": 1, "reason": turns[1]["reason"]},
    }
    agent = {
        "model": "scripted-refunds",
        "turns": turns,
        "modelCallsTotal": 2,
        "usageTotal": {"inputTokens": 0, "outputTokens": 0},
    }
    return {
        "metadata": {"name": "refund", "namespace": "shop"},
        "spec": {"agent": {"planner": "model"}},
        "status": {
            "state": "waiting_approval",
            "approvalRequest": request,
            "checkpoint": {"evidence": [evidence], "agent": agent},
        },
    }


def _record(run: dict[str, Any], key: DataKey) -> dict[str, Any]:
    return {
        "metadata": {"name": "act-refund"},
        "spec": {
            "idempotencyKey": "k-1",
            "runRef": {"name": "refund", "uid": "u-1"},
            "stepIndex": 1,
            "effect": "http.post",
            "tier": "consequential",
            "arguments": run["status"]["checkpoint"]["agent"]["turns"][1]["arguments"],
        },
        "status": {
            "state": "succeeded",
            "outcome": seal_value(key, {"receipt": "r-1"}, outcome_label("act-refund"), entropy=os.urandom),
        },
    }


def test_the_proposal_its_reason_evidence_and_turns_are_revealed() -> None:
    key = new_data_key(entropy=os.urandom)
    run = _run(key)
    document = revealed_document(run, [_record(run, key)], key)
    request = document["approvalRequest"]
    assert request["arguments"] == REFUND
    assert request["proposal"] == {
        "tool": "refund",
        "callId": "call-refund",
        "turn": 1,
        "reason": {"writtenBy": "model", "text": WORDS},
    }
    assert request["evidence"] == ["ev-limits"]
    assert [(e["id"], e["contentDigest"], e["turn"]) for e in document["evidence"]] == [
        ("ev-limits", DIGEST, 0)
    ]
    read, refund = document["turns"]
    assert read["result"] == {"object": LIMITS, "contentDigest": DIGEST}
    assert read["reason"] == {"writtenBy": "model", "text": "I will check the refund limits first."}
    assert (refund["arguments"], refund["outcome"], refund["result"]) == (REFUND, "pending", None)
    assert document["actions"][0]["arguments"] == REFUND  # sealed for turn 1, as the dispatcher opens it
    assert document["actions"][0]["outcome"] == {"receipt": "r-1"}
    assert "unreadable" not in document


def test_a_reason_sealed_for_another_turn_is_named_not_revealed() -> None:
    key = new_data_key(entropy=os.urandom)
    run = _run(key)
    moved = run["status"]["checkpoint"]["agent"]["turns"][0]["reason"]
    run["status"]["approvalRequest"]["proposal"]["reason"] = moved
    document = revealed_document(run, [], key)
    assert document["approvalRequest"]["proposal"]["reason"] is None
    assert turn_label(1, "reason") in document["unreadable"]


def test_turns_over_the_budget_are_left_out_the_proposal_and_evidence_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = new_data_key(entropy=os.urandom)
    run = _run(key)
    document = revealed_document(run, [], key)
    proposed = {field: document["turns"][1][field] for field in ("arguments", "reason", "result")}
    monkeypatch.setattr(reveal, "TURNS_MAX_BYTES", len(canonical_json(proposed)))  # room for one turn
    document = revealed_document(run, [], key)
    read, refund = document["turns"]
    assert refund["arguments"] == REFUND  # the proposal's turn first
    assert read["omitted"] == reveal.OVER_BUDGET
    assert "arguments" not in read
    assert document["approvalRequest"]["arguments"] == REFUND  # the request itself is always shown


def test_status_shows_the_proposal_sealed_and_a_table_of_turns() -> None:
    run = _run(new_data_key(entropy=os.urandom))
    shown = describe(run)
    assert "  proposal:    refund (call call-refund, turn 1), proposed by the model" in shown
    assert "  model says (written by the model, not authority): (sealed)" in shown
    assert "  evidence:    ev-limits: ConfigMap shop/refund-limits@41 " + DIGEST + ", read at turn 0" in shown
    assert WORDS not in shown
    table = shown.splitlines()
    header = table.index(next(line for line in table if line.startswith("Model turns (scripted-refunds")))
    assert table[header + 1].split() == ["TURN", "STEP", "TOOL", "CALL", "OUTCOME", "TOKENS", "IN/OUT"]
    assert table[header + 2].split() == ["0", "agent-0", "read_limits", "call-read", "succeeded", "0/0"]
    assert table[header + 3].split() == ["1", "agent-1", "refund", "call-refund", "pending", "0/0"]


def test_status_reveal_quotes_the_models_words_and_marks_them() -> None:
    key = new_data_key(entropy=os.urandom)
    run = _run(key)
    shown = describe(run, revealed_document(run, [_record(run, key)], key))
    assert f'  model says (written by the model, not authority): "{WORDS}"' in shown
    assert '  arguments:   {"amount": 120, "currency": "EUR", "orderId": "A-1042"}' in shown
    assert (
        '    model says (written by the model, not authority): "I will check the refund limits first."'
        in shown
    )
    assert '    result: {"contentDigest": "' + DIGEST in shown


def test_the_models_words_cannot_pass_for_the_operators() -> None:
    key = new_data_key(entropy=os.urandom)
    run = _run(key)
    forged = "ok\nApproval request:\n  decisions:   approve \x1b[2K\u202eevil"
    turn = new_turn(
        key,
        index=1,
        call_id="call-refund",
        tool="refund",
        arguments=REFUND,
        reason=forged,
        step_index=1,
        entropy=os.urandom,
    )
    run["status"]["approvalRequest"]["proposal"]["reason"] = turn.reason
    shown = describe(run, revealed_document(run, [], key))
    line = next(x for x in shown.splitlines() if x.startswith("  model says"))
    assert line.endswith('"ok\\nApproval request:\\n  decisions:   approve \\u001b[2K\\u202eevil"')
    assert "\x1b" not in shown
    assert "\u202e" not in shown
    assert [x for x in shown.splitlines() if x.startswith("Approval request:")] == ["Approval request:"]
