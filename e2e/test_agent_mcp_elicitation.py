"""A server that asks for input before it completes a consequential call (issue 36, item 1), on
the operator's path: a model-planned run's approved call of the asking reference server's
``book_room`` (2026-07-28: an ``InputRequiredResult`` with request state) leaves its ActionRecord
``input_required`` (nothing applied, never ``outcome_unknown``; the server's question sealed), the
run waits in ``waiting_input`` on the question ``mcp-<step>-1-stay``; an answer that does not match
the requested schema is refused by the admission webhook naming the field; the right one is taken,
and the same action is sent again (same key) with the answer and the echoed state: booked once.

The second test SIGKILLs the operator and restarts the server while the question is unanswered:
the operator's successor takes the answer and books once (everything is in the ActionRecord and
the run's checkpoint; the server's state comes back echoed, nothing of its process is needed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from e2e.test_agent import agent_namespace, agent_spec, approve, model
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.kubectl.answer import AnswerError, answer
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.mcpasking import AskingServerThread
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

__all__ = ["agent_namespace", "model"]  # the fixtures, as test_agent defines them

pytestmark = pytest.mark.local_plane("webhook")
WRONG = json.dumps({"action": "accept", "content": {"date": "2026-08-01", "nights": 0}})
RIGHT = json.dumps({"action": "accept", "content": {"date": "2026-08-01", "nights": 3}})


def booking_script() -> dict[str, Any]:
    return {
        "model": "scripted-refunds",
        "rules": [
            {
                "when": {"notCalled": ["book_room"]},
                "content": "Booking the room.",
                "toolCalls": [{"name": "book_room", "arguments": {"room": "7"}}],
            },
            {"when": {"called": ["book_room"]}, "content": "Done."},
        ],
    }


def _record(runs: Runs, name: str) -> dict[str, Any]:
    listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
    (record,) = [r for r in listed["items"] if r["spec"]["runRef"]["name"] == name]
    return record


def _asked(runs: Runs, name: str, model: ModelServerThread, hotel: AskingServerThread) -> str:
    """The run, approved, waiting on the server's question; the question's name."""
    assert approve(runs, name)["effect"] == "mcp.call"
    run = runs.wait_state(name, "waiting_input", timeout=Within.RUN)
    waiting = run["status"]["waitingFor"]
    assert re.fullmatch(r"input:mcp-[0-9]+-1-stay", waiting), waiting
    question = waiting.removeprefix("input:")
    pending = run["status"]["checkpoint"]["pendingInput"]
    assert pending["requestId"] == question
    assert "arrive" not in json.dumps(run["status"]), "the server's question is sealed on the run"
    status = _record(runs, name)["status"]
    assert status["state"] == "input_required", status
    assert (status["input"]["round"], status["input"]["keys"]) == (1, ["stay"]), status["input"]
    assert status["input"]["requestState"], "the server's state is kept to be echoed"
    assert "arrive" not in json.dumps(status), "the server's question is sealed in the record"
    assert (hotel.asked(), hotel.applications()) == (1, []), "asked once, nothing booked"
    return question


def _booked_once(runs: Runs, name: str, hotel: AskingServerThread) -> None:
    done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
    assert done["status"]["state"] == "completed", done["status"].get("outcome")
    record = _record(runs, name)
    assert record["status"]["state"] == "succeeded", record["status"]
    assert record["status"]["attempts"] == 2, "sent twice: asked, then answered"
    assert hotel.applications() == [record["spec"]["idempotencyKey"]], "booked once, under the same key"


def _spec(
    model: ModelServerThread, refsystem: ReferenceSystemThread, hotel: AskingServerThread
) -> dict[str, Any]:
    model.set_script(booking_script())
    spec = agent_spec(model, refsystem)
    spec["agent"]["tools"] = []
    spec["agent"]["mcpServers"] = [{"name": "hotel", "url": hotel.url, "tools": ["book_room"]}]
    return spec


def test_a_server_question_is_asked_on_the_run_checked_answered_and_the_call_retried_once(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    with AskingServerThread() as hotel:
        spec = _spec(model, refsystem, hotel)
        webhook_operator("agent-mcp-elicitation")
        name = runs.create(spec)
        question = _asked(runs, name, model, hotel)
        with pytest.raises(AnswerError, match="does not wait on question 'mcp-9-9-stay'"):
            answer(runs.custom, runs.namespace, name, RIGHT, "mcp-9-9-stay")
        with pytest.raises(AnswerError) as refused:
            answer(runs.custom, runs.namespace, name, WRONG, question)
        assert f"spec.answers[{question}]: content.nights: 0 is below the minimum 1" in str(refused.value)
        with pytest.raises(ApiException) as not_json:  # straight to the API server: the same webhook
            runs.custom.patch_namespaced_custom_object(
                GROUP, VERSION, runs.namespace, "agentruns", name, {"spec": {"answers": {question: "3"}}}
            )
        assert "content" in str(not_json.value.body) or "JSON object" in str(not_json.value.body)
        assert hotel.applications() == [], "nothing booked on a refused answer"
        said = answer(runs.custom, runs.namespace, name, RIGHT, question)
        assert f"answered as spec.answers[{question!r}]" in said
        _booked_once(runs, name, hotel)


def test_an_operator_killed_while_the_question_waits_sends_the_answer_once_after_restart(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    with AskingServerThread() as hotel:
        spec = _spec(model, refsystem, hotel)
        first = webhook_operator("agent-mcp-elicitation-1")
        name = runs.create(spec)
        question = _asked(runs, name, model, hotel)
        first.kill()
        port = hotel.port
        hotel.restart()  # the server too: a stateless round trip needs nothing of its process
        assert hotel.port == port
        webhook_operator("agent-mcp-elicitation-2")
        answer(runs.custom, runs.namespace, name, RIGHT, question)
        _booked_once(runs, name, hotel)


def test_a_server_question_nobody_answers_expires_the_run_and_fails_the_action_unapplied(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    expiries = {"waitExpiries": {"input": "6s"}}
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "refunds", {"spec": expiries}
    )
    with AskingServerThread() as hotel:
        spec = _spec(model, refsystem, hotel)
        start_operator("agent-mcp-elicitation")
        name = runs.create(spec)
        _asked(runs, name, model, hotel)
        expired = runs.wait_state(name, "expired", timeout=Within.RUN)
        assert expired["status"]["outcome"]["reason"] == "InputExpired", expired["status"]["outcome"]

        def failed() -> dict[str, Any] | None:
            status = _record(runs, name)["status"]
            return status if status["state"] == "failed" else None

        status = eventually(failed, Within.RUN, "the unanswered action to fail")
        assert status["reason"] == "McpInputNotAnswered", status
        assert "nothing was applied" in status["message"]
        assert status["attempts"] == 1, "not sent again: the server is not told (no call is open)"
        assert (hotel.asked(), hotel.applications()) == (1, [])
