"""The classification of what a model endpoint answered (shell/agent/model_replies.py): a chat
completion, or a ModelCallFailed naming the endpoint and the kind of reply; never another
exception (issue 30, item 6), never the key, never more than a bounded excerpt."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_agents.core.agent_facts import sealed_answer
from durable_agents.core.sealed_values import new_data_key
from durable_agents.shell.agent.model_replies import (
    EXCERPT_MAX,
    MESSAGE_MAX,
    REDACTED,
    ModelCallFailed,
    reply_kind,
    reply_of,
    sanitized,
    shown_endpoint,
)

pytestmark = pytest.mark.unit

URL = "http://models.example:8000/v1"
KEY = "sk-live-0123456789abcdefghij"
JSON = {"content-type": "application/json"}


def completion(message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return {"model": "m", "choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 2}, **extra}


def failure(body: bytes, headers: dict[str, str] | None = None, status: int = 200) -> ModelCallFailed:
    with pytest.raises(ModelCallFailed) as failed:
        reply_of(URL, status, headers if headers is not None else JSON, body, KEY)
    assert failed.value.retryable is True
    assert KEY not in failed.value.message
    assert failed.value.message.startswith(f"{URL} answered HTTP {status} with ")
    return failed.value


def test_a_chat_completion_is_the_cores_reply() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"a": 1}'}}
    body = completion({"role": "assistant", "content": "why", "tool_calls": [call]})
    reply = reply_of(URL, 200, JSON, json.dumps(body).encode(), KEY)
    assert (reply.content, reply.finish_reason, reply.model) == ("why", "stop", "m")
    assert [(c.id, c.name, c.arguments_text) for c in reply.tool_calls] == [("call_1", "read", '{"a": 1}')]
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (3, 2)


def test_arguments_sent_as_an_object_and_content_as_parts_are_read() -> None:
    call = {"id": "c", "function": {"name": "read", "arguments": {"a": 1}}}
    parts = [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}, {"type": "image_url"}]
    reply = reply_of(
        URL, 200, JSON, json.dumps(completion({"content": parts, "tool_calls": [call]})).encode(), KEY
    )
    assert reply.content == "one two"
    assert json.loads(reply.tool_calls[0].arguments_text) == {"a": 1}


def test_lone_surrogates_are_replaced_so_sealing_never_meets_them() -> None:
    """JSON lets a reply write a lone surrogate; sealing the answer or the model's reason would
    raise deep in the core (the operator's internal error). They are replaced where they enter."""
    call = {"id": "c", "function": {"name": "read\ud800", "arguments": '{"a": "\ud800"}'}}
    body = b'{"choices": [{"message": {"content": "a\\ud800b", "tool_calls": [CALL]}}]}'
    reply = reply_of(URL, 200, JSON, body.replace(b"CALL", json.dumps(call).encode()), KEY)
    assert reply.content == "a?b"
    assert reply.tool_calls[0].name == "read?"
    for text in (reply.content, reply.tool_calls[0].name, reply.tool_calls[0].arguments_text):
        text.encode("utf-8")  # would raise on a surrogate
    sealed_answer(new_data_key(entropy=os.urandom), reply.content, entropy=os.urandom)


def test_an_html_page_is_named_by_its_title() -> None:
    page = b"<!doctype html><html><head><title>502 Bad\nGateway</title></head><body>" + b"x" * 5000
    failed = failure(page, {"content-type": "text/html; charset=utf-8"})
    assert failed.reason == "ModelReplyNotJson"
    assert (
        failed.message
        == f'{URL} answered HTTP 200 with an HTML page (text/html): "502 Bad Gateway", not a chat completion'
    )


def test_a_json_content_type_with_another_body_says_so_with_a_bounded_excerpt() -> None:
    failed = failure(b"oops " * 1000)
    assert failed.reason == "ModelReplyNotJson"
    assert "a body that is not JSON although its content type is application/json" in failed.message
    excerpt = failed.message.split('"')[1]
    assert len(excerpt) == EXCERPT_MAX
    assert excerpt.endswith("…")


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ([], "the reply is list, not dict"),
        ({"choices": []}, "it has no choices"),
        ({"choices": "x"}, "choices is str, not list"),
        ({"choices": [{"message": None}]}, "choices[0].message is NoneType, not dict"),
        (completion({"content": 7}), "choices[0].message.content is int, not str or list"),
        (completion({"tool_calls": {"a": 1}}), "choices[0].message.tool_calls is dict, not list"),
        (
            completion({"tool_calls": [{"function": {"name": 3}}]}),
            "tool_calls[0].function.name is int, not str",
        ),
        (
            completion({"content": "a"}, usage={"prompt_tokens": -1}),
            "usage.prompt_tokens is not a token count",
        ),
        (
            completion({"content": "a"}, usage={"prompt_tokens": 2**32}),
            "usage.prompt_tokens is not a token count",
        ),
        (
            completion({"content": "a"}, usage={"completion_tokens": True}),
            "usage.completion_tokens is bool, not int",
        ),
        (
            completion({"content": "a"}, usage={"completion_tokens": "5"}),
            "usage.completion_tokens is str, not int",
        ),
        (completion({"content": "a"}, model=["m"]), "model is list, not str"),
    ],
)
def test_json_without_the_chat_completions_shape_says_what_is_wrong(body: Any, problem: str) -> None:
    failed = failure(json.dumps(body).encode())
    assert failed.reason == "ModelReplyInvalid"
    assert "that is not a chat completion: " in failed.message
    assert failed.message.endswith(problem), failed.message


