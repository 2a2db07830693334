"""Every content kind an MCP tool result can carry reaches the model usable and bounded (issue 36,
items 4 and 5), on the operator's path: a model-planned run calls the content reference server's
read tools (trusted as read-only by the policy), and the reference model server records what it was
given:

- text, a resource link (named, not fetched), an embedded text resource: as they came; an image,
  an audio clip and a binary resource: described by type and size, no base64;
- structured content matching the tool's output schema: the structured value;
- structured content that does not match it: a tool error saying so, and the run goes on;
- a result of 50 MiB: a clear failure that says the bound, and the run goes on;
- a progress flood and a log flood while a call is open: the call's answer, nothing failed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from e2e.test_agent import agent_namespace, agent_spec, model
from e2e.test_agent_results import tool_results

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.agent.mcp_content import NOT_FETCHED, NOT_SHOWN, SCHEMA_MISMATCH
from durable_agents.shell.agent.mcp_notices import RESPONSE_MAX_BYTES
from durable_agents_testkit import mcpcontent
from durable_agents_testkit.mcpcontent import ContentServerThread
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

__all__ = ["agent_namespace", "model"]  # the fixtures, as test_agent defines them

CALLS: list[tuple[str, dict[str, int]]] = [
    ("show_everything", {}),
    ("show_structured", {}),
    ("show_mismatch", {}),
    ("show_large", {"mebibytes": 50}),
    ("show_noisy", {"progress": 3000, "logs": 1000}),
]


def content_script() -> dict[str, Any]:
    rules: list[dict[str, Any]] = []
    for n, (tool, arguments) in enumerate(CALLS):
        before = [name for name, _ in CALLS[:n]]
        rules.append(
            {
                "when": {"called": before, "notCalled": [tool]} if before else {"notCalled": [tool]},
                "content": f"Calling {tool}.",
                "toolCalls": [{"name": tool, "arguments": arguments}],
            }
        )
    rules.append({"when": {"called": [tool for tool, _ in CALLS]}, "content": "Seen it all."})
    return {"model": "scripted-refunds", "rules": rules}


def test_every_content_kind_reaches_the_model_usable_and_bounded(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    with ContentServerThread() as content:
        tools = [tool for tool, _ in CALLS]
        trusted = {"trustedServers": [{"url": content.url, "tools": tools}]}
        runs.custom.patch_namespaced_custom_object(
            GROUP, VERSION, runs.namespace, "agentpolicies", "refunds", {"spec": {"mcp": trusted}}
        )
        model.set_script(content_script())
        spec = agent_spec(model, refsystem)
        spec["agent"]["tools"] = []
        spec["agent"]["mcpServers"] = [{"name": "content", "url": content.url, "tools": tools}]
        op = start_operator("agent-mcp-content", DURABLE_AGENTS_LOG_LEVEL="DEBUG")
        name = runs.create(spec)
        done = runs.wait_state(name, "completed", timeout=120)

        facts = done["status"]["checkpoint"]["agent"]
        assert [t["tool"] for t in facts["turns"]] == tools, "every call was made, none failed the run"
        requests = model.calls()["requests"]

        def told(tool: str) -> dict[str, Any]:
            results = tool_results(requests, tool)
            assert results, f"{tool}'s result never reached the model"
            answer: dict[str, Any] = json.loads(results[-1])
            return answer

        everything = told("show_everything")
        assert everything["isError"] is False
        text, image, audio, link, note, blob = everything["content"]
        assert text["text"] == "Quarterly figures attached."
        assert (image["type"], image["mimeType"], image["bytes"], image["note"]) == (
            "image",
            "image/png",
            70,
            NOT_SHOWN,
        )
        assert (audio["type"], audio["bytes"]) == ("audio", 44)
        assert (link["name"], link["uri"], link["note"]) == ("q3-report", mcpcontent.REPORT_URI, NOT_FETCHED)
        assert note["resource"]["text"] == mcpcontent.NOTE_TEXT
        assert (blob["uri"], blob["bytes"]) == ("blob://raw/1", 1024)
        assert not any(mcpcontent.PNG in body for body in tool_results(requests, "show_everything"))

        assert told("show_structured") == {"isError": False, "content": {"total": 42, "currency": "EUR"}}

        mismatch = told("show_mismatch")
        assert mismatch["isError"] is True
        assert mismatch["content"].startswith(SCHEMA_MISMATCH), mismatch

        large = told("show_large")
        said = json.dumps(large)
        assert f"larger than {RESPONSE_MAX_BYTES} bytes" in said, said
        assert len(said) < 4096, "the model is told the failure, not 50 MiB"

        assert told("show_noisy") == {"isError": False, "content": "noisy done"}
        sent = content.noise()
        assert (sent.progress, sent.logs) == (3000, 1000), "the server did flood while the call was open"
        assert not op.logged("Traceback")
        assert op.logged("MCP server 'content'"), "the server's log lines are in the operator's log"
