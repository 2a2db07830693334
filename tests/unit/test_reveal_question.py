"""Reveal for who may answer a run but not approve it: the question it waits on and the answers
given to it, nothing else sealed; what is withheld is named (no value) with the verb that shows
it; a run that waits on no question is refused with a message."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import ApproverRule
from durable_agents.core.agent_facts import new_turn
from durable_agents.core.sealed_values import DataKey, new_data_key, seal_spec, seal_value, step_label
from durable_agents.kubectl.main import describe
from durable_agents.shell.runs.reveal_question import NoQuestion, question_document

pytestmark = pytest.mark.unit

IBAN = "DE89370400440532013000"
QUESTION = "Pay invoice INV-7731?"
RULE = ApproverRule(verb="approve-payments", resource="agentruns")


def _scripted(key: DataKey, answers: dict[str, str]) -> dict[str, Any]:
    spec = seal_spec(
        {
            "steps": [
                {"name": "pay", "effect": {"effect": "http.post", "arguments": {"iban": IBAN}}},
                {"name": "confirm", "ask": {"question": QUESTION}},
                {"name": "later", "ask": {"question": "a later question, not asked yet"}},
            ],
            "answers": answers,
        },
        key,
        entropy=os.urandom,
    )
    pending = {"requestId": "confirm", "question": spec["steps"][1]["ask"]["question"], "key": "confirm.2"}
    return {
        "metadata": {"namespace": "shop", "name": "invoice"},
        "spec": spec,
        "status": {
            "state": "waiting_input",
            "waitingFor": "input:confirm.2",
            "checkpoint": {"pendingInput": {**pending, "expiresAt": "2026-01-01T01:00:00Z"}},
        },
    }


def test_the_question_and_its_answers_only() -> None:
    key = new_data_key(entropy=os.urandom)
    run = _scripted(key, {"confirm": "refused once", "other": "an answer to another question"})
    document = question_document(run, key, RULE)
    assert document["scope"] == "question"
    assert document["pendingInput"] == {
        "requestId": "confirm",
        "key": "confirm.2",
        "question": QUESTION,
        "expiresAt": "2026-01-01T01:00:00Z",
        "askedBy": "the run's spec",
    }
    assert document["answers"] == {"confirm": "refused once"}
    text = json.dumps(document)
    for secret in (IBAN, "a later question", "another question"):
        assert secret not in text
    assert document["withheld"] == {
        "what": [
            "spec value answers/other",
            "spec value steps/later/question",
            "spec value steps/pay/arguments",
            "its actions' arguments and outcomes (ActionRecords), if any",
        ],
        "verb": "approve-payments",
        "resource": "agentruns",
    }
    shown = describe(run, {**document, "run": "shop/invoice"})
    assert f"Question:    {QUESTION} (answer as spec.answers['confirm.2']" in shown
    assert '  answers/confirm: "refused once"' in shown
    assert (
        "  withheld: spec value steps/pay/arguments (verb 'approve-payments' on agentruns shows it)" in shown
    )
    assert IBAN not in shown


def test_a_models_question_is_marked_as_its_words_and_its_turns_are_withheld() -> None:
    key = new_data_key(entropy=os.urandom)
    asked = "Refund\u202e 120 EUR to A-1042?"  # a bidirectional override: shown escaped, not acted on
    turn = new_turn(
        key,
        index=0,
        call_id="call-ask",
        tool="ask_owner",
        arguments={"question": asked},
        reason="the owner decides",
        step_index=0,
        entropy=os.urandom,
    ).model_dump(by_alias=True, mode="json", exclude_none=True)
    question = seal_value(key, asked, step_label("agent-0", "question"), entropy=os.urandom)
    run = {
        "metadata": {"namespace": "shop", "name": "refund"},
        "spec": {},
        "status": {
            "state": "waiting_input",
            "checkpoint": {
                "agent": {"turns": [turn]},
                "pendingInput": {
                    "requestId": "agent-0",
                    "question": question,
                    "expiresAt": "2026-01-01T01:00:00Z",
                },
            },
        },
    }
    document = question_document(run, key, ApproverRule())
    assert document["pendingInput"]["question"] == asked
    assert document["pendingInput"]["askedBy"] == "model"
    assert "the model's turn (arguments, reasons, results)" in document["withheld"]["what"]
    assert "the owner decides" not in json.dumps(document)
    shown = describe(run, document)
    assert 'Question:    asked by the model (its words, not authority): "Refund\\u202e 120 EUR' in shown
    assert "\u202e" not in shown


def test_a_run_waiting_on_no_question_reveals_nothing() -> None:
    key = new_data_key(entropy=os.urandom)
    run = _scripted(key, {})
    run["status"] = {"state": "waiting_approval", "waitingFor": "approval:pay-1", "checkpoint": {}}
    with pytest.raises(NoQuestion) as refused:
        question_document(run, key, RULE)
    assert str(refused.value) == (
        "agentrun shop/invoice waits on no question (state 'waiting_approval', waiting for "
        "approval:pay-1): verb 'answer' reveals only the question a run waits on; its other sealed "
        "values need verb 'approve-payments' on agentruns"
    )
