"""Interpreting a model's reply: a proposal checked against the declarations, never authority."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest

from durable_agents.api.v1alpha1 import ObjectReference
from durable_agents.core.agent.exchange import ModelReply, ToolCall, Usage
from durable_agents.core.agent.interpret import (
    FINAL_ANSWER_MAX,
    INVALID_TOOL_NAME,
    MESSAGE_MAX,
    CallMcpTool,
    FinalAnswer,
    Proposal,
    ProposedCall,
    ToolError,
    interpret,
)
from durable_agents.core.agent.tools import (
    ask_human_tool,
    await_event_tool,
    effect_tool,
    mcp_tool,
    read_tool,
)
from durable_agents.core.agent_facts import ARGUMENTS_DIGEST_LABEL, ARGUMENTS_MAX_BYTES, DROPPED_MAX
from durable_agents.core.digest import canonical_digest
from durable_agents.core.planner import AskHuman, AwaitEvent, PerformEffect, ReadObject
from durable_agents.core.sealed_values import keyed_digest, new_data_key

pytestmark = pytest.mark.unit

TARGET = {"url": "https://hooks.example/notify"}
TOOLS = (
    read_tool("read_configmap", "Read a ConfigMap", api_version="v1", kind="ConfigMap"),
    effect_tool(
        "notify",
        "Post a message",
        effect="http.post",
        target=TARGET,
        parameters={"type": "object", "properties": {"text": {"type": "string", "maxLength": 200}}},
    ),
    ask_human_tool("ask_operator", "Ask the operator", expires_in=timedelta(hours=2)),
    await_event_tool("await_deploy", "Wait for the deployment"),
    mcp_tool(
        "search_docs",
        "Search the docs",
        server="docs",
        tool="search",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        read_only=True,
        tier="read-only",
    ),
)


def _reply(*calls: tuple[str, str], content: str | None = "because", call_id: str = "call_abc") -> ModelReply:
    tool_calls = tuple(ToolCall(f"{call_id}{i or ''}", name, text) for i, (name, text) in enumerate(calls))
    return ModelReply(model="m", content=content, tool_calls=tool_calls, usage=Usage(10, 2))


def _call(proposal: Proposal) -> ProposedCall:
    assert isinstance(proposal, ProposedCall), proposal
    return proposal


def _error(proposal: Proposal) -> ToolError:
    assert isinstance(proposal, ToolError), proposal
    assert len(proposal.message) <= MESSAGE_MAX
    return proposal


# --- final answers ---------------------------------------------------------------------------------


def test_no_tool_call_is_the_final_answer() -> None:
    assert interpret(_reply(content="All done."), TOOLS, step_index=4) == FinalAnswer("All done.")
    assert interpret(_reply(content=None), TOOLS, step_index=4) == FinalAnswer("")


def test_a_long_final_answer_is_cut_to_what_an_outcome_holds() -> None:
    answer = interpret(_reply(content="x" * (FINAL_ANSWER_MAX + 10)), TOOLS, step_index=0)
    assert isinstance(answer, FinalAnswer)
    assert answer.truncated
    assert len(answer.text) == FINAL_ANSWER_MAX


# --- bad calls -------------------------------------------------------------------------------------


def test_an_unknown_tool_is_a_tool_error_naming_the_offered_tools() -> None:
    error = _error(interpret(_reply(("delete_everything", "{}")), TOOLS, step_index=2))
    assert "delete_everything" in error.message
    for tool in TOOLS:
        assert tool.name in error.message
    assert error.tool == "delete_everything"
    assert error.call_id == "call_abc"


def test_a_name_that_is_no_function_name_is_recorded_as_a_placeholder() -> None:
    error = _error(interpret(_reply(("rm -rf /", "{}")), TOOLS, step_index=2))
    assert error.tool == INVALID_TOOL_NAME


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('{"text": "hi"', "not valid JSON"),
        ("not json at all", "not valid JSON"),
        ('{"text": NaN}', "not valid JSON"),
        ('{"text": "a", "text": "b"}', "appears twice"),
        ('["hi"]', "must be a JSON object"),
        ('"hi"', "must be a JSON object"),
        ('{"text": 1e999999}', "not valid JSON"),
        ('{"n": 123456789012345678901234567890}', "not valid JSON"),
    ],
)
def test_arguments_that_are_no_json_object_are_a_tool_error(text: str, complaint: str) -> None:
    error = _error(interpret(_reply(("notify", text)), TOOLS, step_index=1))
    assert complaint in error.message
    assert error.tool == "notify"


def test_a_raw_text_is_recorded_when_the_arguments_are_no_object() -> None:
    error = _error(interpret(_reply(("notify", "{oops")), TOOLS, step_index=1))
    assert error.arguments == "{oops"
    error = _error(interpret(_reply(("notify", '{"text": 5}')), TOOLS, step_index=1))
    assert error.arguments == {"text": 5}


@pytest.mark.parametrize(
    ("tool", "arguments", "where"),
    [
        ("notify", {"text": 5}, "$.text"),
        ("notify", {"text": "x" * 201}, "$.text"),
        ("read_configmap", {}, "'name' is a required property"),
        ("read_configmap", {"name": "Not_A_Name"}, "$.name"),
        ("read_configmap", {"name": "settings", "namespace": "kube-system"}, "namespace"),
        ("ask_operator", {"question": ""}, "$.question"),
        ("await_deploy", {"event": "UPPER"}, "$.event"),
        ("search_docs", {"q": ["list"]}, "$.q"),
    ],
)
def test_arguments_invalid_under_the_schema_are_a_tool_error(
    tool: str, arguments: object, where: str
) -> None:
    error = _error(interpret(_reply((tool, json.dumps(arguments))), TOOLS, step_index=1))
    assert "invalid arguments" in error.message
    assert where in error.message


def test_arguments_over_the_size_bound_are_a_tool_error() -> None:
    huge = json.dumps({"text": "x" * ARGUMENTS_MAX_BYTES})
    wide = effect_tool("wide", "no limits", effect="http.post", target=TARGET)
    error = _error(interpret(_reply(("wide", huge)), (wide,), step_index=1))
    assert f"at most {ARGUMENTS_MAX_BYTES}" in error.message


def test_a_tool_error_message_is_bounded() -> None:
    many = tuple(read_tool(f"tool_{i:02d}_{'x' * 50}", "", api_version="v1", kind="Pod") for i in range(40))
    error = _error(interpret(_reply(("missing", "{}")), many, step_index=0))
    assert error.message.endswith("…")


# --- proposed calls --------------------------------------------------------------------------------


def test_only_the_first_of_several_calls_is_taken() -> None:
    reply = _reply(("read_configmap", '{"name": "first"}'), ("notify", '{"text": "second"}'))
    call = _call(interpret(reply, TOOLS, step_index=3))
    assert call.tool.name == "read_configmap"
    assert isinstance(call.step, ReadObject)
    assert call.step.ref.name == "first"
    assert call.call_id == "call_abc"
    assert call.dropped == ("notify",), "the second call is not executed, and is remembered to be told"


def test_further_calls_are_named_bounded_and_kept_with_a_refused_first_call() -> None:
    bad_name = "no such tool!"
    reply = _reply(("missing", "{}"), ("notify", "{}"), (bad_name, "{}"), *[("read_configmap", "{}")] * 5)
    error = _error(interpret(reply, TOOLS, step_index=0))
    assert error.dropped == ("notify", INVALID_TOOL_NAME, "read_configmap", "read_configmap")
    assert len(error.dropped) == DROPPED_MAX
    assert _call(interpret(_reply(("notify", '{"text": "x"}')), TOOLS, step_index=0)).dropped == ()


def test_a_read_becomes_a_read_object_of_the_declared_kind() -> None:
    call = _call(interpret(_reply(("read_configmap", '{"name": "settings"}')), TOOLS, step_index=5))
    assert call.step == ReadObject(
        "agent-5", ObjectReference(api_version="v1", kind="ConfigMap", name="settings")
    )
    assert call.step.ref.namespace is None  # the run's namespace, never one the model names
    assert call.reason == "because"
    key, other = new_data_key(entropy=os.urandom), new_data_key(entropy=os.urandom)
    digest = call.arguments_digest(key)
    assert digest == keyed_digest(key, ARGUMENTS_DIGEST_LABEL, {"name": "settings"})
    assert digest != call.arguments_digest(other), "keyed: without the run's key it cannot be tested"
    assert digest != canonical_digest({"name": "settings"})


def test_an_effect_target_is_the_declared_one_whatever_the_model_writes() -> None:
    text = json.dumps({"text": "hi", "target": {"url": "https://attacker.example/"}, "url": "https://x/"})
    call = _call(interpret(_reply(("notify", text)), TOOLS, step_index=7))
    assert isinstance(call.step, PerformEffect)
    assert call.step.effect == "http.post"
    assert call.step.target == TARGET
    assert call.step.arguments["text"] == "hi"
    # A copy: nothing done to the step reaches the declaration.
    call.step.target["url"] = "changed"
    assert TOOLS[1].target == TARGET


def test_ask_human_becomes_a_question_with_a_request_id_from_the_step() -> None:
    reply = _reply(("ask_operator", '{"question": "May I restart?"}'))
    call = _call(interpret(reply, TOOLS, step_index=9))
    assert call.step == AskHuman("agent-9", "agent-9", "May I restart?", timedelta(hours=2))
    again = _call(interpret(reply, TOOLS, step_index=9))
    assert again.step == call.step  # deterministic: a retried step asks under the same request ID


def test_await_event_becomes_a_wait() -> None:
    call = _call(interpret(_reply(("await_deploy", '{"event": "deployed"}')), TOOLS, step_index=2))
    assert call.step == AwaitEvent("agent-2", "agent-2", "deployed", None)


def test_an_mcp_tool_becomes_a_call_with_the_declared_server_and_tier() -> None:
    call = _call(interpret(_reply(("search_docs", '{"q": "leases"}')), TOOLS, step_index=1))
    assert call.step == CallMcpTool("agent-1", "docs", "search", {"q": "leases"}, True, "read-only")


@pytest.mark.parametrize("bad_id", ["", "x" * 65, "id with spaces", "ü"])
def test_an_unusable_call_id_is_replaced_by_one_from_the_step(bad_id: str) -> None:
    call = _call(interpret(_reply(("read_configmap", '{"name": "a"}'), call_id=bad_id), TOOLS, step_index=12))
    assert call.call_id == "call00012"


def test_empty_arguments_text_means_no_arguments() -> None:
    error = _error(interpret(_reply(("read_configmap", "")), TOOLS, step_index=0))
    assert "'name' is a required property" in error.message


def test_a_local_reference_that_does_not_resolve_is_a_tool_error_not_a_crash() -> None:
    broken = effect_tool(
        "broken",
        "",
        effect="http.post",
        target=TARGET,
        parameters={"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
    )
    error = _error(interpret(_reply(("broken", '{"a": 1}')), (broken,), step_index=0))
    assert "cannot be checked" in error.message


def test_a_schema_reference_is_followed() -> None:
    tool = effect_tool(
        "refs",
        "",
        effect="http.post",
        target=TARGET,
        parameters={
            "type": "object",
            "$defs": {"n": {"type": "integer"}},
            "properties": {"a": {"$ref": "#/$defs/n"}},
        },
    )
    assert isinstance(interpret(_reply(("refs", '{"a": 1}')), (tool,), step_index=0), ProposedCall)
    _error(interpret(_reply(("refs", '{"a": "one"}')), (tool,), step_index=0))


def test_a_text_far_over_the_bound_is_not_even_parsed() -> None:
    text = "[" * (4 * ARGUMENTS_MAX_BYTES + 1)
    error = _error(interpret(_reply(("notify", text)), TOOLS, step_index=0))
    assert "characters" in error.message
    assert isinstance(error.arguments, str)
