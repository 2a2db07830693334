"""Every content kind an MCP tool result can carry reaches the model usable and bounded (issue 36,
items 4 and 5), on the operator's path: a model-planned run calls the content reference server's
read tools (trusted as read-only by the policy), and the reference model server records what it was
given:

- text, a resource link (named, not fetched), an embedded text resource: as they came; an image,
  an audio clip and a binary resource: described by type and size, no base64;
- structured content matching the tool's output schema: the structured value;
- structured content that does not match it: a tool error saying so, and the run goes on;
- a result of 50 MiB: a clear failure that says the bound, and the run goes on;
- a progress flood and a log flood while a call is open: the call's answer, nothing failed;
- the progress of a long approved call: in its ActionRecord and ``kubectl agentrun status`` while
  it runs, written a few times for 1500 notifications, cleared by the answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from e2e.test_agent import agent_namespace, agent_spec, approve, model
from e2e.test_agent_recovery import WriteLog
from e2e.test_agent_results import tool_results

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.agent.mcp_content import IMAGE_FOLLOWS, NOT_FETCHED, NOT_SHOWN, SCHEMA_MISMATCH
from durable_agents.kubectl import progress as kubectl_progress
from durable_agents.shell.agent.mcp_notices import RESPONSE_MAX_BYTES
from durable_agents_testkit import mcpcontent
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
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


NOISY_PROGRESS = 1500


def noisy_script() -> dict[str, Any]:
    arguments = {"progress": NOISY_PROGRESS, "logs": 300, "seconds": 16}
    return {
        "model": "scripted-refunds",
        "rules": [
            {
                "when": {"notCalled": ["show_noisy"]},
                "content": "A long report.",
                "toolCalls": [{"name": "show_noisy", "arguments": arguments}],
            },
            {"when": {"called": ["show_noisy"]}, "content": "Done."},
        ],
    }


def test_the_progress_of_a_long_approved_call_is_shown_in_status_within_the_write_budget(
    start_operator: Callable[..., OperatorProcess],
    kube: KubeEnv,
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    # The content server is not trusted: show_noisy is consequential, approved by a person and
    # sent by the ledger, whose dispatch timeout outlasts the call's 16 s.
    with ContentServerThread() as content, WriteLog(kube, runs.namespace) as writes:
        model.set_script(noisy_script())
        spec = agent_spec(model, refsystem)
        spec["agent"]["tools"] = []
        spec["agent"]["mcpServers"] = [{"name": "content", "url": content.url, "tools": ["show_noisy"]}]
        start_operator("agent-mcp-progress", DURABLE_AGENTS_DISPATCH_TIMEOUT="90")
        name = runs.create(spec)
        assert approve(runs, name)["effect"] == "mcp.call"

        def progressing() -> dict[str, Any] | None:
            listed = runs.custom.list_namespaced_custom_object(
                GROUP, VERSION, runs.namespace, "actionrecords"
            )
            shown = [r for r in listed["items"] if (r.get("status") or {}).get("progress")]
            return shown[0] if shown else None

        record = eventually(progressing, Within.RUN, "an ActionRecord with the call's progress")
        assert record["status"]["state"] in ("intent", "dispatching"), "not settled yet"
        progress = record["status"]["progress"]
        assert progress["total"] == NOISY_PROGRESS
        assert 0 < progress["progress"] <= NOISY_PROGRESS
        lines = kubectl_progress.in_flight_lines(runs.custom, runs.namespace, runs.get(name))
        assert lines[0].startswith(f"In flight:   mcp.call at step 0 ({record['metadata']['name']})"), lines
        assert lines[1].startswith("  progress:  "), lines
        assert 'server says "step ' in lines[1], lines

        done = runs.wait_state(name, "completed", timeout=Within.RUN)
        assert content.noise().answered == 1, "the call was made once"
        final = runs.custom.get_namespaced_custom_object(
            GROUP, VERSION, runs.namespace, "actionrecords", record["metadata"]["name"]
        )
        assert final["status"]["state"] == "succeeded"
        assert "progress" not in final["status"], "the answer's write clears the progress"
        assert "noisy done" in json.dumps(tool_results(model.calls()["requests"], "show_noisy"))
        assert done["status"]["state"] == "completed"
    progress_writes = [seen for seen in writes.seen if seen[1] == "actionrecords" and seen[4].get("progress")]
    # 1500 notifications over 16 s: a write per notification would be 1500; at most one per 5 s
    # is 3 or 4 (the first after 5 s). Not a timing assertion: any coalescing passes, none fails.
    assert 1 <= len(progress_writes) <= 10, f"{len(progress_writes)} progress writes"


@pytest.mark.parametrize("protocol", ["openai-chat", "anthropic-messages"])
def test_a_model_that_accepts_images_is_given_a_results_image_as_an_image(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    protocol: str,
) -> None:
    with ContentServerThread() as content:
        trusted = {"trustedServers": [{"url": content.url, "tools": ["show_everything"]}]}
        runs.custom.patch_namespaced_custom_object(
            GROUP, VERSION, runs.namespace, "agentpolicies", "refunds", {"spec": {"mcp": trusted}}
        )
        script = content_script()
        model.set_script(
            {
                **script,
                "rules": [
                    script["rules"][0],
                    {"when": {"called": ["show_everything"]}, "content": "A red dot."},
                ],
            }
        )
        spec = agent_spec(model, refsystem, protocol)
        spec["agent"]["endpoint"]["acceptsImages"] = True
        spec["agent"]["tools"] = []
        spec["agent"]["mcpServers"] = [{"name": "content", "url": content.url, "tools": ["show_everything"]}]
        start_operator("agent-mcp-images")
        name = runs.create(spec)
        runs.wait_state(name, "completed", timeout=Within.RUN)

    assert set(model.calls()["byProtocol"]) == {protocol}
    last = model.calls()["requests"][-1]["messages"]
    assert [m["role"] for m in last[-2:]] == ["tool", "user"], "the images follow the result"
    told = json.loads(last[-2]["content"])["content"]
    assert told[1]["note"] == IMAGE_FOLLOWS
    assert mcpcontent.PNG not in last[-2]["content"], "not pasted into the text"
    image = last[-1]["content"][1]
    assert image == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{mcpcontent.PNG}"}}
    assert mcpcontent.WAV not in json.dumps(last), "audio stays described"
