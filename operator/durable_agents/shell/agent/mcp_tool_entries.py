"""A tool as the operator sees it (:class:`McpTool`), apart from the client (:mod:`.mcp_tools`,
which re-exports it) so the listing's shape has a module of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp_types import Tool

__all__ = ["McpTool"]


@dataclass(frozen=True)
class McpTool:
    """A tool as the operator sees it. ``server`` is the name the run gives the MCP server.

    ``read_only`` is ``annotations.readOnlyHint``; absent means ``False``: an unannotated tool is
    treated as consequential. ``destructive`` is ``annotations.destructiveHint``; absent means
    ``True`` (the MCP default) for a tool that is not read-only, ``False`` for a read-only one (the
    hint only means something when ``readOnlyHint`` is false). Annotations are hints a server
    states about itself, not guarantees.
    """

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    destructive: bool

    @classmethod
    def from_sdk(cls, server: str, tool: Tool) -> McpTool:
        annotations = tool.annotations
        read_only = annotations is not None and annotations.read_only_hint is True
        hint = annotations.destructive_hint if annotations is not None else None
        return cls(
            server=server,
            name=tool.name,
            description=tool.description or "",
            input_schema=dict(tool.input_schema),
            read_only=read_only,
            destructive=hint if hint is not None else not read_only,
        )
