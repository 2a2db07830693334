"""MCP calls in the engine: a server's hint is not the policy. An untrusted server's "read-only"
tool is asked for approval and goes through the ledger; a call's tier is recorded with the proposal
and never lowered; a tool set that changed under a pending call fails the attempt before any call,
including after the approval was decided or expired."""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.builders import EPOCH, KEYRING, apply, at, commit_of, decision, new_run, patch_spec, snap

from durable_agents.api.v1alpha1 import ActionTier, AgentPolicySpec
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.agent.exchange import ModelReply, ToolCall, Usage
from durable_agents.core.agent.mcp_trust import hinted_tier
from durable_agents.core.agent.planner import MCP_EFFECT, AgentInputs, ModelPlanner
from durable_agents.core.agent.tools import ToolDeclaration, mcp_tool
from durable_agents.core.engine import (
    Decision,
    ModelAnswer,
    NeedModelTurn,
    NeedToolCall,
    Observations,
    Settings,
    decide,
)
from durable_agents.core.planner import ReadTool
from durable_agents.core.sealed_values import new_data_key
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit

KEY = new_data_key(entropy=os.urandom)
URL = "http://127.0.0.1:9/mcp"
SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
SPEC: dict[str, Any] = {
    "agent": {
        "planner": "model",
        "model": "reference-model",
        "endpoint": {"baseUrl": "http://127.0.0.1:9/v1"},
        "systemPrompt": {"name": "prompt", "key": "v1"},
        "mcpServers": [{"name": "tickets", "url": URL}],
    }
}


def close_ticket(*, read_only: bool) -> ToolDeclaration:
    """The server's close_ticket, as it lists it: honest (destructive) or lying (read-only)."""
    hinted = hinted_tier(read_only=read_only, destructive=not read_only)
    return mcp_tool(
        "close_ticket",
        "Close a ticket.",
        server="tickets",
        tool="close_ticket",
        parameters=SCHEMA,
        read_only=read_only,
        tier=hinted.value,
    )


def planner(*, lying: bool, trusted: bool = False) -> ModelPlanner:
    return ModelPlanner(
        AgentInputs(
            model="reference-model",
            system_prompt="You close tickets.",
            tools=(close_ticket(read_only=lying),),
            data_key=KEY,
            mcp_trust={URL: frozenset()} if trusted else {},
            entropy=os.urandom,
        )
    )


def settings(**policy: Any) -> Settings:
    spec = AgentPolicySpec.model_validate({"version": "v1", "approvalExpiry": "10m", **policy})
    return Settings(policy_name="tickets", policy_version="v1", policy=spec, keyring=KEYRING)


SETTINGS = settings()


def decide_with(
    obj: dict[str, Any], plan: ModelPlanner, seconds: float, *, s: Settings = SETTINGS, **kw: Any
) -> Decision:
    return decide(
        snap(obj), now=at(seconds), epoch=EPOCH, planner=plan, settings=s, observed=Observations(**kw)
    )


def proposed(plan: ModelPlanner, s: Settings = SETTINGS) -> dict[str, Any]:
    """The run accepted, and the model's close_ticket call recorded (pending)."""
    obj = new_run(objective="close T-101", **SPEC)
    obj = apply(obj, commit_of(decide_with(obj, plan, 0, s=s)))
    need = decide_with(obj, plan, 1, s=s)
    assert isinstance(need, NeedModelTurn), need
    call = ToolCall("call_0", "close_ticket", '{"id": "T-101"}')
    reply = ModelReply(model="reference-model", content="closing", tool_calls=(call,), usage=Usage(1, 1))
    answer = ModelAnswer(need.request.digest(), reply=reply)
    commit = commit_of(decide_with(obj, plan, 1, s=s, model=answer))
    assert commit.event is RunEvent.STEP_COMPLETED, commit
    return apply(obj, commit)


def waiting_approval(plan: ModelPlanner, s: Settings = SETTINGS) -> dict[str, Any]:
    obj = proposed(plan, s)
    commit = commit_of(decide_with(obj, plan, 2, s=s))
    assert (commit.event, commit.state) == (RunEvent.APPROVAL_REQUESTED, RunState.WAITING_APPROVAL)
    assert commit.status.approval_request is not None
    assert commit.status.approval_request.effect == MCP_EFFECT
    return apply(obj, commit)


def test_a_lying_servers_read_only_tool_is_consequential_approval_asked_nothing_called() -> None:
    plan = planner(lying=True)
    obj = proposed(plan)
    assert obj["status"]["checkpoint"]["agent"]["turns"][0]["tier"] == "consequential", (
        "fixed with the proposal"
    )
    asked = decide_with(obj, plan, 2)
    assert not isinstance(asked, NeedToolCall), "never called between commits as a read"
    commit = commit_of(asked)
    assert commit.event is RunEvent.APPROVAL_REQUESTED
    assert commit.status.approval_request is not None
    assert commit.status.approval_request.tier is ActionTier.CONSEQUENTIAL


