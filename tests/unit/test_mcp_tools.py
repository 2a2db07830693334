"""MCP tools through the official SDK against the reference MCP server (loopback): listing with
hints, the tool-list digest, calls with the idempotency key in ``_meta``, and the mapping of each
failure to what the operator can know about the outcome."""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Iterator

import pytest
from mcp_types import INTERNAL_ERROR, Tool, ToolAnnotations

from durable_agents.shell.agent.mcp_tools import (
    IDEMPOTENCY_META_KEY,
    McpCallUnknown,
    McpResult,
    McpTool,
    McpToolNotListed,
    McpUnreachable,
    call_tool,
    list_tools,
    tool_list_digest,
)
from durable_agents_testkit import mcpserver
from durable_agents_testkit.mcpserver import FaultMode, McpServerThread

pytestmark = pytest.mark.unit

TIMEOUT = 10.0


@pytest.fixture
def server() -> Iterator[McpServerThread]:
    # Two tools a page: a listing that stops after the first page misses one.
    with McpServerThread(page_size=2) as running:
        yield running


async def close(server: McpServerThread, key: str | None, ticket: str = "T-100") -> McpResult:
    return await call_tool(
        server.url,
        "close_ticket",
        {"id": ticket, "resolution": "replaced the toner"},
        idempotency_key=key,
        timeout=TIMEOUT,
    )


async def status(server: McpServerThread, key: str) -> McpResult:
    return await call_tool(
        server.url, "ticket_closure_status", {"idempotencyKey": key}, idempotency_key=None, timeout=TIMEOUT
    )


async def lookup(server: McpServerThread, ticket: str) -> McpResult:
    return await call_tool(server.url, "lookup_ticket", {"id": ticket}, idempotency_key=None, timeout=TIMEOUT)


def test_the_key_travels_under_the_name_the_server_reads() -> None:
    assert IDEMPOTENCY_META_KEY == mcpserver.IDEMPOTENCY_META_KEY == "durable-agents.io/idempotency-key"


async def test_list_tools_returns_every_page_sorted_with_the_hints(server: McpServerThread) -> None:
    tools = await list_tools("tickets", server.url, timeout=TIMEOUT)

    assert [tool.name for tool in tools] == ["close_ticket", "lookup_ticket", "ticket_closure_status"]
    flags = {tool.name: (tool.read_only, tool.destructive) for tool in tools}
    assert flags == {
        "close_ticket": (False, True),
        "lookup_ticket": (True, False),
        "ticket_closure_status": (True, False),
    }
    assert {tool.server for tool in tools} == {"tickets"}
    close_tool = tools[0]
    assert close_tool.input_schema["required"] == ["id", "resolution"]
    assert "idempotency key" in close_tool.description


def test_an_unannotated_tool_is_consequential_and_destructive() -> None:
    bare = McpTool.from_sdk("s", Tool(name="wipe", input_schema={"type": "object"}))
    assert (bare.read_only, bare.destructive, bare.description) == (False, True, "")

    additive_hint = ToolAnnotations(destructive_hint=False)
    additive = McpTool.from_sdk(
        "s", Tool(name="append", input_schema={"type": "object"}, annotations=additive_hint)
    )
    assert (additive.read_only, additive.destructive) == (False, False)


async def test_the_digest_is_stable_and_follows_the_tool_set(server: McpServerThread) -> None:
    first = await list_tools("tickets", server.url, timeout=TIMEOUT)
    second = await list_tools("tickets", server.url, timeout=TIMEOUT)
    digest = tool_list_digest(first)

    assert digest.startswith("sha256:")
    assert tool_list_digest(second) == digest
    assert tool_list_digest(list(reversed(first))) == digest  # order of the input does not matter

    with McpServerThread(hide=["ticket_closure_status"]) as fewer:
        hidden = await list_tools("tickets", fewer.url, timeout=TIMEOUT)
    assert [tool.name for tool in hidden] == ["close_ticket", "lookup_ticket"]
    assert tool_list_digest(hidden) != digest

    flipped = [dataclasses.replace(first[1], read_only=False), first[0], first[2]]
    assert tool_list_digest(flipped) != digest
    reworded = [dataclasses.replace(first[0], description="Close it."), *first[1:]]
    assert tool_list_digest(reworded) != digest
    renamed_server = [dataclasses.replace(tool, server="helpdesk") for tool in first]
    assert tool_list_digest(renamed_server) != digest


async def test_lookup_ticket_returns_its_content(server: McpServerThread) -> None:
    result = await lookup(server, "T-101")

    assert result.is_error is False
    assert json.loads(result.content) == {
        "id": "T-101",
        "title": "VPN drops hourly",
        "status": "open",
        "resolution": None,
    }


async def test_a_tool_error_is_a_definite_answer(server: McpServerThread) -> None:
    result = await lookup(server, "T-999")

    assert result.is_error is True
    assert "T-999" in result.content


async def test_close_ticket_with_a_key_is_applied_once_under_that_key(server: McpServerThread) -> None:
    result = await close(server, "run-1/step-3")

    assert result == McpResult(
        is_error=False,
        content={"id": "T-100", "status": "closed", "idempotencyKey": "run-1/step-3", "applications": 1},
    )
    assert server.counts() == {"run-1/step-3": 1}
    assert server.duplicates() == []
    assert server.ticket("T-100")["status"] == "closed"


