"""The reveal document: every sealed value of a run and its ActionRecords, in plaintext; a value
that does not open is named, never fatal."""

from __future__ import annotations

import os
from typing import Any

import pytest

from durable_agents.core.sealed_values import (
    new_data_key,
    outcome_label,
    seal_spec,
    seal_value,
    step_label,
)
from durable_agents.shell.runs.reveal import revealed_document

pytestmark = pytest.mark.unit

ARGUMENTS = {"iban": "DE89370400440532013000", "amount": 120}


def _spec() -> dict[str, Any]:
    return {
        "steps": [
            {"name": "confirm", "ask": {"question": "pay ACME?"}},
            {"name": "pay", "effect": {"effect": "http.post", "arguments": ARGUMENTS}},
        ],
        "answers": {"confirm": "yes"},
    }


def test_every_sealed_value_is_revealed() -> None:
    key = new_data_key(entropy=os.urandom)
    spec = seal_spec(_spec(), key, entropy=os.urandom)
    pay_args = spec["steps"][1]["effect"]["arguments"]
    run = {
        "spec": spec,
        "status": {
            "approvalRequest": {
                "requestId": "pay-1",
                "step": "pay",
                "effect": "http.post",
                "arguments": pay_args,
            },
            "checkpoint": {
                "pendingInput": {"requestId": "confirm", "question": spec["steps"][0]["ask"]["question"]}
            },
        },
    }
    record = {
        "metadata": {"name": "act-1"},
        "spec": {"effect": "http.post", "stepIndex": 1, "arguments": pay_args},
        "status": {
            "state": "succeeded",
            "outcome": seal_value(key, {"receipt": "r-1"}, outcome_label("act-1"), entropy=os.urandom),
        },
    }
    document = revealed_document(run, [record], key)
    assert document["values"] == {
        "steps/confirm/question": "pay ACME?",
        "steps/pay/arguments": ARGUMENTS,
        "answers/confirm": "yes",
    }
    assert document["approvalRequest"]["arguments"] == ARGUMENTS
    assert document["pendingInput"] == {"requestId": "confirm", "question": "pay ACME?"}
    assert document["actions"] == [
        {
            "name": "act-1",
            "effect": "http.post",
            "state": "succeeded",
            "arguments": ARGUMENTS,
            "outcome": {"receipt": "r-1"},
        }
    ]
    assert "unreadable" not in document


def test_a_value_sealed_for_another_field_or_run_is_named_not_revealed() -> None:
    key = new_data_key(entropy=os.urandom)
    spec = seal_spec(_spec(), key, entropy=os.urandom)
    moved = seal_value(key, "elsewhere", step_label("other", "question"), entropy=os.urandom)
    foreign = seal_value(
        new_data_key(entropy=os.urandom), ARGUMENTS, step_label("pay", "arguments"), entropy=os.urandom
    )
    run = {
        "spec": spec,
        "status": {
            "approvalRequest": {
                "requestId": "pay-1",
                "step": "pay",
                "effect": "http.post",
                "arguments": foreign,
            },
            "checkpoint": {"pendingInput": {"requestId": "confirm", "question": moved}},
        },
    }
    document = revealed_document(run, [], key)
    assert document["approvalRequest"]["arguments"] is None
    assert document["pendingInput"]["question"] is None
    assert set(document["unreadable"]) == {"steps/pay/arguments", "steps/confirm/question"}


def test_without_a_data_key_plaintext_shows_and_sealed_values_are_named() -> None:
    run = {"spec": _spec(), "status": {}}
    document = revealed_document(run, [], None)
    assert document["values"]["steps/pay/arguments"] == ARGUMENTS  # a run from before sealing
    sealed = seal_spec(_spec(), new_data_key(entropy=os.urandom), entropy=os.urandom)
    document = revealed_document({"spec": sealed}, [], None)
    assert document["values"]["answers/confirm"] is None
    assert "answers/confirm" in document["unreadable"]
