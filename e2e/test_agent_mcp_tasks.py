"""Tasks as ledger handles (issue 36, item 2): an approved MCP call the server answers with a task
is waited on through its ActionRecord, across SIGKILLs of the operator, and settled from the
task's result; canceling the run cancels the task at the server.

Real API server, the operator as separate processes, the reference model server, and the task
reference server (:mod:`durable_agents_testkit.mcptasks`), whose ``compile_report`` answers with a
task that works until the test releases it, and which counts calls, polls, fetched results and
cancellations. At every poll the server reads the ActionRecord from the API server: the task ID
must be there before the first poll.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import Any

from e2e.test_agent import agent_namespace, agent_spec, approve, model
from e2e.test_agent_recovery import FAST_CLAIMS, LEASE
from e2e.test_agent_results import tool_results

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.kubectl import progress as kubectl_progress
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.mcptasks import TOOL, TaskServerThread
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

__all__ = ["agent_namespace", "model"]  # the fixtures, as test_agent.py defines them

SCRIPT: dict[str, Any] = {
    "model": "scripted-refunds",
    "rules": [
        {
            "when": {"notCalled": [TOOL]},
            "content": "Compiling the Q3 report.",
            "toolCalls": [{"name": TOOL, "arguments": {"topic": "q3"}}],
        },
        {"when": {"called": [TOOL]}, "content": "The report is in."},
    ],
}


def task_spec(model: ModelServerThread, refsystem: ReferenceSystemThread, server: TaskServerThread) -> Any:
    """The sample run with the task server's one tool (consequential: approved, then the ledger's)."""
    model.set_script(SCRIPT)
    spec = agent_spec(model, refsystem)
    spec["agent"]["tools"] = []
    spec["agent"]["mcpServers"] = [{"name": "reports", "url": server.url, "tools": [TOOL]}]
    return spec


def the_record(runs: Runs) -> dict[str, Any]:
    listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
    [record] = listed["items"]
    return dict(record)


def task_recorded(runs: Runs) -> Callable[[str], bool]:
    """For the server's poll hook: whether the ActionRecord holds this task ID right now."""

    def holds(task_id: str) -> bool:
        listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
        return any(((r.get("status") or {}).get("task") or {}).get("id") == task_id for r in listed["items"])

    return holds


def waiting_on_task(runs: Runs) -> dict[str, Any]:
    def recorded() -> dict[str, Any] | None:
        listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
        shown = [r for r in listed["items"] if (r.get("status") or {}).get("task")]
        return shown[0] if shown else None

    return eventually(recorded, Within.RUN, "an ActionRecord with the server's task")


def polled_more_than(server: TaskServerThread, task_id: str, polls: int) -> int:
    def more() -> int | None:
        now = server.polls(task_id)
        return now if now > polls else None

    return eventually(more, Within.RUN, f"task {task_id} polled more than {polls} times")


