"""Every content kind a tool result can carry, through the SDK against the content reference server
(loopback), as the model is given it; and what a server says besides its answer, bounded (issue
36, items 4 and 5): a result that does not match the output schema is a tool error, a 50 MiB
result a clear failure that says its size, a progress flood and a log flood fail nothing."""

from __future__ import annotations

import gzip
import logging
from collections.abc import Iterator

import pytest
from aiohttp import web

from durable_agents.core.agent.mcp_content import NOT_FETCHED, NOT_SHOWN, SCHEMA_MISMATCH
from durable_agents.core.digest import canonical_json
from durable_agents.shell.agent.mcp_notices import LOG_BURST, RESPONSE_MAX_BYTES, Progress
from durable_agents.shell.agent.mcp_tools import McpCallUnknown, McpResult, McpUnreachable, call_tool
from durable_agents_testkit import mcpcontent
from durable_agents_testkit.loopback import RunningApp
from durable_agents_testkit.mcpcontent import ContentServerThread

pytestmark = pytest.mark.unit

TIMEOUT = 30.0


@pytest.fixture
def server() -> Iterator[ContentServerThread]:
    with ContentServerThread() as running:
        yield running


async def show(server: ContentServerThread, tool: str, **arguments: int) -> McpResult:
    return await call_tool(
        server.url, tool, dict(arguments), idempotency_key=None, timeout=TIMEOUT, server="content"
    )


async def test_every_content_kind_reaches_the_model_usable_and_bounded(server: ContentServerThread) -> None:
    result = await show(server, "show_everything")
    assert not result.is_error
    text, image, audio, link, note, blob = result.content
    assert text == {"type": "text", "text": "Quarterly figures attached."}
    # A small image keeps its data for a model that accepts images; the context drops it for others.
    assert image == {
        "type": "image",
        "mimeType": "image/png",
        "bytes": 70,
        "note": NOT_SHOWN,
        "data": mcpcontent.PNG,
    }
    assert audio == {"type": "audio", "mimeType": "audio/wav", "bytes": 44, "note": NOT_SHOWN}
    assert link == {
        "type": "resource_link",
        "name": "q3-report",
        "uri": mcpcontent.REPORT_URI,
        "mimeType": "application/pdf",
        "description": "The Q3 report",
        "note": NOT_FETCHED,
    }
    assert note == {
        "type": "resource",
        "resource": {"uri": mcpcontent.NOTE_URI, "mimeType": "text/plain", "text": mcpcontent.NOTE_TEXT},
    }
    assert blob["uri"] == "blob://raw/1"
    assert blob["bytes"] == 1024
    assert blob["note"] == NOT_SHOWN
    assert mcpcontent.WAV not in canonical_json(result.content).decode(), "no audio's base64 is kept"
    assert mcpcontent.BLOB not in canonical_json(result.content).decode(), "no blob's base64 is kept"


async def test_structured_content_matching_its_schema_is_given_as_structured(
    server: ContentServerThread,
) -> None:
    result = await show(server, "show_structured")
    assert result == McpResult(is_error=False, content={"total": 42, "currency": "EUR"})


async def test_structured_content_that_does_not_match_the_schema_is_a_tool_error(
    server: ContentServerThread,
) -> None:
    result = await show(server, "show_mismatch")
    assert result.is_error, "a mismatch is the tool's definite answer, an error: not an unknown outcome"
    assert isinstance(result.content, str)
    assert result.content.startswith(SCHEMA_MISMATCH)
    assert "show_mismatch" in result.content
    assert "'many' is not of type 'integer'" in result.content, result.content


async def test_a_result_of_50_mib_is_cut_at_the_bound_and_said(server: ContentServerThread) -> None:
    with pytest.raises(McpCallUnknown) as raised:
        await show(server, "show_large", mebibytes=50)
    message = str(raised.value)
    assert f"larger than {RESPONSE_MAX_BYTES} bytes" in message, message
    assert "timed out" not in message, "cut at once, not waited out"
    # A result under the bound is read whole (the model is given at most 16 KiB of it later).
    small = await show(server, "show_large", mebibytes=1)
    assert not small.is_error
    assert len(small.content) == 1024 * 1024


async def test_a_response_encoded_though_none_was_asked_for_is_not_decoded() -> None:
    """16 KiB of gzip on the wire is 16 MiB decoded (a bomb is gigabytes): counted on the wire it
    would pass the bound. Every request asks for no encoding; a response encoded anyway is refused
    unread, and the failure says so. Here the refusal is the answer to ``initialize``: the call
    itself was never sent."""
    asked: list[str | None] = []

    async def bomb(request: web.Request) -> web.StreamResponse:
        asked.append(request.headers.get("Accept-Encoding"))
        body = gzip.compress(b" " * (16 * 1024 * 1024))
        return web.Response(
            body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    app = web.Application()
    app.router.add_post("/mcp", bomb)
    async with RunningApp(app) as running:
        with pytest.raises(McpUnreachable) as raised:
            await call_tool(
                running.url + "/mcp", "any", {}, idempotency_key=None, timeout=TIMEOUT, server="bomb"
            )
    message = str(raised.value)
    assert ": not sent: " in message, message
    assert "the server's response was encoded (gzip) though none was asked for and was not read" in message
    assert asked, "the server was asked"
    assert set(asked) == {"identity"}, asked


async def test_a_progress_flood_and_a_log_flood_fail_nothing_and_are_bounded(
    server: ContentServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[Progress] = []
    caplog.set_level(logging.DEBUG, logger="durable_agents.mcp.server_log")
    result = await call_tool(
        server.url,
        "show_noisy",
        {"progress": 2000, "logs": 500},
        idempotency_key=None,
        timeout=TIMEOUT,
        server="content",
        on_progress=seen.append,
    )
    assert result == McpResult(is_error=False, content="noisy done")
    sent = server.noise()
    assert (sent.progress, sent.logs) == (2000, 500), "the server did flood"
    assert seen
    assert seen[-1].progress == 2000
    assert seen[-1].total == 2000
    assert seen[-1].message == "step 2000 of 2000"
    lines = [r for r in caplog.records if r.name == "durable_agents.mcp.server_log"]
    forwarded = [r for r in lines if "logs (" in r.getMessage()]
    assert forwarded, "the server's log notifications reach the operator's log"
    assert all(r.levelno == logging.DEBUG for r in lines)
    assert all("'content'" in r.getMessage() for r in lines), "each line names the server"
    assert len(forwarded) < 500, f"a log flood is rate-bounded, {len(forwarded)} lines forwarded"
    assert len(forwarded) >= LOG_BURST
    assert all(len(r.getMessage()) < 1024 for r in forwarded), "each line is cut"
    assert any("not forwarded" in r.getMessage() for r in lines), "what was dropped is said"
