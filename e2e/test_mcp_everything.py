"""The MCP project's reference server for client builders, ``@modelcontextprotocol/server-everything``
(npm, pinned by ``testkit/durable_agents_testkit/everything/package-lock.json``, installed by the
test set-up with ``npm ci``), on its streamable HTTP transport (issue 36, item 6).

A model-planned run calls every tool of its list that makes sense for an unattended client, and
the reference model server records what it was given:

- read tools, trusted as read-only by the policy: ``get-sum``, structured content
  checked against the declared output schema, an image described (not base64), annotated messages
  (annotations dropped), resource links named (not fetched), an embedded resource, a long-running
  operation that sends progress;
- the progress of the long-running operation, as an approved call, in its ActionRecord while it
  runs;
- consequential calls (the policy does not trust their hints): ``echo`` and
  ``toggle-simulated-logging`` (logging on), each an intent in the ledger, approved by a person,
  and their result text reaches the model.

Left out, and why: see :data:`NOT_CALLED`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from e2e.test_agent import agent_namespace, agent_spec, model
from e2e.test_agent_results import tool_results

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.agent.mcp_content import NOT_FETCHED, NOT_SHOWN
from durable_agents_testkit import mcpeverything
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.mcpeverything import EverythingServer
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

__all__ = ["agent_namespace", "model"]  # the fixtures, as test_agent defines them

# Read tools whose readOnlyHint the policy believes: called by the worker between commits.
READS: list[tuple[str, dict[str, Any]]] = [
    ("get-sum", {"a": 19, "b": 23}),
    ("get-structured-content", {"location": "Chicago"}),
    ("get-tiny-image", {}),
    ("get-annotated-message", {"messageType": "error", "includeImage": True}),
    ("get-resource-links", {"count": 2}),
    ("get-resource-reference", {"resourceType": "Text", "resourceId": 3}),
    ("trigger-long-running-operation", {"duration": 2, "steps": 4}),
]
# Not trusted: consequential, approved by a person, sent by the ledger.
APPROVED: list[tuple[str, dict[str, Any]]] = [
    ("echo", {"message": "approved echo 7731"}),
    ("toggle-simulated-logging", {}),
]
NOT_CALLED: dict[str, str] = {
    "get-env": (
        "answers the server process's environment: nothing a run needs, and CI's environment "
        "in the run's facts"
    ),
    "gzip-file-as-resource": (
        "makes the server fetch a URL of the caller's choosing: an outbound fetch, not a client feature"
    ),
    "toggle-subscriber-updates": "notifies resource subscriptions, which the client does not make",
    "get-roots-list": "offered only to a client that declares roots, which the operator does not",
    "trigger-elicitation-request": "elicitation: branch mcp-elicit (issue 36, item 1)",
    "trigger-url-elicitation": "elicitation: branch mcp-elicit (issue 36, item 1)",
    "trigger-elicitation-request-async": "elicitation as a client task: branches mcp-elicit and mcp-tasks",
    "simulate-research-query": "a 2025-11-25 task through the ledger: e2e/test_mcp_everything_tasks.py",
    "trigger-sampling-request-async": "sampling as a client task: branch mcp-tasks (issue 36, item 2)",
    "trigger-sampling-request": "sampling under policy: e2e/test_mcp_sampling.py (issue 36, item 3)",
}


@pytest.fixture(scope="session")
def everything_entry() -> Any:
    """server-everything, installed once per machine and lock (``npm ci`` into a cache folder)."""
    return mcpeverything.install()


@pytest.fixture
def everything(everything_entry: Any) -> Iterator[EverythingServer]:
    with EverythingServer(everything_entry) as server:
        yield server


def script(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A model that calls each tool once, in order, then says it is done."""
    rules: list[dict[str, Any]] = []
    for n, (tool, arguments) in enumerate(calls):
        before = [name for name, _ in calls[:n]]
        when: dict[str, Any] = {"called": before, "notCalled": [tool]} if before else {"notCalled": [tool]}
        rules.append(
            {
                "when": when,
                "content": f"Calling {tool}.",
                "toolCalls": [{"name": tool, "arguments": arguments}],
            }
        )
    rules.append({"when": {"called": [tool for tool, _ in calls]}, "content": "Tried everything."})
    return {"model": "scripted-refunds", "rules": rules}


def approve_each(runs: Runs, name: str, count: int) -> list[dict[str, Any]]:
    """Approve ``count`` requests of the run one after the other, each a new request."""
    approved: list[dict[str, Any]] = []
    for _ in range(count):
        seen = {request["requestId"] for request in approved}

        def waiting(seen: set[str] = seen) -> dict[str, Any] | None:
            status = runs.get(name).get("status") or {}
            request = status.get("approvalRequest")
            if status.get("state") == "waiting_approval" and request and request["requestId"] not in seen:
                return dict(request)
            return None

        request = eventually(waiting, Within.RUN, f"approval request {len(approved) + 1} of {name}")
        runs.patch_spec(
            name, {"approvals": {request["requestId"]: {"digest": request["digest"], "decision": "approve"}}}
        )
        approved.append(request)
    return approved