def test_a_task_survives_two_kills_and_its_result_is_fetched_not_called_again(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    with TaskServerThread() as server:
        server.on_poll(task_recorded(runs))
        first = start_operator("first", LEASE, **FAST_CLAIMS)
        name = runs.create(task_spec(model, refsystem, server))
        assert approve(runs, name)["effect"] == "mcp.call"
        record = waiting_on_task(runs)
        task = record["status"]["task"]
        key = record["spec"]["idempotencyKey"]
        assert server.calls() == {key: 1}
        assert server.task_ids() == [task["id"]]
        assert record["status"]["state"] in ("intent", "dispatching"), "waiting, not settled"
        waiting = runs.get(name)["status"]
        assert (waiting["state"], waiting["waitingFor"]) == (
            "waiting_external",
            f"action:{record['metadata']['name']}",
        ), "the run waits on the action whose record holds the task"

        polls = polled_more_than(server, task["id"], 0)
        first.kill()
        assert first.wait_exit(0) == -signal.SIGKILL
        second = start_operator("second", LEASE, **FAST_CLAIMS)
        polls = polled_more_than(server, task["id"], polls)
        second.kill()
        assert second.wait_exit(0) == -signal.SIGKILL
        start_operator("third", LEASE, **FAST_CLAIMS)
        polls = polled_more_than(server, task["id"], polls)

        shown = kubectl_progress.in_flight_lines(runs.custom, runs.namespace, runs.get(name))
        assert any(line.startswith(f'  task:      "{task["id"]}" working') for line in shown), shown
        assert any('server says "compiling q3: polled ' in line for line in shown), shown

        server.finish()
        done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
        assert done["status"]["state"] == "completed", done["status"].get("outcome")
        assert server.calls() == {key: 1}, "the tool was called once, across two kills"
        assert server.fetches() == {task["id"]: 1}, "the result was fetched from the task"
        seen = server.seen_at_polls()
        assert seen, "the task was polled"
        assert all(seen), "the task ID was in the ActionRecord before every poll, the first included"
        final = the_record(runs)
        assert (final["status"]["state"], final["status"]["task"]["status"]) == ("succeeded", "completed")
        told = tool_results(model.calls()["requests"], TOOL)
        assert told, "the task's result reached the model"
        assert "q3: 3 findings" in json.dumps(told)


def test_canceling_the_run_cancels_its_task_at_the_server(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    with TaskServerThread() as server:
        start_operator("op", LEASE, **FAST_CLAIMS)
        name = runs.create(task_spec(model, refsystem, server))
        approve(runs, name)
        task = waiting_on_task(runs)["status"]["task"]
        assert server.cancels() == []
        runs.patch_spec(name, {"cancellations": {"stop": {"scope": "task"}}})
        done = runs.wait_state(name, "canceled", "completed", "failed", timeout=Within.RUN)
        assert done["status"]["state"] == "canceled"
        assert server.cancels() == [task["id"]], "the task was canceled at the server"
        final = the_record(runs)["status"]
        assert (final["state"], final["reason"]) == ("failed", "McpTaskCancelled")
        assert final["task"]["cancelAnswer"] == "cancelled: cancelled on request", "the answer is recorded"
        assert server.fetches() == {}


def settled(runs: Runs, name: str) -> dict[str, Any]:
    """The run's ActionRecord once it is no longer waiting on its task."""

    def moved() -> dict[str, Any] | None:
        listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
        mine = [r for r in listed["items"] if r["spec"]["runRef"]["name"] == name]
        done = [
            r for r in mine if (r.get("status") or {}).get("state") not in (None, "intent", "dispatching")
        ]
        return done[0] if done else None

    return eventually(moved, Within.RUN, f"run {name}'s action to leave its task")


def told(runs: Runs, record: dict[str, Any], reason: str) -> str:
    """The message of the record's Event with ``reason`` (its status moves on: the query that
    follows an unknown outcome writes its own reason)."""

    def said() -> str | None:
        events = [e for e in runs.events(record["metadata"]["name"]) if e.reason == reason]
        return str(events[0].message) if events else None

    return eventually(said, Within.RUN, f"a {reason} Event on {record['metadata']['name']}")


def test_a_task_the_server_forgot_is_an_unknown_outcome_never_a_second_call(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    with TaskServerThread() as server:
        start_operator("op", LEASE, **FAST_CLAIMS)
        name = runs.create(task_spec(model, refsystem, server))
        approve(runs, name)
        record = waiting_on_task(runs)
        server.forget()  # the server restarted: its tasks are gone
        unknown = settled(runs, name)
        assert unknown["status"]["state"] == "outcome_unknown", unknown["status"]
        assert "does not know task" in told(runs, unknown, "McpTaskUnknown")
        assert server.calls() == {record["spec"]["idempotencyKey"]: 1}, "not called again"
        assert runs.get(name)["status"]["state"] not in ("completed", "failed"), "the run waits"


def test_a_task_id_the_server_reuses_for_another_call_settles_nothing(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    with TaskServerThread() as server:
        start_operator("op", LEASE, **FAST_CLAIMS)
        first = runs.create(task_spec(model, refsystem, server))
        approve(runs, first)
        task = waiting_on_task(runs)["status"]["task"]
        server.reuse(task["id"])
        second = runs.create(task_spec(model, refsystem, server))
        approve(runs, second)
        reused = settled(runs, second)
        assert reused["status"]["state"] == "outcome_unknown", reused["status"]
        assert f"task {task['id']!r}, which belongs to ActionRecord" in told(runs, reused, "TaskIdReused")
        server.finish()
        done = runs.wait_state(first, "completed", "failed", timeout=Within.RUN)
        assert done["status"]["state"] == "completed", "the task's own call is settled by it"
        assert server.fetches() == {task["id"]: 1}, "the result was taken once, for its own call"
        assert runs.get(second)["status"]["state"] not in ("completed", "failed")


def test_a_task_that_never_ends_is_canceled_when_the_wait_expires(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    expiries = {"waitExpiries": {"external": "6s"}}
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "refunds", {"spec": expiries}
    )
    with TaskServerThread() as server:
        start_operator("op", LEASE, **FAST_CLAIMS)
        name = runs.create(task_spec(model, refsystem, server))
        approve(runs, name)
        task = waiting_on_task(runs)["status"]["task"]
        expired = settled(runs, name)
        assert expired["status"]["state"] == "outcome_unknown", expired["status"]
        assert "did not end within 0:00:06; canceled at the server: cancelled" in told(
            runs, expired, "TaskWaitExpired"
        )
        assert server.cancels() == [task["id"]], "the task was canceled at the server"
        assert expired["status"]["task"]["cancelAnswer"].startswith("cancelled")
        assert server.fetches() == {}
