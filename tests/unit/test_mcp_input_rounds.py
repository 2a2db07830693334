"""A server's request for input during a ledger call, the pure rules and the record's round (issue
36, item 1): the ledger's ``input_required`` transitions and stamp, the question names, the
webhook's check of an answer against the sealed question's schema, and what a round records."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.unit.builders import KEYRING

from durable_agents.api.v1alpha1 import (
    REQUEST_STATE_MAX,
    ActionInput,
    ActionRecordSpec,
    ActionRecordStatus,
    ActionState,
    ActionTier,
    RunReference,
)
from durable_agents.core import ledger
from durable_agents.core.agent.mcp_elicitation import MAX_INPUT_ROUNDS, ElicitationQuestion
from durable_agents.core.agent.mcp_questions import (
    admission_refusal,
    answer_refusal,
    question_label,
    question_name,
    question_schema,
)
from durable_agents.core.outcome_stamps import INTEGRITY_FAILED, believed, stamp_outcome
from durable_agents.core.sealed_values import (
    DATA_KEY_ANNOTATION,
    new_data_key,
    seal_value,
    unseal_value,
    wrap_data_key,
)
from durable_agents.shell.effects import Failed, InputRequired
from durable_agents.shell.ledger.input_asked import (
    INPUT_ROUNDS_EXCEEDED,
    REQUEST_STATE_TOO_LARGE,
    asked_input,
)
from durable_agents.shell.ledger.input_rounds import InputRounds

pytestmark = pytest.mark.unit
A = ActionState
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
NAME, KEY = "act-0123", "run-uid/2/book_room"
STAY = {
    "type": "object",
    "properties": {"date": {"type": "string", "format": "date"}, "nights": {"type": "integer", "minimum": 1}},
    "required": ["date", "nights"],
}
QUESTION = ElicitationQuestion("hotel", "book_room", "stay", "When do you arrive?", STAY).for_person()
DATA_KEY = new_data_key(entropy=os.urandom)
SPEC = ActionRecordSpec(
    idempotency_key=KEY,
    run_ref=RunReference(name="r", uid="run-uid"),
    step_index=2,
    effect="mcp.call",
    tier=ActionTier.CONSEQUENTIAL,
)


def asked(round_: int = 1, state: str | None = "opaque") -> ActionInput:
    return ActionInput(
        round=round_, keys=["stay"], questions={"stay": "sealed"}, request_state=state, asked_at=NOW
    )


# --- the ledger ---------------------------------------------------------------------------


def test_input_required_is_entered_from_a_send_and_left_by_a_retry_a_failure_or_a_cancel() -> None:
    for source in (A.INTENT, A.DISPATCHING):  # under a first claim, or a claim
        ledger.check_action_transition(source, A.INPUT_REQUIRED)
    # outcome_unknown: only a call held open while it asked (2025-11-25) and lost (HeldCallLost)
    left = {A.DISPATCHING, A.FAILED, A.CANCELED, A.OUTCOME_UNKNOWN}
    assert ledger.ACTION_TRANSITIONS[A.INPUT_REQUIRED] == left
    with pytest.raises(ledger.IllegalActionTransition):  # nothing was applied while it asks
        ledger.check_action_transition(A.INPUT_REQUIRED, A.SUCCEEDED)
    with pytest.raises(ledger.IllegalActionTransition):
        ledger.check_action_transition(A.OUTCOME_UNKNOWN, A.INPUT_REQUIRED)
    assert A.INPUT_REQUIRED not in ledger.TERMINAL_ACTION_STATES


def test_a_record_asking_for_input_awaits_answers_holds_no_claim_and_keeps_its_round() -> None:
    claimed = ActionRecordStatus(state=A.DISPATCHING, attempts=1, claim_expires_at=NOW + timedelta(seconds=9))
    waiting = ledger.next_status(claimed, A.INPUT_REQUIRED, NOW, "op", timedelta(seconds=11), asked=asked())
    assert waiting.claim_expires_at is None
    assert waiting.input == asked()
    assert isinstance(ledger.next_dispatch_step(waiting, NOW), ledger.AwaitInput)
    retried = ledger.next_status(waiting, A.DISPATCHING, NOW, "op", timedelta(seconds=11), claim=True)
    assert retried.attempts == 2
    assert retried.input == asked(), "the round stays for the next one's number"


def _record(status: dict[str, Any]) -> dict[str, Any]:
    spec = {**SPEC.wire(), "statusStamped": True}
    return {"metadata": {"name": NAME, "namespace": "ns"}, "spec": spec, "status": status}


def test_the_outcome_stamp_covers_the_round_so_a_forged_input_is_not_believed() -> None:
    status = ActionRecordStatus(state=A.INPUT_REQUIRED, attempts=1, input=asked())
    written = {**status.wire(), "stamp": stamp_outcome(KEYRING, NAME, KEY, status)}
    assert believed(_record(written), KEYRING, NOW).status.input == asked()
    held = asked().model_copy(update={"held_open": True})  # flipped: would wait, or send again
    for forged_input in (asked(state="someone-else's"), asked(round_=2), held):
        forged = {**written, "input": forged_input.wire()}
        belief = believed(_record(forged), KEYRING, NOW)
        assert belief.status.state is A.OUTCOME_UNKNOWN
        assert belief.status.reason == INTEGRITY_FAILED
    unstamped = believed(_record(status.wire()), KEYRING, NOW)
    assert unstamped.status.reason == INTEGRITY_FAILED


# --- the questions --------------------------------------------------------------------------


def test_question_names_are_deterministic_request_ids() -> None:
    assert question_name(2, 1, "stay") == "mcp-2-1-stay"
    odd = question_name(2, 3, "Stay Dates!")
    assert odd == question_name(2, 3, "Stay Dates!")
    assert odd.startswith("mcp-2-3-k")
    assert len(odd) <= 63
    assert question_name(2, 3, "a") != question_name(2, 4, "a")


def _runs(answer: str, *, sealed: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    name = question_name(2, 1, "stay")
    question = (
        seal_value(DATA_KEY, QUESTION, question_label(name), entropy=os.urandom) if sealed else QUESTION
    )
    annotation = wrap_data_key(KEYRING, DATA_KEY, "ns", "r", entropy=os.urandom)
    old = {
        "metadata": {"name": "r", "namespace": "ns", "annotations": {DATA_KEY_ANNOTATION: annotation}},
        "spec": {"answers": {}},
        "status": {"checkpoint": {"pendingInput": {"requestId": name, "question": question}}},
    }
    new = {**old, "spec": {"answers": {name: answer}}}
    return new, old


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"action": "accept", "content": {"date": "2030-02-01", "nights": 0}}, "content.nights: 0 is below"),
        ({"action": "accept", "content": {"date": "2030-02-01"}}, "content.nights: required"),
        ({"action": "maybe"}, "action: 'maybe' is not one of"),
    ],
)
def test_the_webhook_refuses_an_answer_that_does_not_match_the_schema_naming_the_field(
    answer: dict[str, Any], said: str
) -> None:
    refused = admission_refusal(*_runs(json.dumps(answer)), KEYRING)
    assert (refused or "").startswith("spec.answers[mcp-2-1-stay]: " + said), refused
    assert admission_refusal(*_runs("not json"), KEYRING) is not None


@pytest.mark.parametrize(
    "answer",
    [
        {"action": "accept", "content": {"date": "2030-02-01", "nights": 3}},
        {"action": "decline"},
        {"action": "cancel"},
    ],
)
def test_the_webhook_admits_a_matching_answer_and_decline_and_cancel(answer: dict[str, Any]) -> None:
    assert admission_refusal(*_runs(json.dumps(answer)), KEYRING) is None


def test_only_a_new_clear_answer_to_a_server_question_is_checked() -> None:
    new, old = _runs("anything")
    old["status"]["checkpoint"]["pendingInput"]["requestId"] = "confirm"  # a run's own question
    assert answer_refusal(new, old, DATA_KEY) is None
    new, old = _runs(seal_value(DATA_KEY, "x", "answers/mcp-2-1-stay", entropy=os.urandom))
    assert answer_refusal(new, old, DATA_KEY) is None, "sealed already: the seal is checked elsewhere"
    assert question_schema(QUESTION) == STAY


# --- what a round records -------------------------------------------------------------------


def test_a_round_records_the_keys_the_state_and_the_questions_sealed_for_the_run() -> None:
    round_ = asked_input(
        ActionRecordStatus(), SPEC, InputRequired({"stay": QUESTION}, {"addr": "refused"}, "s"), DATA_KEY
    )
    assert isinstance(round_, ActionInput)
    assert (round_.round, round_.keys, round_.refused, round_.request_state) == (1, ["stay"], ["addr"], "s")
    assert "arrive" not in json.dumps(round_.questions), "sealed"
    opened = unseal_value(DATA_KEY, round_.questions["stay"], question_label("mcp-2-1-stay"))
    assert opened == QUESTION
    again = asked_input(
        ActionRecordStatus(input=round_), SPEC, InputRequired({"stay": QUESTION}, {}, "t"), None
    )
    assert isinstance(again, ActionInput)
    assert again.round == 2
    assert again.questions == {"stay": QUESTION}


def test_past_the_rounds_or_with_an_oversized_state_the_action_fails_clearly() -> None:
    last = ActionRecordStatus(input=asked(round_=MAX_INPUT_ROUNDS))
    over = asked_input(last, SPEC, InputRequired({"stay": QUESTION}, {}, "s"), None)
    assert isinstance(over, Failed)
    assert over.reason == INPUT_ROUNDS_EXCEEDED
    assert f"at most {MAX_INPUT_ROUNDS} rounds" in over.message
    assert "nothing was applied" in over.message
    big = asked_input(
        ActionRecordStatus(), SPEC, InputRequired({"stay": QUESTION}, {}, "x" * (REQUEST_STATE_MAX + 1)), None
    )
    assert isinstance(big, Failed)
    assert big.reason == REQUEST_STATE_TOO_LARGE


# --- the dispatcher's second line -----------------------------------------------------------


def _answered_run(answer: str) -> dict[str, Any]:
    """A run without a data key (its answers believed as written) whose checkpoint recorded the
    answer to ``mcp-2-1-stay``: as with the webhook off, nothing checked it at admission."""
    uri = "agentrun://ns/r/spec.answers/mcp-2-1-stay"
    return {
        "metadata": {"name": "r", "namespace": "ns"},
        "spec": {"answers": {"mcp-2-1-stay": answer}},
        "status": {"checkpoint": {"inputRefs": [{"id": "answer-mcp-2-1-stay", "uri": uri}]}},
    }


def test_the_dispatcher_parses_the_answer_again_so_a_bad_one_is_never_sent() -> None:
    rounds = InputRounds(None, None, None)  # type: ignore[arg-type]  # _answer reads nothing else
    round_ = ActionInput(round=1, keys=["stay"], questions={"stay": QUESTION}, asked_at=NOW)
    refs = {"answer-mcp-2-1-stay": "agentrun://ns/r/spec.answers/mcp-2-1-stay"}
    good = json.dumps({"action": "accept", "content": {"date": "2030-02-01", "nights": 2}})
    taken = rounds.answer_of(_answered_run(good), SPEC, round_, "stay", refs, None)
    assert (taken.action, taken.content) == ("accept", {"date": "2030-02-01", "nights": 2})
    bad = json.dumps({"action": "accept", "content": {"date": "2030-02-01", "nights": 0}})
    with pytest.raises(Exception, match=r"spec.answers\[mcp-2-1-stay\]: content.nights: 0 is below"):
        rounds.answer_of(_answered_run(bad), SPEC, round_, "stay", refs, None)


def test_a_question_asked_while_the_call_is_held_open_keeps_its_senders_claim_then_is_given_up() -> None:
    """2025-11-25: the sender holds the call open; its claim lasts the hold. Once it expires (the
    operator restarted, lost its claim) the call is gone: outcome unknown, never sent again here."""
    claimed = ActionRecordStatus(state=A.DISPATCHING, attempts=1, claim_expires_at=NOW + timedelta(seconds=9))
    until = NOW + timedelta(minutes=10)
    held_open = asked(state=None).model_copy(update={"held_open": True})
    waiting = ledger.next_status(
        claimed, A.INPUT_REQUIRED, NOW, "op", timedelta(seconds=11), asked=held_open, claim_until=until
    )
    assert waiting.claim_expires_at == until
    assert ledger.next_dispatch_step(waiting, NOW) == ledger.WaitUntil(until), "not sent again meanwhile"
    assert isinstance(ledger.next_dispatch_step(waiting, until), ledger.GiveUpClaim)
    lost = ledger.next_status(waiting, A.OUTCOME_UNKNOWN, until, "op2", timedelta(seconds=11))
    assert (lost.attempts, lost.claim_expires_at) == (1, None)