@pytest.mark.parametrize("content", [None, "", "  \n "])
def test_no_content_and_no_tool_calls_is_an_empty_reply_not_a_final_answer(content: str | None) -> None:
    failed = failure(json.dumps(completion({"role": "assistant", "content": content})).encode())
    assert failed.reason == "ModelReplyEmpty"
    assert failed.message.endswith("a chat completion with no content and no tool calls (finish reason stop)")


def test_an_error_body_quotes_its_message_without_the_key_or_credentials() -> None:
    error = {
        "error": {"message": f"Incorrect API key provided: {KEY}. Authorization: Bearer abc.def token=xyz"}
    }
    kind = reply_kind(JSON, json.dumps(error).encode(), KEY)
    for secret in (KEY, "abc.def", "xyz"):
        assert secret not in kind
    assert (
        kind == "a JSON error (application/json): "
        f'"Incorrect API key provided: {REDACTED}. Authorization: {REDACTED} {REDACTED}"'
    )
    assert reply_kind({}, b"", KEY) == "an empty body (no content type)"


def test_sanitized_is_printable_one_line_and_bounded() -> None:
    assert sanitized("a\x00b\x1b[31m\r\nc\u202e", None) == "a b [31m c"
    assert sanitized("masked sk-ab***yz here", None) == f"masked {REDACTED} here"
    assert len(sanitized("y" * 10_000, None)) == EXCERPT_MAX


def test_the_endpoint_is_shown_without_userinfo_or_query() -> None:
    assert shown_endpoint("https://user:pw@h.example:8443/v1?api_key=s3cret") == "https://h.example:8443/v1"
    assert shown_endpoint("http://[::1]:9/v1") == "http://[::1]:9/v1"
    assert shown_endpoint("http://h:99999/v1") == "(an endpoint URL that does not parse)"


@settings(max_examples=300, deadline=None)
@given(
    body=st.one_of(
        st.binary(max_size=512),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
            ),
            max_leaves=20,
        ).map(lambda v: json.dumps(v).encode()),
        st.builds(
            lambda message: json.dumps(completion(message)).encode(),
            st.dictionaries(
                st.sampled_from(["content", "tool_calls", "role"]),
                st.none()
                | st.text(max_size=8)
                | st.lists(st.dictionaries(st.text(max_size=8), st.text(max_size=8))),
            ),
        ),
    ),
    ctype=st.sampled_from(["application/json", "text/html", "text/plain", ""]),
)
def test_whatever_the_endpoint_sends_only_a_reply_or_a_model_error_comes_back(
    body: bytes, ctype: str
) -> None:
    failed: ModelCallFailed | None = None
    try:
        reply_of(URL, 200, {"content-type": ctype}, body, KEY)
    except ModelCallFailed as err:  # anything else escapes: the test fails
        failed = err
    if failed is not None:
        assert failed.retryable
        assert len(failed.message) <= MESSAGE_MAX
        assert failed.message.startswith(f"{URL} answered HTTP 200 with ")
