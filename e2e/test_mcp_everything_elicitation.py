"""The reference server asks while the call is open (protocol 2025-11-25, issue 36 item 1):
``@modelcontextprotocol/server-everything``'s ``trigger-elicitation-request`` sends
``elicitation/create`` during the ``tools/call``. A model-planned run's approved call is held open:
the ActionRecord waits ``input_required`` (its question sealed, marked ``heldOpen``, no request
state), the run waits in ``waiting_input`` on the server's question; an answer that does not match
the server's schema is refused by the admission webhook naming the field; the right one goes back
on the open call, which completes: the model receives the tool's result.

Nobody answering within the policy's ``mcp.holdOpen``: the server is told ``cancel``, the question
closes (``HeldPastBound``) and the call completes once. Another test SIGKILLs the operator while
the call is held: the call is gone, so the question closes and the action's outcome is
``outcome_unknown`` (Warning Event ``HeldCallLost``), to be reconciled like any other; nothing is
sent again. Unless the policy trusts the tool as idempotent (``spec.mcp.idempotentTools``): then
the call is sent again under the same key (``HeldCallResent``), the server asks again, and the
answer completes the run (two attempts; server-everything keeps no record by key, so the ledger's
attempts and key are what is checked).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from e2e.test_agent import agent_namespace, agent_spec, model
from e2e.test_agent_results import tool_results
from e2e.test_mcp_everything import approve_each, everything, everything_entry, script

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.kubectl.answer import AnswerError, answer
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.mcpeverything import EverythingServer
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

__all__ = ["agent_namespace", "everything", "everything_entry", "model"]  # fixtures

pytestmark = pytest.mark.local_plane("webhook")
TOOL = "trigger-elicitation-request"
WRONG = json.dumps({"action": "accept", "content": {"integer": 7}})  # "name" is required
RIGHT = json.dumps({"action": "accept", "content": {"name": "Ada Lovelace", "integer": 7}})


def _record(runs: Runs, name: str) -> dict[str, Any]:
    listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
    (record,) = [r for r in listed["items"] if r["spec"]["runRef"]["name"] == name]
    return record


def _spec(model: ModelServerThread, refsystem: ReferenceSystemThread, everything: EverythingServer) -> Any:
    model.set_script(script([(TOOL, {})]))
    spec = agent_spec(model, refsystem)
    spec["agent"]["tools"] = []
    spec["agent"]["mcpServers"] = [{"name": "everything", "url": everything.url, "tools": [TOOL]}]
    return spec


def _held(runs: Runs, name: str) -> str:
    """The run, approved, waiting on the server's question while the call is held; its name."""
    assert approve_each(runs, name, 1)[0]["effect"] == "mcp.call"
    run = runs.wait_state(name, "waiting_input", timeout=Within.RUN)
    waiting = run["status"]["waitingFor"]
    assert re.fullmatch(r"input:mcp-[0-9]+-1-\S+", waiting), waiting
    question = waiting.removeprefix("input:")
    assert run["status"]["checkpoint"]["pendingInput"]["requestId"] == question
    status = _record(runs, name)["status"]
    assert status["state"] == "input_required", status
    held = status["input"]
    assert (held["heldOpen"], held["round"]) == (True, 1), held
    assert not held.get("requestState"), "a call held open echoes no state"
    assert status["attempts"] == 1, status
    assert "legal name" not in json.dumps(status), "the server's question is sealed in the record"
    return question


def test_a_question_asked_while_the_call_is_open_is_answered_on_the_run_and_the_call_completes(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
) -> None:
    spec = _spec(model, refsystem, everything)
    op = webhook_operator("mcp-everything-elicitation")
    name = runs.create(spec)
    question = _held(runs, name)
    with pytest.raises(AnswerError) as refused:
        answer(runs.custom, runs.namespace, name, WRONG, question)
    assert f"spec.answers[{question}]: content.name: required" in str(refused.value), refused.value
    said = answer(runs.custom, runs.namespace, name, RIGHT, question)
    assert f"answered as spec.answers[{question!r}]" in said
    done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
    assert done["status"]["state"] == "completed", (done["status"].get("outcome"), everything.output())
    record = _record(runs, name)
    assert record["status"]["state"] == "succeeded", record["status"]
    assert record["status"]["attempts"] == 1, "one call, held open: never sent again"
    told = json.dumps(tool_results(model.calls()["requests"], TOOL))
    assert "User provided the requested information" in told, told
    assert "Name: Ada Lovelace" in told, told
    assert "Favorite Integer: 7" in told, told
    assert not op.logged("Traceback")


