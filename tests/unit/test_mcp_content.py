"""An MCP tool's binary content parts reach a text model described, not as base64 (issue 36,
item 5): an image of 300 KiB is a few dozen bytes of description with its type and size."""

from __future__ import annotations

import base64

import pytest
from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from durable_agents.core.agent.mcp_content import NOT_SHOWN
from durable_agents.core.digest import canonical_json
from durable_agents.shell.agent.mcp_tools import _result

pytestmark = pytest.mark.unit

PNG = base64.b64encode(b"\x89PNG" + b"\0" * (300 * 1024 - 4)).decode()


def test_binary_parts_are_described_and_text_and_links_kept() -> None:
    result = CallToolResult(
        content=[
            TextContent(type="text", text="the chart:"),
            ImageContent(type="image", data=PNG, mimeType="image/png"),
            AudioContent(type="audio", data=base64.b64encode(b"RIFF1234").decode(), mimeType="audio/wav"),
            ResourceLink(
                type="resource_link", name="report", uri="file:///r.pdf", mimeType="application/pdf"
            ),
            EmbeddedResource(
                type="resource",
                resource=BlobResourceContents(uri="file:///b.bin", blob=base64.b64encode(b"abc").decode()),
            ),
            EmbeddedResource(
                type="resource", resource=TextResourceContents(uri="file:///t.txt", text="hello")
            ),
        ]
    )
    parts = _result(result).content
    assert parts[0] == {"type": "text", "text": "the chart:"}
    assert parts[1] == {"type": "image", "bytes": 300 * 1024, "note": NOT_SHOWN, "mimeType": "image/png"}
    assert parts[2] == {"type": "audio", "bytes": 8, "note": NOT_SHOWN, "mimeType": "audio/wav"}
    assert parts[3]["uri"] == "file:///r.pdf"  # a link: named, never fetched
    assert parts[4] == {"type": "resource", "uri": "file:///b.bin", "bytes": 3, "note": NOT_SHOWN}
    assert parts[5]["resource"]["text"] == "hello"
    assert len(canonical_json(parts)) < 1024, "no base64 reaches the model"
