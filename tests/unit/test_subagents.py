"""Pure rules of sub-agents: the tool an Agent's subAgents become, the child a call starts, the
path that bounds depth and cycles (believed only with the operator's stamp), and the cycle the
admission webhook refuses."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import KEYRING, new_run, snap

from durable_agents.api.v1alpha1 import AgentConfig, AgentSpec, ModelConfigSpec
from durable_agents.core.agent.declared import declared_tools
from durable_agents.core.agent.exchange import ModelReply, ToolCall
from durable_agents.core.agent.interpret import ProposedCall, interpret
from durable_agents.core.agent.limits import AgentLimits
from durable_agents.core.definitions import definition_digests, pin, sub_agent_cycle
from durable_agents.core.digest import canonical_digest
from durable_agents.core.engine.children import foreign_child, stamp_child
from durable_agents.core.engine.subagents import (
    SUB_AGENT_CYCLE,
    SUB_AGENT_DEPTH,
    SUB_AGENT_UNPROVEN,
    ancestry,
    call_refusal,
    sub_agent_body,
)
from durable_agents.core.planner import StartSubAgent
from durable_agents.core.sealing import Keyring

MODEL = ModelConfigSpec.model_validate({"baseUrl": "http://model/v1", "model": "gpt"})
BASE: dict[str, Any] = {"modelRef": "m", "systemPrompt": {"inline": "coordinate"}}
SUBS = [{"agentRef": "refunder", "description": "Refunds."}, {"agentRef": "closer", "toolName": "close_it"}]


def test_an_agents_sub_agents_are_tools_whose_call_starts_a_child_of_that_agent() -> None:
    pinned = pin("coordinator", AgentSpec.model_validate({**BASE, "subAgents": SUBS}), MODEL, "coordinate")
    tools = declared_tools(pinned.agent_config())
    assert [(t.name, t.kind, t.agent_ref) for t in tools] == [
        ("refunder", "agent", "refunder"),
        ("close_it", "agent", "closer"),
    ]
    assert tools[0].parameters["required"] == ["objective"]
    reply = ModelReply(
        model="gpt", content=None, tool_calls=(ToolCall("c1", "close_it", '{"objective": "close T-1"}'),)
    )
    proposal = interpret(reply, tools, step_index=3)
    assert isinstance(proposal, ProposedCall)
    # where the call lands (which Agent) is the declaration's, never the model's
    assert proposal.step == StartSubAgent("agent-3", "closer", "close T-1")


def test_sub_agents_move_the_tool_set_digest_and_an_agent_without_them_keeps_its_digests() -> None:
    plain, with_subs = AgentSpec.model_validate(BASE), AgentSpec.model_validate({**BASE, "subAgents": SUBS})
    before = definition_digests(plain, MODEL, "p")
    # as computed before subAgents existed: the field absent from the Agent's JSON
    wire = plain.model_dump(mode="json", by_alias=True, exclude_none=True)
    del wire["subAgents"]
    assert before["agentDigest"] == canonical_digest(wire)
    assert before["toolSetDigest"] == canonical_digest({"tools": [], "mcpServers": []})
    after = definition_digests(with_subs, MODEL, "p")
    assert after["toolSetDigest"] != before["toolSetDigest"]
    assert after["digest"] != before["digest"]


def parent(**spec: Any) -> Any:
    return snap(new_run(agentRef="coordinator", policyRef={"name": "support"}, **spec))


def child_of(body: dict[str, Any], keyring: Keyring, **annotations: str) -> Any:
    stamped = stamp_child(body, keyring, "parent-run-id")
    meta = stamped["metadata"]
    meta["annotations"].update(annotations)
    obj = {**stamped, "metadata": {**meta, "uid": "u2", "resourceVersion": "1"}}
    return snap(obj)


def test_the_child_has_the_parents_authority_and_a_stamped_path_that_bounds_it() -> None:
    run = parent(serviceAccountName="refunds-sa", tenant="t1")
    body = sub_agent_body(run, StartSubAgent("agent-0", "refunder", "refund A-1"), ("coordinator",))
    spec = body["spec"]
    assert (spec["agentRef"], spec["objective"], spec["serviceAccountName"]) == (
        "refunder",
        "refund A-1",
        "refunds-sa",
    )
    assert (spec["policyRef"], spec["tenant"], spec["parentRef"]["name"]) == (
        {"name": "support"},
        "t1",
        "run-1",
    )
    assert body["metadata"]["name"] == "run-1-agent-0"
    assert body["metadata"]["ownerReferences"][0]["uid"] == run.uid
    child = child_of(body, KEYRING)
    assert ancestry(child, KEYRING) == ("coordinator",)
    # the same body is the operator's child: adopted after a crash between commit and create
    assert (
        foreign_child(
            stamp_child(body, KEYRING, "parent-run-id"),
            body,
            keyring=KEYRING,
            parent_run_id="parent-run-id",
            parent_name="run-1",
        )
        is None
    )
    # a path someone shortened (to nest deeper) is not believed: the run calls no sub-agent
    forged = child_of(body, KEYRING, **{"durable-agents.io/agent-path": ""})
    assert ancestry(forged, KEYRING) is None
    other = Keyring(keys={"x": bytes(32)}, active_key_id="x")
    assert ancestry(child_of(body, other), KEYRING) is None
    refused = call_refusal(forged, StartSubAgent("agent-0", "closer", "x"), AgentLimits(), KEYRING)
    assert getattr(refused, "reason", None) == SUB_AGENT_UNPROVEN


@pytest.mark.parametrize(
    ("path", "callee", "depth", "reason"),
    [
        ((), "refunder", 3, "coordinator"),  # a top-level run: depth 1
        (("a", "b"), "refunder", 3, "a/b/coordinator"),
        (("a", "b"), "refunder", 2, SUB_AGENT_DEPTH),
        (("a",), "coordinator", 3, SUB_AGENT_CYCLE),  # calls itself
        (("a",), "a", 3, SUB_AGENT_CYCLE),  # calls an Agent above it
    ],
)
def test_depth_and_cycles_are_bounded_by_the_path(
    path: tuple[str, ...], callee: str, depth: int, reason: str
) -> None:
    top = parent()
    if path:
        body = sub_agent_body(top, StartSubAgent("agent-0", "coordinator", "x"), path)
        body["spec"]["agentRef"] = "coordinator"
        run = child_of(body, KEYRING)
    else:
        run = top
    refused = call_refusal(
        run, StartSubAgent("agent-1", callee, "x"), AgentLimits(max_sub_agent_depth=depth), KEYRING
    )
    assert getattr(refused, "reason", refused) == reason


def test_a_cycle_through_the_written_agent_is_found_with_its_path() -> None:
    calls = {"a": ["b"], "b": ["c", "d"], "c": [], "d": ["a"]}
    assert sub_agent_cycle("a", calls) == ["a", "b", "d", "a"]
    assert sub_agent_cycle("a", {**calls, "d": []}) is None
    assert sub_agent_cycle("x", {"x": ["x"]}) == ["x", "x"]
    # a cycle elsewhere, not through the written Agent, is not its to answer for (and terminates)
    assert sub_agent_cycle("a", {"a": ["b"], "b": ["c"], "c": ["b"]}) is None


def test_inline_agents_may_name_sub_agents_too() -> None:
    config = AgentConfig.model_validate({"planner": "scripted", "subAgents": [SUBS[0]]})
    assert [t.agent_ref for t in declared_tools(config)] == ["refunder"]
