"""One notification attempt against a loopback receiver (shell/observability/notify_http.py): each
bad answer is a failed attempt with its outcome word and the endpoint named; an endless answer
body is cut at the limit (read in chunks, never buffered whole: else this would time out)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import aiohttp
import pytest
from aiohttp import web

from durable_agents.api.v1alpha1 import NotificationEvent, NotificationTarget
from durable_agents.core.notifications import Delivery, Notice
from durable_agents.shell.observability.notify_http import BODY_LIMIT, attempt

NOTICE = Notice(
    "u-1.ended.completed",
    NotificationEvent.RUN_ENDED,
    "team-a",
    "pay",
    datetime(2026, 12, 3, tzinfo=UTC),
    {"run": "pay", "namespace": "team-a", "state": "completed"},
)


async def endless(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200)
    await response.prepare(request)
    chunk = b"x" * 65536
    while True:  # until the client stops reading
        await response.write(chunk)


async def hang(request: web.Request) -> web.Response:
    await asyncio.sleep(3)  # past the attempt's 1s
    return web.Response()


async def drop(request: web.Request) -> web.Response:
    assert request.transport is not None
    request.transport.close()
    await asyncio.sleep(1)
    return web.Response()


ROUTES: dict[str, Callable[[web.Request], object]] = {
    "/ok": lambda r: web.Response(text="thanks"),
    "/fail": lambda r: web.Response(status=500, reason="Broken"),
    "/moved": lambda r: web.Response(status=302, headers={"Location": "http://elsewhere.example/x"}),
    "/big": lambda r: web.Response(body=b"y" * (BODY_LIMIT + 1)),
}


@pytest.fixture
async def base() -> AsyncIterator[str]:
    app = web.Application()
    for path, handler in ROUTES.items():

        async def wrapped(request: web.Request, handler: Callable[[web.Request], object] = handler) -> object:
            return handler(request)

        app.router.add_post(path, wrapped)  # type: ignore[arg-type]
    app.router.add_post("/endless", endless)
    app.router.add_post("/hang", hang)
    app.router.add_post("/drop", drop)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.mark.parametrize(
    ("path", "outcome", "said"),
    [
        ("/ok", "delivered", ""),
        ("/fail", "http_error", "answered 500 Broken"),
        ("/moved", "redirect", "'http://elsewhere.example/x': not followed"),
        ("/big", "too_large", f"over {BODY_LIMIT} bytes"),
        ("/endless", "too_large", f"over {BODY_LIMIT} bytes"),
        ("/hang", "timeout", "no answer within 1s"),
        ("/drop", "connection_error", "ServerDisconnectedError"),
    ],
)
async def test_each_answer_is_one_outcome_naming_the_endpoint(
    base: str, path: str, outcome: str, said: str
) -> None:
    target = NotificationTarget(name="hook", url=f"{base}{path}")
    async with aiohttp.ClientSession() as session:
        tried = await attempt(session, Delivery(target, NOTICE, "k"), 1.0)
    assert tried.outcome == outcome, tried
    assert said in tried.message
    if outcome != "delivered":
        assert f"hook ({base}{path})" in tried.message
