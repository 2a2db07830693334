"""MCP tasks in the 2025-11-25 form, against the MCP project's reference server (issue 36, item 2):
server-everything's ``simulate-research-query`` (``execution.taskSupport: required``; four stages
of a second each) called by a model-planned run through the action ledger, across a SIGKILL.

server-everything does not count its calls: it is reached through a recording proxy
(:mod:`durable_agents_testkit.mcprecorder`), which sees every JSON-RPC request and, at every
``tasks/get``, reads the ActionRecord from the API server before forwarding it: the task ID must be
there before the first poll. The operator is SIGKILLed while the task works (the record holds it,
no result was fetched yet); another takes over, polls the same task in the same MCP session, and
the run completes with the task's report: one ``tools/call``, the task ID unchanged.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from e2e.test_agent import agent_namespace, agent_spec, model
from e2e.test_agent_recovery import FAST_CLAIMS, LEASE
from e2e.test_agent_results import tool_results
from e2e.test_mcp_everything import approve_each, everything, everything_entry, script

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.mcpeverything import EverythingServer
from durable_agents_testkit.mcprecorder import RecordingProxy
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

__all__ = ["agent_namespace", "everything", "everything_entry", "model"]  # the fixtures

TOOL = "simulate-research-query"


@pytest.fixture
def recorded(everything: EverythingServer) -> Iterator[RecordingProxy]:
    with RecordingProxy(everything.url) as proxy:
        yield proxy


def records(runs: Runs) -> list[dict[str, Any]]:
    listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
    return list(listed["items"])


def task_in_a_record(runs: Runs) -> Callable[[dict[str, Any]], bool]:
    """For the proxy: whether an ActionRecord holds the polled task ID right now."""

    def holds(params: dict[str, Any]) -> bool:
        return any(
            ((r.get("status") or {}).get("task") or {}).get("id") == params.get("taskId")
            for r in records(runs)
        )

    return holds


def test_the_reference_servers_task_survives_a_kill_and_its_result_is_fetched_not_called_again(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
    recorded: RecordingProxy,
) -> None:
    recorded.check_before("tasks/get", task_in_a_record(runs))
    model.set_script(script([(TOOL, {"topic": "durable agents"})]))
    spec = agent_spec(model, refsystem)
    spec["agent"]["tools"] = []
    # Not trusted: the call is consequential, approved, and sent by the action ledger.
    spec["agent"]["mcpServers"] = [{"name": "everything", "url": recorded.url, "tools": [TOOL]}]
    first = start_operator("everything-tasks-first", LEASE, **FAST_CLAIMS)
    name = runs.create(spec)
    assert approve_each(runs, name, 1)[0]["proposal"]["tool"] == TOOL

    def task_recorded() -> dict[str, Any] | None:
        shown = [r for r in records(runs) if (r.get("status") or {}).get("task")]
        return shown[0] if shown else None

    record = eventually(task_recorded, Within.RUN, "an ActionRecord with server-everything's task")
    first.kill()
    assert first.wait_exit(0) == -signal.SIGKILL
    task = record["status"]["task"]
    assert (task["protocol"], task["status"]) == ("2025-11-25", "working"), task
    assert task["session"], "the MCP session the task lives in is recorded with it"
    assert not recorded.requests("tasks/result"), "killed while the task worked: no result fetched yet"
    [call] = recorded.requests("tools/call")
    assert call["params"]["task"]["ttl"] > 0, "the call asked for a task (its tool requires one)"
    assert call["session"] == task["session"]

    start_operator("everything-tasks-second", LEASE, **FAST_CLAIMS)
    done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
    assert done["status"]["state"] == "completed", (done["status"], everything.output())

    [final] = records(runs)
    assert (final["status"]["state"], final["status"]["task"]["status"]) == ("succeeded", "completed")
    assert final["status"]["task"]["id"] == task["id"], "the same task, polled after the kill"
    assert len(recorded.requests("tools/call")) == 1, "the tool was called once, across the kill"
    gets = recorded.requests("tasks/get")
    assert gets, "the task was polled"
    assert {get["params"]["taskId"] for get in gets} == {task["id"]}
    assert {get["session"] for get in gets} == {task["session"]}, "polled in the task's session"
    seen = recorded.checked("tasks/get")
    assert seen, "the proxy checked the polls"
    assert all(seen), "the task ID was in the ActionRecord before every poll, the first included"
    assert 1 <= len(recorded.requests("tasks/result")) <= 2, "the result fetched (again only after a kill)"

    told = tool_results(model.calls()["requests"], TOOL)
    assert told, "the task's result reached the model"
    assert "# Research Report: durable agents" in json.dumps(told)


def test_canceling_the_run_cancels_the_reference_servers_task_in_its_session(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
    recorded: RecordingProxy,
) -> None:
    # The task works 4 s: the run is canceled as soon as its record holds the task, and the next
    # poll (every second, the server's interval) cancels it at the server first.
    model.set_script(script([(TOOL, {"topic": "canceled research"})]))
    spec = agent_spec(model, refsystem)
    spec["agent"]["tools"] = []
    spec["agent"]["mcpServers"] = [{"name": "everything", "url": recorded.url, "tools": [TOOL]}]
    start_operator("everything-tasks-cancel", LEASE, **FAST_CLAIMS)
    name = runs.create(spec)
    approve_each(runs, name, 1)

    def task_recorded() -> dict[str, Any] | None:
        shown = [r for r in records(runs) if (r.get("status") or {}).get("task")]
        return shown[0]["status"]["task"] if shown else None

    task = eventually(
        task_recorded, Within.RUN, "an ActionRecord with server-everything's task", interval=0.05
    )
    runs.patch_spec(name, {"cancellations": {"stop": {"scope": "task"}}})
    done = runs.wait_state(name, "canceled", "completed", "failed", timeout=Within.RUN)
    assert done["status"]["state"] == "canceled"
    cancels = recorded.requests("tasks/cancel")
    # Once: a poll that meets a conflict after sending, or runs beside another, reuses the answer.
    sent = [(c["params"]["taskId"], c["session"]) for c in cancels]
    assert sent == [(task["id"], task["session"])], cancels
    [final] = records(runs)
    status = final["status"]
    assert (status["state"], status["reason"]) == ("failed", "McpTaskCancelled"), status
    answers = [e.message for e in runs.wait_event(final["metadata"]["name"], "TaskCancelRequested")]
    assert any(f"task {task['id']}: cancelled" in str(said) for said in answers), answers
    assert not recorded.requests("tasks/result"), "a canceled task's result is not fetched"
