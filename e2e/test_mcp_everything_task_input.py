"""A 2025-11-25 task that waits for input, against the MCP project's reference server (issue 36,
item 2): server-everything's ``simulate-research-query`` with ``ambiguous`` asks for a
clarification (``elicitation/create``, related to its task) once the client declared elicitation.
The ledger's call declares it; when a poll sees the task ``input_required``, the dispatcher fetches
``tasks/result`` in the task's session and the server's question, on that stream, is asked as a
held call's: the ActionRecord waits ``input_required`` (``heldOpen``, the task ID kept, the question
sealed), the run waits in ``waiting_input``; a person answers with ``kubectl agentrun answer``
(checked by the webhook), the answer goes back in the session, the task goes on and is polled to
its report. Through the recording proxy: one ``tools/call``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from e2e.test_agent import agent_namespace, agent_spec, model
from e2e.test_agent_results import tool_results
from e2e.test_mcp_everything import approve_each, everything, everything_entry, script
from e2e.test_mcp_everything_tasks import recorded, records

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.kubectl.answer import AnswerError, answer
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.mcpeverything import EverythingServer
from durable_agents_testkit.mcprecorder import RecordingProxy
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

__all__ = ["agent_namespace", "everything", "everything_entry", "model", "recorded"]  # fixtures

pytestmark = pytest.mark.local_plane("webhook")
TOOL = "simulate-research-query"
WRONG = json.dumps({"action": "accept", "content": {"interpretation": "cobra"}})  # not one of the three
RIGHT = json.dumps({"action": "accept", "content": {"interpretation": "snake"}})


def _spec(model: ModelServerThread, refsystem: ReferenceSystemThread, url: str) -> Any:
    model.set_script(script([(TOOL, {"topic": "python", "ambiguous": True})]))
    spec = agent_spec(model, refsystem)
    spec["agent"]["tools"] = []
    spec["agent"]["mcpServers"] = [{"name": "everything", "url": url, "tools": [TOOL]}]
    return spec


def _asked(runs: Runs, name: str) -> tuple[str, dict[str, Any]]:
    """The run, approved, waiting on the task's question: the question's name, the record's status."""
    assert approve_each(runs, name, 1)[0]["effect"] == "mcp.call"
    run = runs.wait_state(name, "waiting_input", timeout=Within.RUN)
    waiting = run["status"]["waitingFor"]
    assert re.fullmatch(r"input:mcp-[0-9]+-1-\S+", waiting), waiting
    question = waiting.removeprefix("input:")
    assert run["status"]["checkpoint"]["pendingInput"]["requestId"] == question
    [record] = records(runs)
    status = record["status"]
    assert status["state"] == "input_required", status
    assert (status["input"]["heldOpen"], status["input"]["round"]) == (True, 1), status["input"]
    task = status["task"]
    assert task["protocol"] == "2025-11-25", task
    assert task["id"], task
    assert task["session"], "the task and its session stay in the record while the question waits"
    assert status["attempts"] == 1, status
    assert "multiple interpretations" not in json.dumps(status), "the server's question is sealed"
    return question, status


def test_a_tasks_question_is_answered_on_the_run_and_the_task_completes_with_its_report(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
    recorded: RecordingProxy,
) -> None:
    spec = _spec(model, refsystem, recorded.url)
    op = webhook_operator("mcp-everything-task-input")
    name = runs.create(spec)
    question, asked = _asked(runs, name)
    [call] = recorded.requests("tools/call")
    assert call["params"]["task"]["ttl"] > 0, "asked for a task"
    with pytest.raises(AnswerError) as refused:
        answer(runs.custom, runs.namespace, name, WRONG, question)
    assert f"spec.answers[{question}]: content.interpretation" in str(refused.value), refused.value
    said = answer(runs.custom, runs.namespace, name, RIGHT, question)
    assert f"answered as spec.answers[{question!r}]" in said
    done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
    assert done["status"]["state"] == "completed", (done["status"].get("outcome"), everything.output())

    [final] = records(runs)
    status = final["status"]
    assert (status["state"], status["task"]["status"]) == ("succeeded", "completed"), status
    assert status["task"]["id"] == asked["task"]["id"], "the same task throughout"
    assert status["attempts"] == 1, "never sent again"
    assert len(recorded.requests("tools/call")) == 1, "the tool was called once"
    results = recorded.requests("tasks/result")
    assert results, "the question came on a tasks/result stream"
    assert {r["session"] for r in results} == {asked["task"]["session"]}
    told = json.dumps(tool_results(model.calls()["requests"], TOOL))
    assert "# Research Report: python (snake)" in told, told
    assert "**Clarification**: snake" in told, told
    assert not op.logged("Traceback")


def test_a_tasks_question_lost_with_its_operator_closes_and_the_task_is_polled_not_called_again(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
    recorded: RecordingProxy,
) -> None:
    # A short hold: the lost asker's claim (hold + dispatch timeout) expires soon after the kill.
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "refunds", {"spec": {"mcp": {"holdOpen": "10s"}}}
    )
    spec = _spec(model, refsystem, recorded.url)
    first = webhook_operator("mcp-everything-task-input-1")
    name = runs.create(spec)
    question, asked = _asked(runs, name)
    first.kill()
    webhook_operator("mcp-everything-task-input-2")

    def lost() -> list[Any] | None:
        told = [
            e for e in runs.events(records(runs)[0]["metadata"]["name"]) if e.reason == "TaskQuestionLost"
        ]
        return told or None

    told = eventually(lost, Within.RUN, "the lost question's Warning Event TaskQuestionLost")
    assert asked["task"]["id"] in str(told[0].message)

    def closed() -> dict[str, Any] | None:
        run = runs.get(name)
        return run if run["status"].get("waitingFor") != f"input:{question}" else None

    eventually(closed, Within.RUN, f"the question {question} to close")

    # The task is the server's: polled again (tasks/result fetched again while it waits for
    # input). Whether the server asks again or goes on with its default, the run ends with the
    # task's report, the tool never called again.
    def ended() -> dict[str, Any] | None:
        run = runs.get(name)
        state = run["status"].get("state")
        if state == "waiting_input":  # asked again: answered
            waiting = str(run["status"]["waitingFor"]).removeprefix("input:")
            if waiting != question:
                answer(runs.custom, runs.namespace, name, RIGHT, waiting)
        return run if state in ("completed", "failed") else None

    done = eventually(ended, Within.RUN, "the run to end after the restart", interval=1.0)
    assert done["status"]["state"] == "completed", (done["status"].get("outcome"), everything.output())
    [final] = records(runs)
    assert final["status"]["task"]["id"] == asked["task"]["id"], "the same task, polled after the kill"
    assert final["status"]["state"] == "succeeded", final["status"]
    assert len(recorded.requests("tools/call")) == 1, "the tool was called once, across the kill"
    assert len(recorded.requests("tasks/result")) >= 2, "tasks/result fetched again after the kill"
    told_model = json.dumps(tool_results(model.calls()["requests"], TOOL))
    assert "# Research Report: python" in told_model, told_model
