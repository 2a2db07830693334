"""The operator's model call to an endpoint speaking the Anthropic Messages API
(shell/agent/messages_client.py, chosen by the endpoint's protocol) against the reference model
server's /v1/messages: the core's request goes out translated, the reply comes back as the core's
plain values, and every failure of the endpoint is a ModelCallFailed naming the endpoint and the
kind of reply (never the key)."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web
from tests.unit.test_model_client import MODEL, REQUEST, SCRIPT

from durable_agents.core.agent.exchange import ModelRequest
from durable_agents.shell.agent.model_client import ModelCallFailed, ModelClient, ModelEndpoint
from durable_agents.shell.agent.model_replies import REPLY_MAX_BYTES, shown_endpoint
from durable_agents_testkit.loopback import RunningApp
from durable_agents_testkit.modelserver import HUGE_BYTES, ModelServerThread

pytestmark = pytest.mark.unit

KEY = "key-of-the-messages-test"
PROTOCOL = "anthropic-messages"


@pytest.fixture
def server() -> Iterator[ModelServerThread]:
    with ModelServerThread(SCRIPT, api_key=KEY) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[ModelClient]:
    c = ModelClient()
    yield c
    await c.close()


def endpoint(server: ModelServerThread, key: str = KEY, timeout: float = 10.0) -> ModelEndpoint:
    return ModelEndpoint(server.base_url_for(PROTOCOL), key, timeout, PROTOCOL)


async def test_a_tool_call_then_a_final_answer(server: ModelServerThread, client: ModelClient) -> None:
    first = await client.complete(endpoint(server), REQUEST)
    assert (first.model, first.content, first.finish_reason) == (
        MODEL,
        "The settings decide the surge.",
        "tool_use",
    )
    [call] = first.tool_calls
    assert (call.name, call.arguments_text) == ("read_settings", '{"name": "settings"}')
    assert first.usage.input_tokens > 0
    assert first.usage.output_tokens > 0
    answered = (
        {
            "role": "assistant",
            "content": first.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": '{"name":"settings"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "surge: 2"},
    )
    request = ModelRequest(model=MODEL, messages=REQUEST.messages + answered, tools=REQUEST.tools)
    final = await client.complete(endpoint(server), request)
    assert (final.content, final.tool_calls, final.finish_reason) == ("done", (), "end_turn")
    calls = server.calls()
    assert calls["byProtocol"] == {PROTOCOL: 2}, "both calls went to /v1/messages"
    # Recorded in the chat-completions shape: the system prompt first, the tool result as a tool message.
    recorded = calls["requests"][1]["messages"]
    assert recorded[0] == {"role": "system", "content": "You operate."}
    assert recorded[-1] == {"role": "tool", "tool_call_id": call.id, "content": "surge: 2"}


@pytest.mark.parametrize(
    ("mode", "reason", "said"),
    [
        ("unauthorized", "ModelAuthFailed", "AuthenticationError (HTTP 401) from http://127.0.0.1:"),
        ("overloaded", "ModelOverloaded", "OverloadedError (HTTP 529) from http://127.0.0.1:"),
        ("error", "ModelError", "InternalServerError (HTTP 500) from http://127.0.0.1:"),
        (
            "not_json",
            "ModelReplyNotJson",
            "a body that is not JSON although its content type is application/json",
        ),
        ("html", "ModelReplyNotJson", 'an HTML page (text/html): "Sign in to continue - Example Proxy"'),
        (
            "not_a_completion",
            "ModelReplyInvalid",
            "that is not a Messages API reply: its type is 'completion'",
        ),
        ("empty", "ModelReplyEmpty", "a Messages API reply with no content and no tool calls"),
        ("drop", "ModelUnreachable", "APIConnectionError"),
    ],
)
async def test_a_broken_endpoint_is_a_model_error_naming_it(
    server: ModelServerThread, client: ModelClient, mode: str, reason: str, said: str
) -> None:
    server.inject(mode)
    with pytest.raises(ModelCallFailed) as caught:
        await client.complete(endpoint(server), REQUEST)
    failed = caught.value
    assert (failed.reason, failed.retryable) == (reason, True)
    assert said in failed.message
    assert KEY not in failed.message, "the key is never quoted (the 401 fault echoes it)"


async def test_a_wrong_key_and_a_timeout(server: ModelServerThread, client: ModelClient) -> None:
    with pytest.raises(ModelCallFailed) as wrong:
        await client.complete(endpoint(server, key="not-the-key"), REQUEST)
    assert wrong.value.reason == "ModelAuthFailed"
    assert "HTTP 401" in wrong.value.message
    server.inject("slow", delay=5.0)
    with pytest.raises(ModelCallFailed) as slow:
        await client.complete(endpoint(server, timeout=0.5), REQUEST)
    assert slow.value.reason == "ModelTimeout"
    assert "timeout 0.5s" in slow.value.message


async def test_a_model_the_server_does_not_have_is_not_retried(
    server: ModelServerThread, client: ModelClient
) -> None:
    request = ModelRequest(model="another-model", messages=REQUEST.messages, tools=REQUEST.tools)
    with pytest.raises(ModelCallFailed) as caught:
        await client.complete(endpoint(server), request)
    assert (caught.value.reason, caught.value.retryable) == ("ModelNotFound", False)


async def test_a_reply_past_the_bound_is_cut_and_refused_not_read_into_memory(
    server: ModelServerThread, client: ModelClient
) -> None:
    """The ``anthropic`` client reads a body whole before handing it over: the bound sits under it.
    16 MiB without a Content-Length fails past REPLY_MAX_BYTES, named and retryable, and the next
    call is answered."""
    server.inject("huge")
    with pytest.raises(ModelCallFailed) as failed:
        await client.complete(endpoint(server), REQUEST)
    assert (failed.value.reason, failed.value.retryable) == ("ModelReplyTooLarge", True)
    where = shown_endpoint(endpoint(server).base_url)
    said = f"HTTP 200 from {where}: the reply is larger than {REPLY_MAX_BYTES} bytes, not read further"
    assert failed.value.message == said
    reply = await client.complete(endpoint(server), REQUEST)
    assert reply.tool_calls, "the client is usable after a cut reply"


async def huge_error(request: web.Request) -> web.StreamResponse:
    """A 500 whose body is 16 MiB: the client reads an error's body whole too, to quote it."""
    reply = web.Response(status=500, body=b"x" * HUGE_BYTES, content_type="text/plain")
    reply.enable_chunked_encoding()
    return reply


