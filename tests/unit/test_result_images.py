"""The images of an MCP tool result, as each model is given them (issue 36, item 5): a model whose
endpoint accepts images gets a result's small images as images (a user message after the results;
for the Messages API, image blocks after the tool_result blocks); any other model only their
description, never their base64; an image too large to keep stays described for every model."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from tests.unit.test_agent_context import KEY, MODEL, OBJECTIVE, PROMPT, TOOLS, _facts

from durable_agents.core.agent.context import build_request
from durable_agents.core.agent.mcp_content import IMAGE_FOLLOWS, NOT_SHOWN, model_content
from durable_agents.core.agent.messages_api import messages_body
from durable_agents_testkit.modelserver import _conversation_problem

pytestmark = pytest.mark.unit

SMALL = base64.b64encode(b"\x89PNG" + b"\1" * 300).decode()
LARGE = base64.b64encode(b"\x89PNG" + b"\1" * 40_000).decode()
PARTS: list[Any] = [
    {"type": "text", "text": "the chart:"},
    {"type": "image", "data": SMALL, "mimeType": "image/png"},
    {"type": "image", "data": LARGE, "mimeType": "image/png"},
]


def request(accepts_images: bool) -> Any:
    result = {"isError": False, "content": model_content(PARTS)}
    facts = _facts([("read_configmap", {"name": "c"}, "look", "succeeded", result)])
    return build_request(
        model=MODEL,
        system_prompt=PROMPT,
        objective=OBJECTIVE,
        tools=TOOLS,
        facts=facts,
        data_key=KEY,
        accepts_images=accepts_images,
    )


def test_a_text_model_is_given_the_description_and_no_base64() -> None:
    messages = request(False).messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    told = json.loads(messages[3]["content"])["content"]
    assert told[1] == {"type": "image", "mimeType": "image/png", "bytes": 304, "note": NOT_SHOWN}
    assert told[2]["bytes"] == 40_004
    assert told[2]["note"] == NOT_SHOWN
    assert SMALL not in json.dumps(messages)


def test_a_model_that_accepts_images_is_given_the_small_one_as_an_image() -> None:
    body = request(True).body()
    messages = body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    told = json.loads(messages[3]["content"])["content"]
    assert told[1]["note"] == IMAGE_FOLLOWS
    assert "data" not in told[1], "the image is not pasted into the text"
    assert told[2]["note"] == NOT_SHOWN, "too large to keep: described"
    text, image = messages[4]["content"]
    assert text["text"] == "The images of the result of call call_0 (read_configmap):"
    assert image == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{SMALL}"}}
    assert LARGE not in json.dumps(body)
    assert _conversation_problem(messages) is None, "the reference model server takes the order"


def test_the_messages_api_gets_image_blocks_after_the_tool_result() -> None:
    body = messages_body(request(True))
    last = body["messages"][-1]
    assert last["role"] == "user"
    kinds = [block["type"] for block in last["content"]]
    assert kinds == ["tool_result", "text", "image"]
    assert last["content"][2]["source"] == {"type": "base64", "media_type": "image/png", "data": SMALL}
    text_only = messages_body(request(False))
    assert SMALL not in json.dumps(text_only)