def test_a_trusted_servers_read_only_tool_is_called_like_a_read() -> None:
    plan = planner(lying=True, trusted=True)  # trusted: what it says is believed
    obj = proposed(plan)
    need = decide_with(obj, plan, 2)
    assert isinstance(need, NeedToolCall), need
    assert isinstance(need.step, ReadTool)


def test_a_recorded_consequential_call_is_not_lowered_by_a_later_trust_or_listing() -> None:
    """Proposed while honest (consequential); then the policy trusts the server and it says
    read-only. Listed the same (a digest equal by construction here is not the point): the recorded
    tier keeps it consequential."""
    honest = planner(lying=False)
    obj = proposed(honest)
    trusting = ModelPlanner(
        replace(honest.inputs, mcp_tiers={"mcp:tickets/close_ticket": ActionTier.READ_ONLY})
    )
    commit = commit_of(decide_with(obj, trusting, 2))
    assert commit.event is RunEvent.APPROVAL_REQUESTED, "the policy's later read-only does not lower it"


def test_a_tool_set_changed_under_a_proposed_call_fails_the_attempt_before_any_call() -> None:
    obj = proposed(planner(lying=False))
    decision_ = decide_with(obj, planner(lying=True, trusted=True), 2)
    assert not isinstance(decision_, NeedToolCall)
    commit = commit_of(decision_)
    assert commit.event is RunEvent.ATTEMPT_FAILED
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "ToolSetChanged"
    assert commit.intents == ()


@pytest.mark.parametrize("trusted", [False, True])
def test_a_server_that_turns_to_lying_under_a_decided_approval_gets_no_call(trusted: bool) -> None:
    obj = waiting_approval(planner(lying=False))
    request = obj["status"]["approvalRequest"]
    obj = patch_spec(
        obj, approvals={request["requestId"]: decision(obj, request["requestId"], request["digest"])}
    )
    lying = planner(lying=True, trusted=trusted)
    decided = commit_of(decide_with(obj, lying, 3))
    assert decided.event is RunEvent.APPROVAL_DECIDED
    obj = apply(obj, decided)
    after = decide_with(obj, lying, 4)  # resume validation
    assert not isinstance(after, NeedToolCall), "not called as a read outside the ledger"
    commit = commit_of(after)
    assert commit.event is RunEvent.ATTEMPT_FAILED, commit
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "ToolSetChanged"
    assert commit.intents == (), "no intent on the strength of a changed listing"


def test_a_server_that_turns_to_lying_under_an_expired_approval_gets_no_call_under_reapprove() -> None:
    reapprove = settings(freshness={"approvalExpired": "reapprove"})
    obj = waiting_approval(planner(lying=False), reapprove)
    lying = planner(lying=True, trusted=True)
    expired = commit_of(decide_with(obj, lying, 2 + timedelta(minutes=11).total_seconds(), s=reapprove))
    assert expired.event is RunEvent.REVALIDATION_REQUIRED
    obj = apply(obj, expired)
    after = decide_with(obj, lying, 2 + timedelta(minutes=12).total_seconds(), s=reapprove)
    assert not isinstance(after, NeedToolCall), "the expired approval is not a way around approval"
    commit = commit_of(after)
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "ToolSetChanged"
    assert commit.intents == ()


def test_an_expired_approval_of_an_unchanged_tool_set_asks_again() -> None:
    """The control: the same expiry with the server's listing unchanged asks a new approval."""
    reapprove = settings(freshness={"approvalExpired": "reapprove"})
    honest = planner(lying=False)
    obj = waiting_approval(honest, reapprove)
    obj = apply(obj, commit_of(decide_with(obj, honest, 2 + 11 * 60, s=reapprove)))
    commit = commit_of(decide_with(obj, honest, 2 + 12 * 60, s=reapprove))
    assert commit.event is RunEvent.REAPPROVAL_REQUIRED
    assert commit.status.approval_request is not None
    assert commit.status.approval_request.request_id == "agent-0-2"


def test_a_model_request_under_a_changed_tool_set_fails_the_attempt_saying_so() -> None:
    """No call pending (the model's last call was refused as a bad one): the next request is not
    asked under another tool set than the facts recorded."""
    honest = planner(lying=False)
    obj = new_run(objective="close T-101", **SPEC)
    obj = apply(obj, commit_of(decide_with(obj, honest, 0)))
    need = decide_with(obj, honest, 1)
    assert isinstance(need, NeedModelTurn)
    bad = ModelReply(
        model="reference-model", content=None, tool_calls=(ToolCall("c", "nope", "{}"),), usage=Usage(1, 1)
    )
    obj = apply(
        obj, commit_of(decide_with(obj, honest, 1, model=ModelAnswer(need.request.digest(), reply=bad)))
    )
    commit = commit_of(decide_with(obj, planner(lying=True), 2))
    assert commit.event is RunEvent.ATTEMPT_FAILED
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "ToolSetChanged"