def test_a_held_call_lost_with_its_operator_closes_the_question_and_leaves_the_outcome_unknown(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
) -> None:
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "refunds", {"spec": {"mcp": {"holdOpen": "15s"}}}
    )
    spec = _spec(model, refsystem, everything)
    first = webhook_operator("mcp-everything-elicitation-1")
    name = runs.create(spec)
    question = _held(runs, name)
    first.kill()
    webhook_operator("mcp-everything-elicitation-2")

    def lost() -> dict[str, Any] | None:
        status = _record(runs, name)["status"]
        return status if status["state"] == "outcome_unknown" else None

    status = eventually(lost, Within.RUN, "the held call's action to become outcome_unknown")
    assert status["attempts"] == 1, "nothing sent again"
    record = _record(runs, name)["metadata"]["name"]
    told = runs.wait_event(record, "HeldCallLost")
    assert "question waited was lost" in told[0].message

    def closed() -> dict[str, Any] | None:
        run = runs.get(name)
        return run if run["status"].get("state") != "waiting_input" else None

    run = eventually(closed, Within.RUN, f"the question {question} to close")
    assert not run["status"]["checkpoint"].get("pendingInput"), run["status"]["checkpoint"]
    assert f"question {question} closed unanswered" in json.dumps(run["status"]), run["status"]
    with pytest.raises(AnswerError):  # the question is closed: no answer is taken for it
        answer(runs.custom, runs.namespace, name, RIGHT, question)
    assert _record(runs, name)["status"]["attempts"] == 1


def test_a_held_call_nobody_answers_within_the_policy_bound_is_told_cancel_and_completes(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
) -> None:
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "refunds", {"spec": {"mcp": {"holdOpen": "4s"}}}
    )
    spec = _spec(model, refsystem, everything)
    start_operator("mcp-everything-elicitation-bound")
    name = runs.create(spec)
    question = _held(runs, name)
    done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
    assert done["status"]["state"] == "completed", done["status"].get("outcome")
    assert f"question {question} closed unanswered: HeldPastBound" in json.dumps(done["status"]), done[
        "status"
    ]
    record = _record(runs, name)["status"]
    assert (record["state"], record["attempts"]) == ("succeeded", 1), record
    told = json.dumps(tool_results(model.calls()["requests"], TOOL))
    assert "User cancelled the elicitation dialog" in told, told


def test_a_held_call_lost_whose_tool_the_policy_trusts_as_idempotent_is_sent_again_under_its_key(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
) -> None:
    trusted = {"holdOpen": "15s", "idempotentTools": [{"url": everything.url, "tools": [TOOL]}]}
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "refunds", {"spec": {"mcp": trusted}}
    )
    spec = _spec(model, refsystem, everything)
    first = webhook_operator("mcp-everything-elicitation-resend-1")
    name = runs.create(spec)
    question = _held(runs, name)
    before = _record(runs, name)
    first.kill()
    second = webhook_operator("mcp-everything-elicitation-resend-2")

    def asked_again() -> str | None:
        run = runs.get(name)
        waiting = str(run["status"].get("waitingFor") or "")
        return waiting.removeprefix("input:") if re.fullmatch(r"input:mcp-[0-9]+-2-\S+", waiting) else None

    again = eventually(asked_again, Within.RUN, "the call sent again, its server asking again (round 2)")
    record = _record(runs, name)
    assert record["metadata"]["name"] == before["metadata"]["name"], "the same record"
    assert record["spec"]["idempotencyKey"] == before["spec"]["idempotencyKey"], "under the same key"
    status = record["status"]
    assert (status["state"], status["attempts"], status["input"]["round"]) == ("input_required", 2, 2), status
    assert status["input"]["heldOpen"] is True, status
    resent = runs.wait_event(record["metadata"]["name"], "HeldCallResent")
    events = runs.events(record["metadata"]["name"])
    assert "idempotent" in resent[0].message, resent[0].message
    assert not [e for e in events if e.reason == "HeldCallLost"], "not given up: sent again"
    assert f"question {question} closed unanswered" in json.dumps(runs.get(name)["status"])
    with pytest.raises(AnswerError):  # the lost call's question is closed
        answer(runs.custom, runs.namespace, name, RIGHT, question)
    answer(runs.custom, runs.namespace, name, RIGHT, again)
    done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
    assert done["status"]["state"] == "completed", (done["status"].get("outcome"), everything.output())
    status = _record(runs, name)["status"]
    assert (status["state"], status["attempts"]) == ("succeeded", 2), status
    told = json.dumps(tool_results(model.calls()["requests"], TOOL))
    assert "Name: Ada Lovelace" in told, told
    assert not second.logged("Traceback")
