"""Tool declarations: what a person fixes, what the model is shown, and the tool set's digest."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from durable_agents.core.agent.tools import (
    ToolDeclaration,
    ToolDeclarationError,
    ask_human_tool,
    await_event_tool,
    declaration_json,
    effect_tool,
    mcp_tool,
    openai_tools,
    read_tool,
    tool_set_digest,
)

pytestmark = pytest.mark.unit


def _tools(url: str = "https://hooks.example/a") -> list[ToolDeclaration]:
    return [
        read_tool("read_pod", "Read a Pod", api_version="v1", kind="Pod"),
        effect_tool("notify", "Post", effect="http.post", target={"url": url}),
        ask_human_tool("ask", "Ask", expires_in=timedelta(minutes=30)),
        await_event_tool("wait", "Wait"),
        _search("read-only"),
    ]


def _search(tier: str) -> ToolDeclaration:
    return mcp_tool(
        "search",
        "Search",
        server="docs",
        tool="search",
        parameters={"type": "object"},
        read_only=True,
        tier=tier,
    )


def test_the_digest_ignores_order_but_not_content() -> None:
    tools = _tools()
    assert tool_set_digest(tools) == tool_set_digest(reversed(tools))
    assert tool_set_digest(tools) != tool_set_digest(_tools(url="https://hooks.example/b"))
    assert tool_set_digest(tools) != tool_set_digest(tools[:-1])
    retiered = [*tools[:-1], _search("consequential")]
    assert tool_set_digest(tools) != tool_set_digest(retiered)


def test_the_model_sees_functions_sorted_by_name_and_never_a_target_or_server() -> None:
    rendered = openai_tools(_tools())
    assert [entry["function"]["name"] for entry in rendered] == [
        "ask",
        "notify",
        "read_pod",
        "search",
        "wait",
    ]
    assert all(set(entry) == {"type", "function"} and entry["type"] == "function" for entry in rendered)
    text = repr(rendered)
    assert "hooks.example" not in text
    assert "docs" not in text
    notify = next(entry for entry in rendered if entry["function"]["name"] == "notify")
    assert notify["function"]["parameters"] == {"type": "object"}


def test_builtin_kinds_get_their_schemas() -> None:
    read, _, ask, wait, _ = _tools()
    assert read.parameters["required"] == ["name"]
    assert ask.parameters["required"] == ["question"]
    assert wait.parameters["required"] == ["event"]
    assert read.parameters["additionalProperties"] is False


def test_the_json_form_holds_what_the_declaration_fixes() -> None:
    read, notify, ask, _, search = _tools()
    assert declaration_json(read)["apiVersion"] == "v1"
    assert declaration_json(notify)["target"] == {"url": "https://hooks.example/a"}
    assert declaration_json(ask)["expiresInMicroseconds"] == 30 * 60 * 1_000_000
    assert declaration_json(search)["readOnly"] is True
    assert "readOnly" not in declaration_json(notify)


@pytest.mark.parametrize("name", ["", "has space", "x" * 65, "dots.not.allowed", "ü"])
def test_a_name_the_api_would_refuse_is_refused(name: str) -> None:
    with pytest.raises(ToolDeclarationError, match="must match"):
        ask_human_tool(name, "Ask")


@pytest.mark.parametrize(
    "fields",
    [
        {"kind": "read", "api_version": "v1"},  # no object_kind
        {"kind": "effect", "effect": "http.post"},  # no target
        {"kind": "ask_human", "target": {"url": "x"}},  # a field of another kind
        {"kind": "mcp", "server": "s", "tool": "t"},  # no tier
        {"kind": "teleport"},
    ],
)
def test_a_kind_needs_its_fields_and_only_those(fields: dict[str, Any]) -> None:
    with pytest.raises(ToolDeclarationError):
        ToolDeclaration(name="t", description="", parameters={"type": "object"}, **fields)


@pytest.mark.parametrize(
    "parameters",
    [{"type": "string"}, {"type": "object", "properties": {"a": {"type": "no-such-type"}}}, {}],
)
def test_a_bad_schema_is_refused_when_declared(parameters: dict[str, Any]) -> None:
    with pytest.raises(ToolDeclarationError, match="parameters"):
        effect_tool("e", "", effect="http.post", target={}, parameters=parameters)


def test_a_schema_is_checked_once_and_a_bad_one_refused_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model run declares its tools at every turn: a schema once checked is remembered by its
    JSON text (key order aside), and a bad one is refused at each declaration all the same."""
    from durable_agents.core.agent import tools

    checked: list[Any] = []
    real = tools.Draft202012Validator.check_schema
    monkeypatch.setattr(tools.Draft202012Validator, "check_schema", lambda s: checked.append(s) or real(s))
    tools._checked_text.cache_clear()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    reordered = {"properties": {"b": {"type": "string"}, "a": {"type": "integer"}}, "type": "object"}
    for parameters in (schema, schema, reordered):
        effect_tool("e", "", effect="http.post", target={}, parameters=parameters)
    assert len(checked) == 1
    bad = {"type": "object", "properties": {"a": {"type": "no-such-type"}}}
    for _ in range(2):
        with pytest.raises(ToolDeclarationError, match="no-such-type"):
            effect_tool("e", "", effect="http.post", target={}, parameters=bad)
    assert len(checked) == 2


def test_a_large_schema_is_checked_every_time_not_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """An MCP server chooses its tools' schemas: large ones are not kept in memory."""
    from durable_agents.core.agent import tools

    checked: list[Any] = []
    real = tools.Draft202012Validator.check_schema
    monkeypatch.setattr(tools.Draft202012Validator, "check_schema", lambda s: checked.append(s) or real(s))
    tools._checked_text.cache_clear()
    big = {"type": "object", "description": "x" * tools.REMEMBERED_SCHEMA_BYTES}
    for _ in range(2):
        effect_tool("e", "", effect="http.post", target={}, parameters=big)
    assert len(checked) == 2
    assert tools._checked_text.cache_info().currsize == 0


def test_two_tools_of_one_name_are_refused() -> None:
    tools = [ask_human_tool("same", "a"), await_event_tool("same", "b")]
    with pytest.raises(ToolDeclarationError, match="two tools"):
        tool_set_digest(tools)
    with pytest.raises(ToolDeclarationError, match="two tools"):
        openai_tools(tools)


def test_the_declared_target_is_a_copy() -> None:
    target = {"url": "https://hooks.example/a"}
    tool = effect_tool("notify", "Post", effect="http.post", target=target)
    target["url"] = "https://attacker.example/"
    assert tool.target == {"url": "https://hooks.example/a"}


@pytest.mark.parametrize("ref", ["https://schemas.example/args.json", "other.json#/x"])
def test_a_schema_referring_outside_itself_is_refused(ref: str) -> None:
    parameters = {"type": "object", "properties": {"a": {"items": [{"$ref": ref}]}}}
    with pytest.raises(ToolDeclarationError, match="outside themselves"):
        effect_tool("e", "", effect="http.post", target={}, parameters=parameters)
    local = {"type": "object", "$defs": {"t": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/t"}}}
    assert effect_tool("e", "", effect="http.post", target={}, parameters=local).parameters == local