async def gzip_bomb(request: web.Request) -> web.StreamResponse:
    """16 KiB on the wire, 16 MiB once decoded, though the client asked for no encoding."""
    assert request.headers.get("Accept-Encoding") == "identity", request.headers
    body = gzip.compress(b" " * HUGE_BYTES)
    return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})


@pytest.mark.parametrize(
    ("handler", "reason", "said"),
    [
        (huge_error, "ModelReplyTooLarge", f"HTTP 500 from {{}}: the reply is larger than {REPLY_MAX_BYTES}"),
        (gzip_bomb, "ModelReplyInvalid", "HTTP 200 from {}: the reply is encoded (gzip) though none"),
    ],
)
async def test_an_errors_body_and_an_encoded_body_are_bounded_too(
    client: ModelClient, handler: web.Handler, reason: str, said: str
) -> None:
    app = web.Application()
    app.router.add_post("/v1/messages", handler)
    async with RunningApp(app) as running:
        target = ModelEndpoint(running.url, KEY, 10.0, PROTOCOL)
        with pytest.raises(ModelCallFailed) as failed:
            await client.complete(target, REQUEST)
    assert (failed.value.reason, failed.value.retryable) == (reason, True)
    assert failed.value.message.startswith(said.format(shown_endpoint(target.base_url))), failed.value.message


@pytest.mark.parametrize(
    ("header", "coding"), [(None, None), ("", None), (" Identity ", None), ("GZIP", "gzip"), ("br", "br")]
)
def test_the_coding_refused_is_the_one_the_http_client_would_decode(
    header: str | None, coding: str | None
) -> None:
    import httpx2

    from durable_agents.shell.agent.bounded_body import encoding_of

    headers = {} if header is None else {"Content-Encoding": header}
    assert encoding_of(httpx2.Response(200, headers=headers)) == coding
