"""MCP requests with credentials (a bearer token, a CA bundle) against the reference MCP server
on loopback: refused without them, answered with them, a rotated token used by the next call, and
no credential value in what an error says."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_agents.shell.agent.mcp_tools import McpAccess, McpUnreachable, call_tool, list_tools
from durable_agents.shell.ground.certs import generate_ca, issue_serving_cert
from durable_agents_testkit.mcpserver import McpServerThread

pytestmark = pytest.mark.unit

TIMEOUT = 10.0
TOKEN = "mcp-token-4f1c9e"  # a value the assertions look for in every message


def bearer(token: str) -> McpAccess:
    return McpAccess(headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def guarded() -> Iterator[McpServerThread]:
    with McpServerThread(bearer_token=TOKEN) as running:
        yield running


async def test_the_server_refuses_a_request_without_the_token_and_nothing_is_sent(
    guarded: McpServerThread,
) -> None:
    for access in (McpAccess(), bearer("wrong-token")):
        with pytest.raises(McpUnreachable) as refused:
            await call_tool(
                guarded.url,
                "lookup_ticket",
                {"id": "T-100"},
                idempotency_key=None,
                timeout=TIMEOUT,
                access=access,
            )
        assert "refused the request's credentials (HTTP 401)" in str(refused.value), refused.value
        assert "wrong-token" not in str(refused.value), "a credential is never in an error"
    assert guarded.refused() >= 2
    assert guarded.counts() == {}


async def test_the_token_is_sent_and_a_rotated_one_is_used_by_the_next_call(guarded: McpServerThread) -> None:
    tools = await list_tools("tickets", guarded.url, timeout=TIMEOUT, access=bearer(TOKEN))
    assert "close_ticket" in {tool.name for tool in tools}
    guarded.rotate_token("rotated-token")
    with pytest.raises(McpUnreachable):
        await list_tools("tickets", guarded.url, timeout=TIMEOUT, access=bearer(TOKEN))
    answer = await call_tool(
        guarded.url,
        "lookup_ticket",
        {"id": "T-100"},
        idempotency_key=None,
        timeout=TIMEOUT,
        access=bearer("rotated-token"),
    )
    assert not answer.is_error


def test_an_access_shows_header_names_never_values() -> None:
    assert TOKEN not in repr(bearer(TOKEN))
    assert "Authorization" in repr(bearer(TOKEN))


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[McpServerThread, str]]:
    ca = generate_ca("mcp test CA")
    leaf = issue_serving_cert(ca, "mcp", ["localhost"], ["127.0.0.1"])
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(leaf.cert_pem)
    key.write_bytes(leaf.key_pem)
    with McpServerThread(tls=(cert, key)) as running:
        yield running, ca.cert_pem.decode()


async def test_an_https_server_is_verified_with_the_ca_bundle_and_refused_without_it(
    tls_server: tuple[McpServerThread, str],
) -> None:
    server, ca_pem = tls_server
    assert server.url.startswith("https://")
    with pytest.raises(McpUnreachable, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        await list_tools("tickets", server.url, timeout=TIMEOUT)
    other_ca = generate_ca("another CA").cert_pem.decode()
    with pytest.raises(McpUnreachable):
        await list_tools("tickets", server.url, timeout=TIMEOUT, access=McpAccess(ca_pem=other_ca))
    tools = await list_tools("tickets", server.url, timeout=TIMEOUT, access=McpAccess(ca_pem=ca_pem))
    assert "lookup_ticket" in {tool.name for tool in tools}
