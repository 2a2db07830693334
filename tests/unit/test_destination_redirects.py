"""A redirect from an allowed destination to another host is never followed (issue 32, item 7):
an http.post, its reconciliation query and a model call each meet a 307/302 to a second server
that counts what reaches it; the second server sees nothing. (The MCP SDK itself follows only
redirects within the endpoint's origin: mcp.client.streamable_http.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web

from durable_agents.core.agent.exchange import ModelRequest
from durable_agents.shell.agent.model_client import ModelCallFailed, ModelClient, ModelEndpoint
from durable_agents.shell.effects.base import Action, EffectContext, Unknown
from durable_agents.shell.effects.http import HttpPost

pytestmark = pytest.mark.unit


@dataclass
class Servers:
    allowed: str  # redirects every request to ``elsewhere``
    hits: list[str]  # what reached ``elsewhere``


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    hits: list[str] = []

    async def count(request: web.Request) -> web.Response:
        hits.append(f"{request.method} {request.path}")
        return web.json_response({"receipt": "elsewhere"})

    other = web.Application()
    other.router.add_route("*", "/{tail:.*}", count)
    other_runner, other_url = await _serve(other)

    async def redirect(request: web.Request) -> web.Response:
        # localhost: another host than the allowed 127.0.0.1 (the same machine: a follow would land)
        location = other_url.replace("127.0.0.1", "localhost") + request.path_qs
        status = 307 if request.method == "POST" else 302
        return web.Response(status=status, headers={"Location": location})

    first = web.Application()
    first.router.add_route("*", "/{tail:.*}", redirect)
    first_runner, first_url = await _serve(first)
    yield Servers(first_url, hits)
    await first_runner.cleanup()
    await other_runner.cleanup()


def _action(servers: Servers) -> Action:
    target = {"url": f"{servers.allowed}/effects", "queryUrl": f"{servers.allowed}/effects"}
    return Action(key="run/0/pay", target=target, arguments={"n": 1})


async def test_an_http_post_is_not_redirected_to_another_host(servers: Servers) -> None:
    ctx = EffectContext(kube=None, namespace="ns", service_account="default")  # type: ignore[arg-type]
    result = await HttpPost().dispatch(ctx, _action(servers))
    assert isinstance(result, Unknown), result  # the receiver may have applied it: reconciled
    assert result.reason == "HTTP307"
    answer = await HttpPost().query(ctx, _action(servers))
    assert isinstance(answer, Unknown), answer
    assert answer.reason == "HTTP302"
    assert servers.hits == [], "a redirect was followed to another host"


async def test_a_model_call_is_not_redirected_to_another_host(servers: Servers) -> None:
    client = ModelClient()
    request = ModelRequest(model="m", messages=({"role": "user", "content": "hi"},), tools=())
    try:
        with pytest.raises(ModelCallFailed):
            await client.complete(ModelEndpoint(base_url=f"{servers.allowed}/v1", timeout_seconds=5), request)
    finally:
        await client.close()
    assert servers.hits == [], "a redirect was followed to another host"


async def test_a_messages_api_call_is_not_redirected_to_another_host(servers: Servers) -> None:
    client = ModelClient()
    request = ModelRequest(model="m", messages=({"role": "user", "content": "hi"},), tools=())
    endpoint = ModelEndpoint(base_url=servers.allowed, timeout_seconds=5, protocol="anthropic-messages")
    try:
        with pytest.raises(ModelCallFailed) as caught:
            await client.complete(endpoint, request)
    finally:
        await client.close()
    assert "HTTP 30" in caught.value.message, caught.value.message
    assert servers.hits == [], "a redirect was followed to another host"
