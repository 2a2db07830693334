"""The operator's model call (shell/agent/model_client.py) against the reference model server: the core's
request goes out as built, the reply comes back as the core's plain values, and every failure is a
typed, reasoned ModelCallFailed (never a silent retry: the client's own retries are off)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from durable_agents.core.agent.exchange import ModelRequest
from durable_agents.shell.agent.credentials import Unresolvable, header_value
from durable_agents.shell.agent.model_client import (
    REPLY_MAX_BYTES,
    ModelCallFailed,
    ModelClient,
    ModelEndpoint,
    status_failure,
)
from durable_agents_testkit.modelserver import ModelServerThread

pytestmark = pytest.mark.unit

MODEL = "reference-model"
KEY = "model-key"
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "read_settings",
        "description": "read the settings",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
    },
}
SCRIPT: dict[str, Any] = {
    "model": MODEL,
    "rules": [
        {
            "when": {"notCalled": ["read_settings"]},
            "content": "The settings decide the surge.",
            "toolCalls": [{"name": "read_settings", "arguments": {"name": "settings"}}],
        },
        {"when": {"called": ["read_settings"]}, "content": "done"},
    ],
}
REQUEST = ModelRequest(
    model=MODEL,
    messages=({"role": "system", "content": "You operate."}, {"role": "user", "content": "Surge."}),
    tools=(TOOL,),
)


@pytest.fixture
def server() -> Iterator[ModelServerThread]:
    with ModelServerThread(SCRIPT, api_key=KEY) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[ModelClient]:
    c = ModelClient()
    yield c
    await c.close()


def endpoint(server: ModelServerThread, key: str | None = KEY, timeout: float = 5.0) -> ModelEndpoint:
    return ModelEndpoint(base_url=server.base_url, api_key=key, timeout_seconds=timeout)


async def test_a_tool_call_comes_back_as_the_cores_reply(
    client: ModelClient, server: ModelServerThread
) -> None:
    reply = await client.complete(endpoint(server), REQUEST)

    assert reply.model == MODEL
    assert reply.content == "The settings decide the surge."
    assert reply.finish_reason == "tool_calls"
    [call] = reply.tool_calls
    assert call.name == "read_settings"
    assert json.loads(call.arguments_text) == {"name": "settings"}
    assert reply.usage.input_tokens > 0
    assert reply.usage.output_tokens > 0
    # What went out is the core's body: one tool call per turn, the tools as built.
    [sent] = server.calls()["requests"]  # type: ignore[misc]
    assert sent["parallel_tool_calls"] is False  # type: ignore[index]
    assert sent["tools"] == [TOOL]  # type: ignore[index]
    assert sent["messages"] == list(REQUEST.messages)  # type: ignore[index]


async def test_the_same_request_gets_the_same_call_id(client: ModelClient, server: ModelServerThread) -> None:
    """A crash between boundaries repeats the call: the reference server answers it identically."""
    first = await client.complete(endpoint(server), REQUEST)
    again = await client.complete(endpoint(server), REQUEST)
    assert first.tool_calls == again.tool_calls


@pytest.mark.parametrize(
    ("fault", "options", "reason", "retryable"),
    [
        ("error", {}, "ModelError", True),
        ("drop", {}, "ModelUnreachable", True),
        ("slow", {"delay": 1.0}, "ModelTimeout", True),
    ],
)
async def test_a_failed_call_is_a_reasoned_failure_and_is_not_retried(
    client: ModelClient,
    server: ModelServerThread,
    fault: str,
    options: dict[str, Any],
    reason: str,
    retryable: bool,
) -> None:
    server.inject(fault, **options)
    with pytest.raises(ModelCallFailed) as failed:
        await client.complete(endpoint(server, timeout=0.3), REQUEST)
    assert failed.value.reason == reason
    assert failed.value.retryable is retryable
    assert server.calls()["total"] == 1, "the client itself must not retry: the run's policy does"
    if reason != "ModelError":  # a timeout or a lost connection names the endpoint and the limit
        assert f"({server.base_url}, timeout 0.3s)" in failed.value.message


async def test_a_bad_key_is_retryable_and_never_named(client: ModelClient, server: ModelServerThread) -> None:
    """A wrong key is fixed in its Secret (the resolver reads it again): the run's retry windows
    give that a chance, bounded by its policy; the message never holds the key."""
    wrong = "sk-wrong-key-0123456789abcdef"
    with pytest.raises(ModelCallFailed) as failed:
        await client.complete(endpoint(server, key=wrong), REQUEST)
    assert failed.value.reason == "ModelAuthFailed"
    assert failed.value.retryable is True
    assert failed.value.message == (
        f"AuthenticationError (HTTP 401) from {server.base_url}: "
        'a JSON error (application/json): "Incorrect API key provided."'
    )


@pytest.mark.parametrize(
    ("fault", "reason", "kind"),
    [
        (
            "html",
            "ModelReplyNotJson",
            'HTTP 200 with an HTML page (text/html): "Sign in to continue - Example Proxy"',
        ),
        (
            "not_json",
            "ModelReplyNotJson",
            "HTTP 200 with a body that is not JSON although its content type is application/json:"
            ' "upstream connect error or disconnect/reset before headers. reset reason: overflow"',
        ),
        (
            "not_a_completion",
            "ModelReplyInvalid",
            "HTTP 200 with a JSON dict (application/json) that is not a chat completion: it has no choices",
        ),
        ("empty", "ModelReplyEmpty", "HTTP 200 with a chat completion with no content and no tool calls"),
        ("unauthorized", "ModelAuthFailed", "(HTTP 401) from"),
        ("error", "ModelError", "InternalServerError (HTTP 500) from"),
    ],
)
async def test_every_broken_reply_is_a_retryable_model_error_naming_the_endpoint_and_the_kind(
    client: ModelClient, server: ModelServerThread, fault: str, reason: str, kind: str
) -> None:
    """Issue 30 (6): an HTML page or a non-JSON body with 200 used to escape the client as a
    JSONDecodeError or an AttributeError (the operator's internal error, quarantined after five
    tracebacks). Each is now the endpoint's failure, named, retryable, without the key."""
    server.inject(fault)
    with pytest.raises(ModelCallFailed) as failed:
        await client.complete(endpoint(server), REQUEST)
    assert failed.value.reason == reason
    assert failed.value.retryable is True
    assert server.base_url in failed.value.message
    assert kind in failed.value.message, failed.value.message
    assert KEY not in failed.value.message, "the 401 fault echoes the key it was given"
    assert len(failed.value.message) <= 400, "a bounded excerpt, never the whole body"