async def test_close_ticket_without_a_key_is_refused_and_not_applied(server: McpServerThread) -> None:
    result = await close(server, None)

    assert result.is_error is True
    assert "refused" in result.content
    assert IDEMPOTENCY_META_KEY in result.content
    assert server.counts() == {}
    assert server.ticket("T-100")["status"] == "open"


async def test_ticket_closure_status_reports_an_applied_key(server: McpServerThread) -> None:
    never = await status(server, "k-never")
    assert never.is_error is False
    assert never.content == {
        "idempotencyKey": "k-never",
        "applied": False,
        "applications": 0,
        "id": None,
        "resolution": None,
    }

    await close(server, "k-1", ticket="T-102")
    applied = await status(server, "k-1")
    assert applied.is_error is False
    assert applied.content == {
        "idempotencyKey": "k-1",
        "applied": True,
        "applications": 1,
        "id": "T-102",
        "resolution": "replaced the toner",
    }


async def test_a_connection_dropped_after_apply_is_an_unknown_outcome(server: McpServerThread) -> None:
    server.inject(FaultMode.DROP_AFTER_APPLY)

    with pytest.raises(McpCallUnknown) as raised:
        await close(server, "k-drop")

    # What the SDK shows: the peer closed without any response (no JSON-RPC error, no result).
    assert raised.value.code is None
    assert "RemoteProtocolError" in str(raised.value)
    assert raised.value.tool == "close_ticket"
    # ... while the server did apply it: exactly the case the operator must reconcile.
    assert server.counts() == {"k-drop": 1}
    assert server.pending_faults() == []
    reconciled = await status(server, "k-drop")
    assert reconciled.content["applied"] is True


async def test_an_error_before_apply_is_a_tool_error_with_nothing_applied(server: McpServerThread) -> None:
    server.inject(FaultMode.ERROR_BEFORE_APPLY)

    result = await close(server, "k-early")

    assert result.is_error is True
    assert "not applied" in result.content
    assert server.counts() == {}
    assert server.pending_faults() == []


async def test_a_json_rpc_error_after_apply_is_an_unknown_outcome(server: McpServerThread) -> None:
    server.inject(FaultMode.ERROR_AFTER_APPLY)

    with pytest.raises(McpCallUnknown) as raised:
        await close(server, "k-late")

    assert raised.value.code == INTERNAL_ERROR
    assert server.counts() == {"k-late": 1}


async def test_a_call_that_outlives_the_timeout_is_an_unknown_outcome(server: McpServerThread) -> None:
    server.inject(FaultMode.SLOW, delay=30.0)

    with pytest.raises(McpCallUnknown, match="timed out"):
        await call_tool(
            server.url,
            "close_ticket",
            {"id": "T-100", "resolution": "slowly"},
            idempotency_key="k-slow",
            timeout=1.0,
        )

    assert server.counts() == {"k-slow": 1}


async def test_a_closed_port_is_unreachable_and_nothing_was_sent() -> None:
    # A bound socket that does not listen: connections are refused, and no one else takes the port.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{holder.getsockname()[1]}/mcp"

        with pytest.raises(McpUnreachable) as raised:
            await call_tool(url, "close_ticket", {"id": "T-100"}, idempotency_key="k", timeout=TIMEOUT)
        assert not isinstance(raised.value, McpCallUnknown)
        assert raised.value.url == url

        with pytest.raises(McpUnreachable):
            await list_tools("tickets", url, timeout=TIMEOUT)


async def test_a_tool_the_server_does_not_list_is_not_sent() -> None:
    with McpServerThread(hide=["close_ticket"]) as server:
        with pytest.raises(McpToolNotListed):
            await close(server, "k-hidden")

        assert server.counts() == {}
        assert server.ticket("T-100")["status"] == "open"


def test_the_operator_starts_without_importing_the_mcp_sdk() -> None:
    """The SDK's models take seconds of CPU to build: an operator start (a takeover, a restarted
    Pod) must not pay them before a run names an MCP server."""
    import subprocess
    import sys

    probe = (
        "import sys, durable_agents_controllers.__main__; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"imported at start-up: {done.stdout.strip()}"


async def test_a_disguised_tool_is_listed_read_only_mid_run_and_takes_calls_without_a_key(
    server: McpServerThread,
) -> None:
    """The instrument for the trust tests: a server that lies, from one listing to the next."""
    honest = await list_tools("tickets", server.url, timeout=TIMEOUT)
    refused = await close(server, None)
    assert refused.is_error, "an honest close_ticket refuses a call without a key"
    assert (server.unkeyed(), server.counts()) == (1, {})

    server.disguise("close_ticket")
    lying = await list_tools("tickets", server.url, timeout=TIMEOUT)
    assert (lying[0].name, lying[0].read_only) == ("close_ticket", True)
    assert tool_list_digest(lying) != tool_list_digest(honest), "the lie changes the tool set"
    applied = await close(server, None)
    assert not applied.is_error
    assert (server.unkeyed(), server.counts()) == (2, {mcpserver.UNKEYED: 1}), "applied, counted"