def test_the_reference_server_tools_reach_the_model_reads_and_approved_calls(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
) -> None:
    reads = [tool for tool, _ in READS]
    approved = [tool for tool, _ in APPROVED]
    trusted = {"trustedServers": [{"url": everything.url, "tools": reads}]}
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "refunds", {"spec": {"mcp": trusted}}
    )
    model.set_script(script([*READS, *APPROVED]))
    spec = agent_spec(model, refsystem)
    spec["agent"]["tools"] = []
    spec["agent"]["mcpServers"] = [
        {"name": "everything", "url": everything.url, "tools": [*reads, *approved]}
    ]
    op = start_operator("mcp-everything", DURABLE_AGENTS_LOG_LEVEL="DEBUG")
    name = runs.create(spec)
    requests = approve_each(runs, name, len(APPROVED))
    assert [r["proposal"]["tool"] for r in requests] == approved
    assert {r["effect"] for r in requests} == {"mcp.call"}, "each an intent in the ledger"
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    assert done["status"]["state"] == "completed", everything.output()

    facts = done["status"]["checkpoint"]["agent"]
    assert [t["tool"] for t in facts["turns"]] == [*reads, *approved], (
        "every call was made, none failed the run"
    )
    received = model.calls()["requests"]

    def told(tool: str) -> Any:
        results = tool_results(received, tool)
        assert results, f"{tool}'s result never reached the model"
        return json.loads(results[-1])

    echoed = told("echo")
    assert "Echo: approved echo 7731" in json.dumps(echoed), "an approved call's result reaches the model"
    assert told("get-sum") == {"isError": False, "content": "The sum of 19 and 23 is 42."}
    weather = told("get-structured-content")
    assert weather == {
        "isError": False,
        "content": {"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82},
    }, "structured content, validated against the declared output schema"

    image = told("get-tiny-image")["content"]
    assert [part["type"] for part in image] == ["text", "image", "text"]
    assert (image[1]["mimeType"], image[1]["note"]) == ("image/png", NOT_SHOWN)
    assert image[1]["bytes"] > 0
    assert all("data" not in part for part in image), "described, never pasted as base64"

    annotated = told("get-annotated-message")["content"]
    assert annotated[0] == {"type": "text", "text": "Error: Operation failed"}, "annotations are the client's"
    assert annotated[1]["type"] == "image"
    assert "annotations" not in annotated[1]

    links = told("get-resource-links")["content"]
    assert links[0]["text"] == "Here are 2 resource links to resources available in this server:"
    assert [(link["uri"], link["note"]) for link in links[1:]] == [
        ("demo://resource/dynamic/blob/1", NOT_FETCHED),
        ("demo://resource/dynamic/text/2", NOT_FETCHED),
    ]

    reference = told("get-resource-reference")["content"]
    embedded = reference[1]
    assert embedded["type"] == "resource"
    assert embedded["resource"]["uri"] == "demo://resource/dynamic/text/3"
    assert embedded["resource"]["text"].startswith("Resource 3:"), embedded

    long_running = told("trigger-long-running-operation")
    assert long_running == {
        "isError": False,
        "content": "Long running operation completed. Duration: 2 seconds, Steps: 4.",
    }

    logging_on = told("toggle-simulated-logging")
    assert "Started simulated, random-leveled logging" in json.dumps(logging_on), logging_on
    assert not op.logged("Traceback")


def test_the_progress_of_the_reference_servers_long_operation_is_shown_while_it_runs(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
) -> None:
    # The server is not trusted: the long operation is an approved call sent by the ledger, whose
    # progress goes to its ActionRecord (at most once per 5 s: a call of 12 s has one or two).
    tool, arguments = "trigger-long-running-operation", {"duration": 12, "steps": 12}
    model.set_script(script([(tool, arguments)]))
    spec = agent_spec(model, refsystem)
    spec["agent"]["tools"] = []
    spec["agent"]["mcpServers"] = [{"name": "everything", "url": everything.url, "tools": [tool]}]
    start_operator("mcp-everything-progress", DURABLE_AGENTS_DISPATCH_TIMEOUT="90")
    name = runs.create(spec)
    assert approve_each(runs, name, 1)[0]["proposal"]["tool"] == tool

    def progressing() -> dict[str, Any] | None:
        listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
        shown = [r for r in listed["items"] if (r.get("status") or {}).get("progress")]
        return shown[0] if shown else None

    record = eventually(progressing, Within.RUN, "the long operation's progress in its ActionRecord")
    progress = record["status"]["progress"]
    assert progress["total"] == 12
    assert 0 < progress["progress"] <= 12
    assert record["status"]["state"] in ("intent", "dispatching"), "shown while the call runs"
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    assert done["status"]["state"] == "completed"
    told = tool_results(model.calls()["requests"], tool)
    assert "Long running operation completed. Duration: 12 seconds, Steps: 12." in json.dumps(told)
