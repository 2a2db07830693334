"""The worker's second line for a read-only MCP tool call (issue 32, item 7): the call's server URL
is checked against the run's policy right before the call; outside it, the model is told the error
``DestinationNotAllowed`` and the server receives nothing. Against the reference MCP server, which
counts the HTTP requests that reach it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from tests.unit.builders import new_run, snap

from durable_agents.api.v1alpha1 import AgentPolicySpec
from durable_agents.core.engine import NeedToolCall, Observations, Settings
from durable_agents.core.planner import ReadTool
from durable_agents.shell.agent.tool_calls import DESTINATION_NOT_ALLOWED, refused_destination
from durable_agents.shell.runs.observing import Observers
from durable_agents_testkit.mcpserver import McpServerThread

pytestmark = pytest.mark.unit


@pytest.fixture
def server() -> Iterator[McpServerThread]:
    with McpServerThread() as running:
        yield running


def _settings(entries: list[str] | None) -> Settings:
    destinations = None if entries is None else {"mcpServers": entries}
    policy = AgentPolicySpec.model_validate({"version": "1", "destinations": destinations})
    return Settings(policy_name="narrow", policy_version="1", policy=policy)


def _call(server: McpServerThread) -> NeedToolCall:
    step = ReadTool(
        name="look", server="tickets", url=server.url, tool="lookup_ticket", arguments={"id": "T-101"}
    )
    return NeedToolCall(step_index=1, step=step)


def test_a_server_outside_the_policy_gets_an_error_result_and_no_request(server: McpServerThread) -> None:
    run = snap(new_run(agent={"mcpServers": [{"name": "tickets", "url": server.url}]}))
    other = server.url.rsplit("/", 1)[0] + "/other"
    refused = refused_destination(run, _call(server), _settings([other]))
    assert refused is not None
    assert refused.error_reason == DESTINATION_NOT_ALLOWED
    assert "the MCP server 'tickets'" in refused.error_message
    assert "AgentPolicy team-a/narrow spec.destinations.mcpServers" in refused.error_message
    assert refused_destination(run, _call(server), _settings([server.url])) is None
    assert refused_destination(run, _call(server), _settings(None)) is None  # not restricted


async def test_the_observer_checks_before_it_calls(server: McpServerThread) -> None:
    run = snap(new_run(agent={"mcpServers": [{"name": "tickets", "url": server.url}]}))
    # Only a tool call is observed; the server names no credentials, so no API client is needed.
    observers = Observers(SimpleNamespace(kube=None), None, None)  # type: ignore[arg-type]
    seen = await observers.observe(
        run, _call(server), datetime.now(UTC), Observations(), _settings(["http://127.0.0.1:1/mcp"])
    )
    assert seen is not None
    assert seen.read is not None
    assert seen.read.error_reason == DESTINATION_NOT_ALLOWED
    assert server.http_requests() == 0, "the MCP server was called"
    allowed = await observers.observe(
        run, _call(server), datetime.now(UTC), Observations(), _settings([server.url])
    )
    assert allowed is not None
    assert allowed.read is not None
    assert allowed.read.error_reason is None
    assert server.http_requests() > 0, "the control: an allowed call reaches the server"
