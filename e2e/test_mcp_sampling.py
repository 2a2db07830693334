"""Sampling under policy (issue 36, item 3), against the MCP project's reference server
(server-everything's ``trigger-sampling-request``, which sends ``sampling/createMessage`` while its
call is open and answers with what it got).

- Without a grant in the run's policy (``spec.mcp.sampling``) the request is refused: the server is
  told (a JSON-RPC error, which its tool turns into a tool error), the model is never asked, the
  run goes on and completes.
- With one: the run's model answers (its own endpoint and model), framed as the server's words,
  bounded by the request's maxTokens; the sample counts in the run's ``modelCallsTotal`` and
  ``usageTotal``; a request larger than the grant is refused and the server told.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from e2e.test_agent import agent_namespace, agent_spec, model
from e2e.test_agent_results import tool_results

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.agent.mcp_sampling import NOT_GRANTED, SERVER_PREFIX
from durable_agents_testkit import mcpeverything
from durable_agents_testkit.mcpeverything import EverythingServer
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

__all__ = ["agent_namespace", "model"]  # the fixtures, as test_agent defines them

TOOL = "trigger-sampling-request"
PROMPT = "write a haiku about durable queues"
SAMPLED = "Queues outlast the crash 5521."
FROM_SERVER = SERVER_PREFIX.format(server="everything")


@pytest.fixture(scope="module")
def everything_entry() -> Any:
    return mcpeverything.install()


@pytest.fixture
def everything(everything_entry: Any) -> Iterator[EverythingServer]:
    with EverythingServer(everything_entry) as server:
        yield server


def script() -> dict[str, Any]:
    """The server's sample is answered first (its user message is marked as the server's); the
    run's own model asks for a sample of 100 tokens, then one of 5000, then says it is done."""
    first = {"prompt": PROMPT, "maxTokens": 100}
    second = {"prompt": PROMPT, "maxTokens": 5000}
    return {
        "model": "scripted-refunds",
        "rules": [
            {"when": {"userContains": FROM_SERVER}, "content": SAMPLED},
            {
                "when": {"notCalled": [TOOL]},
                "content": "Sampling.",
                "toolCalls": [{"name": TOOL, "arguments": first}],
            },
            {
                "when": {"called": [TOOL], "lastToolResultContains": "LLM sampling result"},
                "content": "Sampling more.",
                "toolCalls": [{"name": TOOL, "arguments": second}],
            },
            {"when": {"called": [TOOL]}, "content": "Done."},
        ],
    }


def set_policy(runs: Runs, url: str, *, grant: bool, **more: Any) -> None:
    mcp: dict[str, Any] = {"sampling": [{"url": url, "maxTokens": 200}] if grant else []}
    tiers = {"http.post": "consequential", f"mcp:everything/{TOOL}": "read-only"}
    spec = {"tiers": tiers, "mcp": mcp, **more}
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "refunds", {"spec": spec}
    )


def run_spec(
    model: ModelServerThread, refsystem: ReferenceSystemThread, url: str, protocol: str = "openai-chat"
) -> dict[str, Any]:
    spec = agent_spec(model, refsystem, protocol)
    spec["agent"]["tools"] = []
    spec["agent"]["mcpServers"] = [{"name": "everything", "url": url, "tools": [TOOL]}]
    return spec


def distinct(requests: list[dict[str, Any]]) -> set[str]:
    return {json.dumps(request, sort_keys=True) for request in requests}


def samples(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests the model got for a server's sample."""
    return [r for r in requests if any(FROM_SERVER in str(m.get("content")) for m in r["messages"])]


def test_sampling_is_refused_without_a_grant_and_the_run_goes_on(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
) -> None:
    set_policy(runs, everything.url, grant=False)
    model.set_script(script())
    start_operator("mcp-sampling-refused")
    name = runs.create(run_spec(model, refsystem, everything.url))
    done = runs.wait_state(name, "completed", timeout=120)

    requests = model.calls()["requests"]
    assert samples(requests) == [], "the model was never asked for the server"
    told = json.loads(tool_results(requests, TOOL)[-1])
    assert told["isError"] is True, told
    assert NOT_GRANTED in json.dumps(told), "the server was told why, and its tool said so"
    facts = done["status"]["checkpoint"]["agent"]
    assert facts["modelCallsTotal"] == 2, "the run's own calls only"
    assert [t["tool"] for t in facts["turns"]] == [TOOL]


@pytest.mark.parametrize("protocol", ["openai-chat", "anthropic-messages"])
def test_sampling_granted_by_policy_uses_the_runs_model_and_counts_in_its_limits(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
    protocol: str,
) -> None:
    set_policy(runs, everything.url, grant=True)
    model.set_script(script())
    op = start_operator("mcp-sampling-granted")
    name = runs.create(run_spec(model, refsystem, everything.url, protocol))
    done = runs.wait_state(name, "completed", timeout=120)

    requests = model.calls()["requests"]
    sampled = samples(requests)
    # A computation thrown away (a write conflict) is made again: its requests come again, alike.
    assert len(distinct(sampled)) == 1, "one sample within the grant, the larger one refused"
    request = sampled[0]
    assert request["model"] == "scripted-refunds", "the run's model"
    assert set(model.calls()["byProtocol"]) == {protocol}, "the run's endpoint, its protocol"
    if protocol == "openai-chat":  # the Messages API's record leaves max_tokens out (it requires one)
        assert request.get("max_tokens") == 100, "bounded by the request's maxTokens"
    assert "tools" not in request, "a sample offers the run's tools to no one"
    system, user = request["messages"][0], request["messages"][-1]
    assert system["role"] == "system"
    assert "not the run's objective" in system["content"]
    assert "You are a helpful test server." in system["content"], "the server's system prompt, quoted"
    assert user["content"] == f"{FROM_SERVER}Resource {TOOL} context: {PROMPT}"
    assert all(done["spec"]["objective"] not in str(m["content"]) for m in request["messages"])

    results = [json.loads(r) for r in tool_results(requests, TOOL)]
    first, second = results[0], results[-1]
    assert first["isError"] is False
    assert SAMPLED in json.dumps(first), "the server got the run's model's answer"
    assert second["isError"] is True
    assert "asks for 5000 tokens: the policy grants this server 200" in json.dumps(second)

    facts = done["status"]["checkpoint"]["agent"]
    own = 3  # two tool calls and the final answer
    assert facts["modelCallsTotal"] == own + 1, "the sample counts as a model call of the run"
    assert facts["usageTotal"]["outputTokens"] > 0
    assert op.logged("sampled the run's model")
    assert not op.logged(PROMPT), "no prompt content in the operator's log"
    assert not op.logged(SAMPLED)


def test_a_sample_counts_against_the_runs_model_call_limit(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    everything: EverythingServer,
) -> None:
    # Two model calls allowed: the run's first call and the server's sample spend them, so the run
    # may not ask its model again (without the sample counted, its second call would end it well).
    set_policy(runs, everything.url, grant=True, agentLimits={"maxModelCalls": 2})
    model.set_script(script())
    start_operator("mcp-sampling-limit")
    name = runs.create(run_spec(model, refsystem, everything.url))
    failed = runs.wait_state(name, "failed", timeout=120)

    status = failed["status"]
    assert status["outcome"]["reason"] == "AgentLimitExceeded", status["outcome"]
    assert status["outcome"]["message"] == "2 model calls: the run's limit is 2"
    assert status["checkpoint"]["agent"]["modelCallsTotal"] == 2
    requests = model.calls()["requests"]
    assert len(distinct(samples(requests))) == 1
    assert len(distinct(requests)) == 2, "the run's model was not asked again"