async def test_a_reply_past_the_bound_is_cut_and_refused_not_read_into_memory(
    client: ModelClient, server: ModelServerThread
) -> None:
    """A body without a Content-Length that never ends (here 16 MiB, four times the bound) is not
    read whole: past REPLY_MAX_BYTES the call fails, named and retryable; the next call is answered."""
    server.inject("huge")
    with pytest.raises(ModelCallFailed) as failed:
        await client.complete(endpoint(server), REQUEST)
    assert failed.value.reason == "ModelReplyTooLarge"
    assert failed.value.retryable is True
    said = f"HTTP 200 from {server.base_url}: the reply is larger than {REPLY_MAX_BYTES} bytes"
    assert failed.value.message.startswith(said), failed.value.message
    reply = await client.complete(endpoint(server), REQUEST)
    assert reply.tool_calls, "the session is usable after a cut reply"


async def test_an_unknown_model_is_named(client: ModelClient, server: ModelServerThread) -> None:
    request = ModelRequest(model="no-such-model", messages=REQUEST.messages, tools=REQUEST.tools)
    with pytest.raises(ModelCallFailed) as failed:
        await client.complete(endpoint(server), request)
    assert failed.value.reason == "ModelNotFound"
    assert failed.value.retryable is False


async def test_a_key_no_header_can_carry_is_a_model_error_not_an_exception(
    client: ModelClient, server: ModelServerThread
) -> None:
    """The SDK raised UnicodeEncodeError (no OpenAIError) for a non-ASCII key: an internal error."""
    with pytest.raises(ModelCallFailed) as failed:
        await client.complete(endpoint(server, key="ключ-секрет"), REQUEST)
    assert failed.value.reason == "ModelEndpointInvalid"
    assert failed.value.message == f"the request to {server.base_url} cannot be sent: UnicodeEncodeError"
    assert server.calls()["total"] == 0


@pytest.mark.parametrize("status", [302, 400, 401, 403, 404, 409, 418, 422, 429, 500, 503])
def test_a_status_is_named_as_the_openai_client_names_it(status: int) -> None:
    """The call no longer goes through the ``openai`` client (its HTTP path was a fifth of the
    operator's CPU in the model row, issue 38), but runs' messages keep its names for a status."""
    import httpx2
    import openai

    sdk = openai.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")
    response = httpx2.Response(
        status, request=httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    )
    named = type(sdk._make_status_error("m", body=None, response=response)).__name__
    assert status_failure(status)[0] == named


async def test_a_refused_connection_is_unreachable_and_names_the_endpoint(client: ModelClient) -> None:
    import socket

    with socket.socket() as closed:  # a port nothing listens on: bound, never listened
        closed.bind(("127.0.0.1", 0))
        base_url = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
        with pytest.raises(ModelCallFailed) as failed:
            await client.complete(ModelEndpoint(base_url=base_url, api_key=KEY, timeout_seconds=5), REQUEST)
    assert failed.value.reason == "ModelUnreachable"
    assert failed.value.retryable is True
    assert f"({base_url}, timeout 5s)" in failed.value.message
    assert KEY not in failed.value.message


async def test_the_proxy_in_the_environment_carries_the_call(
    server: ModelServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HTTP(S)_PROXY`` is how a platform team sends the operator's egress through its proxy (the
    chart's ``env``): the call to a host only the proxy knows reaches the model through it."""
    monkeypatch.setenv("HTTP_PROXY", server.base_url.removesuffix("/v1"))
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    proxied = ModelClient()
    try:
        reply = await proxied.complete(
            ModelEndpoint(base_url="http://model.invalid/v1", api_key=KEY, timeout_seconds=5), REQUEST
        )
    finally:
        await proxied.close()
    assert reply.content == "The settings decide the surge."
    assert server.calls()["total"] == 1


@pytest.mark.parametrize("raw", ["ключ".encode(), b"\xff\xfe", b"sk-a\nb", b"sk-a\x00"])
def test_the_resolver_refuses_a_secret_that_is_no_api_key(raw: bytes) -> None:
    with pytest.raises(Unresolvable, match=r"^Secret ns/keys key 'k' is not printable ASCII"):
        header_value(raw, "Secret ns/keys key 'k'")
    assert header_value(b"  sk-good\n", "here") == "sk-good"
