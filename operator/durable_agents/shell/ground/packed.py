"""A JSON object kept as one compact value, for the copies of runs a part keeps while they wait.

A decoded object is a tree of small dicts, lists and strings: a slim copy of a parked run kept
that way costs several times its bytes, and 100,000 of them fragment the heap (issue 38). Packed,
a copy costs its bytes and is decoded only when it is looked at, which for a parked run is once
per change. Its resourceVersion, which a part compares on every event, is kept beside it.
"""

from __future__ import annotations

from typing import Any

from durable_agents.shell.ground import fast_json


class Packed:
    __slots__ = ("packed", "version")

    def __init__(self, body: dict[str, Any]) -> None:
        self.version: str | None = (body.get("metadata") or {}).get("resourceVersion")
        self.packed = fast_json.packed(body)

    def body(self) -> dict[str, Any]:
        """The object, decoded anew (the caller may keep or change it: the packed copy stays)."""
        decoded: dict[str, Any] = fast_json.loads(self.packed)
        return decoded
