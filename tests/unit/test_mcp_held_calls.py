"""Which connections declare elicitation for a call held open (2025-11-25), and what a listing's
connection answers a request for input (issue 36, item 1)."""

from __future__ import annotations

import asyncio

import pytest
from mcp_types import INVALID_PARAMS, ErrorData, Tool, ToolExecution

from durable_agents.core.agent.mcp_elicitation import schema_problem
from durable_agents.shell.agent.mcp_elicitation import may_be_task, refuse_elicitation

pytestmark = pytest.mark.unit


def _tool(support: str | None) -> Tool:
    execution = ToolExecution(task_support=support) if support is not None else None
    return Tool(name="t", input_schema={"type": "object"}, execution=execution)


def test_a_tool_that_may_run_as_a_task_is_told_by_its_listing() -> None:
    # Its questions go through its task (tasks/result), never a call held open.
    assert may_be_task(_tool("optional"))
    assert may_be_task(_tool("required"))
    assert not may_be_task(_tool("forbidden"))
    assert not may_be_task(_tool(None))
    assert not may_be_task(None), "not listed: the call is not made anyway"


def test_a_listing_connection_refuses_any_request_for_input() -> None:
    said = asyncio.run(refuse_elicitation(None, None))
    assert isinstance(said, ErrorData)
    assert said.code == INVALID_PARAMS
    assert "listing" in said.message


def test_a_titled_multi_select_without_an_item_type_is_a_flat_form_and_an_object_is_not() -> None:
    titled = {"type": "array", "items": {"anyOf": [{"const": "fish-1", "title": "Tuna"}]}}
    assert schema_problem({"type": "object", "properties": {"fish": titled}}) is None
    typed_other = {"type": "array", "items": {"type": "number", "enum": [1]}}
    assert schema_problem({"type": "object", "properties": {"n": typed_other}}) is not None
    nested = {"type": "object", "properties": {"a": {"type": "object"}}}
    assert schema_problem(nested) is not None
