"""The model planner in the engine: the model is asked from the checkpoint's facts, what it proposes
is recorded before anything acts on it, a read's result goes back to it sealed, an effect becomes an
intent whose arguments stay sealed, bad calls are returned to it a bounded number of times, and a
failed call is a retry window (or a failure, when retrying cannot help)."""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any

import pytest
from tests.unit.builders import (
    EPOCH,
    KEYRING,
    RETRY_3,
    SETTINGS,
    T0,
    apply,
    at,
    checkpoint_of,
    commit_of,
    evidence_for,
    new_run,
    snap,
)

from durable_agents.api.v1alpha1 import ActionState, ObjectReference
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.agent.exchange import ModelReply, ToolCall, Usage
from durable_agents.core.agent.limits import AgentLimits
from durable_agents.core.agent.planner import AgentInputs, ModelPlanner
from durable_agents.core.agent.tools import ask_human_tool, effect_tool, read_tool
from durable_agents.core.agent_facts import ANSWER_LABEL, turn_label, turn_result_text
from durable_agents.core.engine import (
    ActionObservation,
    Commit,
    Decision,
    ModelAnswer,
    NeedModelTurn,
    NeedRead,
    Observations,
    ReadResult,
    Settings,
    decide,
)
from durable_agents.core.ledger import action_record_name
from durable_agents.core.sealed_values import (
    DATA_KEY_ANNOTATION,
    is_sealed,
    new_data_key,
    outcome_label,
    seal_value,
    step_label,
    unseal_value,
    wrap_data_key,
)
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit

