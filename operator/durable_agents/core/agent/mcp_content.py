"""An MCP tool's content parts as a text model is given them: binary parts described, not pasted.

A tool result may carry images and audio (base64 ``data``) and embedded resources whose contents
are a base64 ``blob``. Pasted into a text model's context they are kilobytes of base64 that the
model cannot read and that crowd out the rest of the result (the result is cut at 16 KiB). Each is
replaced by a short description: its type, MIME type, size in bytes and, for a resource, its URI.
Text, resource links (a name and a URI: never fetched here) and embedded text resources are kept
as they came. Passing images and audio to models that accept them is a later step. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

NOT_SHOWN: Final = "binary content, not shown to the model: described by its type and size"


def _decoded_size(data: Any) -> int | None:
    """Bytes a base64 string decodes to (None when it is no string)."""
    if not isinstance(data, str):
        return None
    text = data.strip()
    return max(0, len(text) * 3 // 4 - text[-2:].count("="))


def _described(part: Mapping[str, Any], data: Any, **extra: Any) -> dict[str, Any]:
    out = {"type": part.get("type"), **extra, "bytes": _decoded_size(data), "note": NOT_SHOWN}
    mime = part.get("mimeType")
    if isinstance(mime, str):
        out["mimeType"] = mime[:128]
    return out


def described_part(part: Any) -> Any:
    """One content part as the model is given it (unknown shapes unchanged)."""
    if not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if kind in ("image", "audio") and "data" in part:
        return _described(part, part["data"])
    resource = part.get("resource")
    if kind == "resource" and isinstance(resource, Mapping) and "blob" in resource:
        uri = resource.get("uri")
        described = _described(resource, resource["blob"], uri=uri if isinstance(uri, str) else None)
        return {**described, "type": "resource"}
    return dict(part)


def described_parts(parts: list[Any]) -> list[Any]:
    return [described_part(part) for part in parts]
