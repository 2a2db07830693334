"""A task of the 2025-11-25 form is polled on a client of its own (shell/agent/mcp_task_polls_2025.py),
bounded as the SDK's connection is: a ``tasks/result`` answered with one JSON body (no stream) was
read whole, whatever its size. A server outside the operator's trust answers 16 MiB there: the
poll fails past 4 MiB, saying so, as a server that did not answer (polled again later)."""

from __future__ import annotations

import json

import pytest
from aiohttp import web

from durable_agents.shell.agent.mcp_elicitation import ElicitationAnswer, ElicitationQuestion, HoldOpen
from durable_agents.shell.agent.mcp_notices import RESPONSE_MAX_BYTES
from durable_agents.shell.agent.mcp_task_polls_2025 import poll_in_session
from durable_agents.shell.agent.mcp_tools import McpUnreachable
from durable_agents_testkit.loopback import RunningApp
from durable_agents_testkit.modelserver import HUGE_BYTES

pytestmark = pytest.mark.unit


async def never_asked(question: ElicitationQuestion) -> ElicitationAnswer:
    raise AssertionError(f"no question was sent, yet {question} was asked")


async def test_a_single_answer_to_tasks_result_past_the_bound_is_cut_and_said() -> None:
    asked: list[tuple[str, str | None]] = []

    async def server(request: web.Request) -> web.StreamResponse:
        method = (await request.json())["method"]
        asked.append((method, request.headers.get("Accept-Encoding")))
        if method == "tasks/get":
            task = {"taskId": "t1", "status": "input_required"}
            return web.json_response({"jsonrpc": "2.0", "id": 1, "result": task})
        padding = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"padding": "x" * HUGE_BYTES}})
        huge = web.Response(body=padding.encode(), content_type="application/json")
        huge.enable_chunked_encoding()
        return huge

    app = web.Application()
    app.router.add_post("/mcp", server)
    async with RunningApp(app) as running:
        url = running.url + "/mcp"
        with pytest.raises(McpUnreachable) as raised:
            await poll_in_session(url, "t1", None, timeout=30, hold=HoldOpen("s", "t", never_asked, hold=5))
    message = str(raised.value)
    assert f"the server's response was larger than {RESPONSE_MAX_BYTES} bytes" in message, message
    assert asked == [("tasks/get", "identity"), ("tasks/result", "identity")]