KEY = new_data_key(entropy=os.urandom)
TARGET = {"url": "http://127.0.0.1:9/pay"}
TOOLS = (
    read_tool("read_config", "read a ConfigMap", api_version="v1", kind="ConfigMap"),
    effect_tool(
        "pay",
        "pay an amount",
        effect="http.post",
        target=TARGET,
        parameters={"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]},
    ),
)
OBJECTIVE = "pay what the settings say"


def planner(**limits: int) -> ModelPlanner:
    return ModelPlanner(
        AgentInputs(
            model="reference-model",
            system_prompt="You operate payments.",
            tools=TOOLS,
            data_key=KEY,
            limits=AgentLimits(**limits),
            entropy=os.urandom,
        )
    )


def reply(*calls: tuple[str, str], content: str | None = "because") -> ModelReply:
    return ModelReply(
        model="reference-model",
        content=content,
        tool_calls=tuple(ToolCall(f"call_{i}", name, args) for i, (name, args) in enumerate(calls)),
        usage=Usage(input_tokens=100, output_tokens=10),
    )


def decide_with(
    obj: dict[str, Any],
    plan: ModelPlanner,
    now: datetime,
    *,
    read: ReadResult | None = None,
    model: ModelAnswer | None = None,
) -> Decision:
    return decide(
        snap(obj),
        now=now,
        epoch=EPOCH,
        planner=plan,
        settings=SETTINGS,
        observed=Observations(read=read, model=model),
    )


def asked(obj: dict[str, Any], plan: ModelPlanner, now: datetime) -> NeedModelTurn:
    need = decide_with(obj, plan, now)
    assert isinstance(need, NeedModelTurn), need
    return need


def answered(obj: dict[str, Any], plan: ModelPlanner, now: datetime, answer: ModelReply) -> Decision:
    need = asked(obj, plan, now)
    return decide_with(obj, plan, now, model=ModelAnswer(need.request.digest(), reply=answer))


def accepted(plan: ModelPlanner) -> dict[str, Any]:
    obj = new_run(objective=OBJECTIVE)
    return apply(obj, commit_of(decide_with(obj, plan, T0)))


def test_a_proposed_read_is_recorded_then_read_then_its_result_goes_back_to_the_model() -> None:
    plan = planner()
    obj = accepted(plan)
    first = asked(obj, plan, at(1))
    messages = first.request.body()["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == OBJECTIVE
    assert first.request.body()["parallel_tool_calls"] is False

    proposed = commit_of(answered(obj, plan, at(1), reply(("read_config", '{"name": "settings"}'))))
    assert (proposed.event, proposed.state) == (RunEvent.STEP_COMPLETED, RunState.READY)
    facts = checkpoint_of(proposed).agent
    assert facts is not None
    [turn] = facts.turns
    assert (turn.tool, turn.outcome, turn.step_index) == ("read_config", "pending", 0)
    assert is_sealed(turn.arguments)
    obj = apply(obj, proposed)

    need = decide_with(obj, plan, at(2))
    assert need == NeedRead(
        0, "agent-0", ObjectReference(api_version="v1", kind="ConfigMap", name="settings")
    )
    content = {"data": {"amount": "forty-two!euros"}}
    read = ReadResult(0, evidence=evidence_for(0, "agent-0"), content=content)
    done = commit_of(decide_with(obj, plan, at(2), read=read))
    cp = checkpoint_of(done)
    assert cp.position.step == 1
    assert cp.agent is not None
    settled = cp.agent.turns[0]
    assert settled.outcome == "succeeded"
    assert json.loads(turn_result_text(settled, KEY) or "null")["object"] == content
    assert "forty-two!euros" not in json.dumps(done.wire_status()), "the object is sealed in the checkpoint"
    obj = apply(obj, done)

    again = asked(obj, plan, at(3))
    tool_message = again.request.body()["messages"][-1]
    assert tool_message["role"] == "tool"
    assert '"amount":"forty-two!euros"' in tool_message["content"]
    finished = commit_of(answered(obj, plan, at(3), reply(content="paid nothing: done")))
    assert (finished.event, finished.state) == (RunEvent.SUCCEEDED, RunState.COMPLETED)
    assert finished.status.outcome is not None
    result = finished.status.outcome.result
    assert result is not None
    assert "paid nothing" not in result, "the model's answer is its output: sealed"
    assert unseal_value(KEY, result, ANSWER_LABEL) == "paid nothing: done"


def test_the_same_facts_ask_the_same_request_and_a_stale_answer_is_not_taken() -> None:
    """A crash between boundaries repeats the call: the request is rebuilt byte for byte, and an
    answer to another request (an earlier state of the run) is never applied to this one."""
    plan = planner()
    obj = accepted(plan)
    first, again = asked(obj, plan, at(1)), asked(obj, plan, at(5))
    assert first.request.canonical_bytes() == again.request.canonical_bytes()
    stale = ModelAnswer("sha256:" + "0" * 64, reply=reply(("pay", '{"amount": 1}')))
    assert isinstance(decide_with(obj, plan, at(1), model=stale), NeedModelTurn)


def test_a_proposed_payment_is_an_intent_at_the_declared_target_with_sealed_arguments() -> None:
    plan = planner()
    obj = accepted(plan)
    obj = apply(obj, commit_of(answered(obj, plan, at(1), reply(("pay", '{"amount": 42}')))))
    intent = commit_of(decide_with(obj, plan, at(2)))
    assert (intent.event, intent.state) == (RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL)
    [spec] = intent.intents
    assert spec.effect == "http.post"
    assert spec.target == TARGET
    assert is_sealed(spec.arguments), "the model's arguments never reach the ledger in plaintext"
    assert unseal_value(KEY, spec.arguments, turn_label(0, "arguments")) == {"amount": 42}
    # Recomputed (a lost record recreated, the dispatcher's check): the very same intent.
    again = commit_of(decide_with(obj, plan, at(3)))
    assert again.intents == intent.intents


def test_bad_calls_go_back_to_the_model_a_bounded_number_of_times() -> None:
    plan = planner(max_consecutive_tool_errors=2)
    obj = accepted(plan)
    refused = commit_of(answered(obj, plan, at(1), reply(("transfer_everything", "{}"))))
    assert refused.event is RunEvent.STEP_COMPLETED
    assert "refused" in refused.detail
    obj = apply(obj, refused)
    told = asked(obj, plan, at(2)).request.body()["messages"][-1]
    assert told["role"] == "tool"
    assert "transfer_everything" in told["content"]
    failed = commit_of(answered(obj, plan, at(2), reply(("pay", '{"amount": "lots"}'))))
    assert (failed.event, failed.state) == (RunEvent.ATTEMPT_FAILED, RunState.FAILED)
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "ToolCallsInvalid"


@pytest.mark.parametrize(("retryable", "state"), [(True, RunState.WAITING_RETRY), (False, RunState.FAILED)])
def test_a_failed_model_call_is_a_retry_window_unless_retrying_cannot_help(
    retryable: bool, state: RunState
) -> None:
    plan = planner()
    obj = new_run(objective=OBJECTIVE)
    obj = apply(obj, commit_of(decide(snap(obj), now=T0, epoch=EPOCH, planner=plan, settings=RETRY_3)))
    need = decide(snap(obj), now=at(1), epoch=EPOCH, planner=plan, settings=RETRY_3)
    assert isinstance(need, NeedModelTurn)
    failure = ModelAnswer(
        need.request.digest(),
        failure_reason="ModelTimeout",
        failure_message="no answer in 60s",
        retryable=retryable,
    )
    out = commit_of(
        decide(
            snap(obj),
            now=at(1),
            epoch=EPOCH,
            planner=plan,
            settings=RETRY_3,
            observed=Observations(model=failure),
        )
    )
    assert out.state is state
    assert "ModelTimeout" in (out.status.outcome.reason if out.status.outcome else out.detail)


def test_a_run_over_its_model_call_limit_fails_with_the_limit_named() -> None:
    plan = planner(max_model_calls=1)
    obj = accepted(plan)
    obj = apply(obj, commit_of(answered(obj, plan, at(1), reply(("read_config", '{"name": "settings"}')))))
    read = ReadResult(0, evidence=evidence_for(0, "agent-0"), content={"data": {}})
    obj = apply(obj, commit_of(decide_with(obj, plan, at(2), read=read)))
    over = commit_of(decide_with(obj, plan, at(3)))
    assert (over.event, over.state) == (RunEvent.ATTEMPT_FAILED, RunState.FAILED)
    assert over.status.outcome is not None
    assert over.status.outcome.reason == "AgentLimitExceeded"


def test_facts_recorded_under_another_prompt_are_not_fed_to_the_new_one() -> None:
    """The prompt (a ConfigMap the run names) changed mid-run: the next model call would mix the
    old facts with the new prompt, so the attempt fails saying what changed."""
    plan = planner()
    obj = accepted(plan)
    obj = apply(obj, commit_of(answered(obj, plan, at(1), reply(("read_config", '{"name": "settings"}')))))
    read = ReadResult(0, evidence=evidence_for(0, "agent-0"), content={"data": {}})
    obj = apply(obj, commit_of(decide_with(obj, plan, at(2), read=read)))
    changed = ModelPlanner(
        AgentInputs(
            model="reference-model",
            system_prompt="You operate refunds.",
            tools=TOOLS,
            data_key=KEY,
            entropy=os.urandom,
        )
    )
    failed = commit_of(decide_with(obj, changed, at(3)))
    assert failed.event is RunEvent.ATTEMPT_FAILED
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "PlannerError"
    assert "system prompt" in failed.status.outcome.message


def test_a_question_the_model_asks_is_sealed_where_the_run_waits() -> None:
    tools = (*TOOLS, ask_human_tool("ask_oncall", "ask the on-call engineer"))
    plan = ModelPlanner(
        AgentInputs(model="reference-model", system_prompt="p", tools=tools, data_key=KEY, entropy=os.urandom)
    )
    obj = accepted(plan)
    question = '{"question": "May I pay 42 EUR to ACME?"}'
    obj = apply(obj, commit_of(answered(obj, plan, at(1), reply(("ask_oncall", question)))))
    waiting = commit_of(decide_with(obj, plan, at(2)))
    assert waiting.state is RunState.WAITING_INPUT
    pending = checkpoint_of(waiting).pending_input
    assert pending is not None
    assert "ACME" not in json.dumps(waiting.wire_status()), "the model's question is sealed"
    assert (
        unseal_value(KEY, pending.question, step_label("agent-0", "question")) == "May I pay 42 EUR to ACME?"
    )


def test_a_read_the_run_may_not_make_is_told_to_the_model_not_a_failure_of_the_run() -> None:
    plan = planner()
    obj = accepted(plan)
    obj = apply(obj, commit_of(answered(obj, plan, at(1), reply(("read_config", '{"name": "secrets"}')))))
    why = "ServiceAccount t/default may not read ConfigMap t/secrets"
    told = commit_of(
        decide_with(obj, plan, at(2), read=ReadResult(0, error_reason="Forbidden", error_message=why))
    )
    assert (told.event, told.state) == (RunEvent.STEP_COMPLETED, RunState.READY)
    cp = checkpoint_of(told)
    assert cp.position.step == 1
    assert cp.agent is not None
    assert cp.agent.turns[0].outcome == "failed"
    obj = apply(obj, told)
    tool_message = asked(obj, plan, at(3)).request.body()["messages"][-1]
    assert tool_message["role"] == "tool"
    assert "Forbidden" in tool_message["content"]
    assert why in tool_message["content"]


@pytest.mark.parametrize("content", [None, "", " \n"])
def test_an_empty_reply_is_a_retryable_model_error_never_the_runs_answer(content: str | None) -> None:
    """Issue 30 (6): a reply with no content and no tool call used to complete the run with an
    empty answer. It is no answer at all: a retry window under the policy (the shell names the
    endpoint before this; the core refuses it whoever hands it over)."""
    plan = planner()
    obj = new_run(objective=OBJECTIVE)
    obj = apply(obj, commit_of(decide(snap(obj), now=T0, epoch=EPOCH, planner=plan, settings=RETRY_3)))
    need = decide(snap(obj), now=at(1), epoch=EPOCH, planner=plan, settings=RETRY_3)
    assert isinstance(need, NeedModelTurn)
    empty = ModelAnswer(need.request.digest(), reply=reply(content=content))
    out = commit_of(
        decide(
            snap(obj),
            now=at(1),
            epoch=EPOCH,
            planner=plan,
            settings=RETRY_3,
            observed=Observations(model=empty),
        )
    )
    assert (out.event, out.state) == (RunEvent.RETRY_SCHEDULED, RunState.WAITING_RETRY)
    assert out.detail.startswith("model call failed: ModelReplyEmpty: the model answered with no content")


def test_further_calls_of_a_reply_are_recorded_on_the_turn_and_in_the_history() -> None:
    plan = planner()
    obj = accepted(plan)
    several = reply(("read_config", '{"name": "settings"}'), ("pay", '{"amount": 5}'), ("pay", "{}"))
    out = commit_of(answered(obj, plan, at(1), several))
    assert out.event is RunEvent.STEP_COMPLETED
    (turn,) = out.checkpoint["agent"]["turns"]
    assert (turn["tool"], turn["droppedTools"]) == ("read_config", ["pay", "pay"])
    assert out.detail.endswith("; not executed (one call per turn): pay, pay")


def test_an_answer_to_the_model_s_question_is_given_only_once_its_seal_proves_it() -> None:
    """A hand-written (unsealed) answer to the model's question is refused and never reaches the
    model; the run asks again as ``agent-0.2``, and the sealed answer to that key is what the model
    is given."""
    settings = Settings(keyring=KEYRING)
    tools = (*TOOLS, ask_human_tool("ask_oncall", "ask the on-call engineer"))
    plan = ModelPlanner(
        AgentInputs(model="reference-model", system_prompt="p", tools=tools, data_key=KEY, entropy=os.urandom)
    )

    def decided(obj: dict[str, Any], now: datetime, model: ModelAnswer | None = None) -> Decision:
        return decide(
            snap(obj),
            now=now,
            epoch=EPOCH,
            planner=plan,
            settings=settings,
            observed=Observations(model=model),
        )

    def until_idle_or_model(obj: dict[str, Any], now: datetime) -> tuple[dict[str, Any], Decision]:
        for _ in range(20):
            decision = decided(obj, now)
            if not isinstance(decision, Commit):
                return obj, decision
            obj = apply(obj, decision)
        raise AssertionError("no idle")

    obj = new_run(objective=OBJECTIVE)
    obj["metadata"]["annotations"] = {
        DATA_KEY_ANNOTATION: wrap_data_key(KEYRING, KEY, "team-a", "run-1", entropy=os.urandom)
    }
    obj, need = until_idle_or_model(obj, T0)
    assert isinstance(need, NeedModelTurn)
    question = '{"question": "May I pay 42 EUR to ACME?"}'
    obj = apply(
        obj,
        commit_of(decided(obj, at(1), ModelAnswer(need.request.digest(), reply(("ask_oncall", question))))),
    )
    obj, _ = until_idle_or_model(obj, at(2))
    assert obj["status"]["waitingFor"] == "input:agent-0"

    forged = {**obj, "spec": {**obj["spec"], "answers": {"agent-0": "yes, pay 4200"}}}
    obj, _ = until_idle_or_model(forged, at(3))
    assert obj["status"]["waitingFor"] == "input:agent-0.2"
    assert [(r["key"], r["reason"]) for r in obj["status"]["refusedRequests"]] == [("agent-0", "Unsealed")]

    real = seal_value(KEY, "yes, pay 42", "answers/agent-0.2", entropy=os.urandom)
    obj = {**obj, "spec": {**obj["spec"], "answers": {**obj["spec"]["answers"], "agent-0.2": real}}}
    obj, need = until_idle_or_model(obj, at(4))
    assert isinstance(need, NeedModelTurn)
    told = json.dumps(need.request.body()["messages"][-1])
    assert "yes, pay 42" in told
    assert "4200" not in told, "the refused answer never reaches the model"


# --- the response of a consequential call reaches the model --------------------------------------


def _paid(plan: ModelPlanner) -> tuple[dict[str, Any], str]:
    """A run whose model proposed a payment, waiting on its intent; and the intent's record name."""
    obj = accepted(plan)
    obj = apply(obj, commit_of(answered(obj, plan, at(1), reply(("pay", '{"amount": 42}')))))
    intent = commit_of(decide_with(obj, plan, at(2)))
    [spec] = intent.intents
    return apply(obj, intent), action_record_name(spec.idempotency_key)


def _observed(
    obj: dict[str, Any], plan: ModelPlanner, now: datetime, seen: ActionObservation, name: str
) -> Decision:
    return decide(
        snap(obj),
        now=now,
        epoch=EPOCH,
        planner=plan,
        settings=SETTINGS,
        observed=Observations(actions={name: seen}),
    )


def test_the_response_the_ledger_recorded_is_the_model_s_next_input_sealed_in_the_outcome_s_commit() -> None:
    """An effect that succeeded: its response, as the ActionRecord's (sealed) outcome holds it, is
    settled into the model's turn in the very commit that records the outcome, so a restart after it
    gives the model the same response without asking the ledger, let alone the effect, again."""
    plan = planner()
    obj, name = _paid(plan)
    response = {"status": 201, "receipt": "tx-7731", "body": {"receipt": "tx-7731", "note": "paid 42"}}
    sealed = seal_value(KEY, response, outcome_label(name), entropy=os.urandom)
    received = commit_of(_observed(obj, plan, at(3), ActionObservation(ActionState.SUCCEEDED, sealed), name))
    assert received.event is RunEvent.EXTERNAL_RECEIVED
    cp = checkpoint_of(received)
    assert cp.agent is not None
    [turn] = cp.agent.turns
    assert turn.outcome == "succeeded"
    assert json.loads(turn_result_text(turn, KEY) or "null") == {
        "step": 0,
        "outcome": "succeeded",
        "error": None,
        "response": response,
    }
    assert "tx-7731" not in json.dumps(received.wire_status()), "the response is sealed in the checkpoint"
    obj = apply(obj, received)
    obj = apply(obj, commit_of(decide_with(obj, plan, at(4))))  # revalidated: ready again
    tool_message = asked(obj, plan, at(5)).request.body()["messages"][-1]
    assert tool_message["role"] == "tool"
    assert '"receipt":"tx-7731"' in tool_message["content"]
    assert '"note":"paid 42"' in tool_message["content"]


def test_a_response_that_does_not_open_under_its_record_s_label_is_not_given_to_the_model() -> None:
    """A sealed outcome moved from another record (or sealed under another key) does not open here:
    the model is told the response cannot be opened, never given what it holds."""
    plan = planner()
    obj, name = _paid(plan)
    moved = seal_value(
        KEY, {"status": 201, "body": "tx-other"}, outcome_label("ar-other"), entropy=os.urandom
    )
    received = commit_of(_observed(obj, plan, at(3), ActionObservation(ActionState.SUCCEEDED, moved), name))
    cp = checkpoint_of(received)
    assert cp.agent is not None
    told = turn_result_text(cp.agent.turns[0], KEY) or ""
    assert "tx-other" not in told
    assert "cannot be opened" in told


def test_a_failed_effect_is_still_the_attempt_s_failure_not_settled_with_the_outcome() -> None:
    """Only a success is settled into the turn with the outcome's commit: a failure goes through
    resume validation as before (the attempt fails, or retries)."""
    plan = planner()
    obj, name = _paid(plan)
    seen = ActionObservation(ActionState.FAILED, None, "HTTP403", "POST answered 403")
    received = commit_of(_observed(obj, plan, at(3), seen, name))
    cp = checkpoint_of(received)
    assert cp.agent is not None
    assert cp.agent.turns[0].outcome == "pending"
    assert cp.position.step == 0
