"""An MCP tool result's content as the model is given it: every kind usable, every kind bounded.

A ``CallToolResult`` carries ``structuredContent`` (validated against the tool's output schema
by the shell before it gets here) and ``content`` parts of five kinds. What the model is given:

* ``structuredContent`` when the server sent it (the text parts then repeat it, per the spec);
* else the text parts joined by newlines when there are only text parts;
* else the parts, each in a bounded form:

  - ``text``: as it came;
  - ``image`` and ``audio`` (base64 ``data``): described by type, MIME type and size. Pasted into
    a text model's context they are kilobytes of base64 the model cannot read, crowding out the
    rest of the result (the result is cut at 16 KiB). Images keep their data while the result
    stays within :data:`WITH_IMAGES_MAX_BYTES`: a model whose endpoint says it accepts images is
    given them as images (:func:`images_taken`, at each request), any other only the description;
  - ``resource_link``: its name, URI, MIME type, title, description and size: named, never fetched
    (a read tool of the run may fetch it, if the run has one);
  - ``resource`` (embedded): a text resource's URI, MIME type and text (the wire's shape); a
    binary one (``blob``) described like an image, with its URI.

Annotations and ``_meta`` of a part are dropped (they address the client, not the model); an
unknown kind is kept as it came (the whole result is cut at 16 KiB anyway, the cut told to the
model). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from durable_agents.core.digest import canonical_json

NOT_SHOWN: Final = "binary content, not shown to the model: described by its type and size"
NOT_FETCHED: Final = "a link to a resource: not fetched"
SCHEMA_MISMATCH: Final = "the tool's result does not match the output schema it declared"
IMAGE_FOLLOWS: Final = "an image: given to the model in the message that follows the results"
IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The image types both model protocols take (others stay described)."""
WITH_IMAGES_MAX_BYTES: Final = 12 * 1024
"""A result with its images' data, at most: under the 16 KiB a recorded result keeps, so a result
is never cut inside an image; images past it stay described."""
_WALK_DEPTH: Final = 64
_LINK_FIELDS: Final = ("name", "title", "uri", "mimeType", "description", "size")
_FIELD_MAX_CHARS: Final = 1024


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


def _field(value: Any) -> Any:
    return value[:_FIELD_MAX_CHARS] if isinstance(value, str) else value


def _link(part: Mapping[str, Any]) -> dict[str, Any]:
    kept = {name: _field(part[name]) for name in _LINK_FIELDS if name in part}
    return {"type": "resource_link", **kept, "note": NOT_FETCHED}


def _embedded(resource: Mapping[str, Any]) -> dict[str, Any]:
    uri = resource.get("uri")
    if "blob" in resource:
        described = _described(resource, resource["blob"], uri=uri if isinstance(uri, str) else None)
        return {**described, "type": "resource"}
    kept: dict[str, Any] = {"uri": _field(uri)}
    if isinstance(resource.get("mimeType"), str):
        kept["mimeType"] = resource["mimeType"][:128]
    kept["text"] = resource.get("text")
    return {"type": "resource", "resource": kept}


def described_part(part: Any) -> Any:
    """One content part as the model is given it (unknown shapes unchanged)."""
    if not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": part.get("text")}
    if kind in ("image", "audio") and "data" in part:
        return _described(part, part["data"])
    if kind == "resource_link":
        return _link(part)
    resource = part.get("resource")
    if kind == "resource" and isinstance(resource, Mapping):
        return _embedded(resource)
    return dict(part)


def described_parts(parts: list[Any]) -> list[Any]:
    return [described_part(part) for part in parts]


def _with_image_data(described: list[Any], parts: list[Any]) -> list[Any]:
    """``described`` with the base64 ``data`` of its images kept, in order, while the whole stays
    within :data:`WITH_IMAGES_MAX_BYTES` (so a result is never cut inside an image's data)."""
    out = list(described)
    for n, part in enumerate(parts):
        kept = out[n]
        if not (isinstance(kept, dict) and kept.get("type") == "image" and isinstance(part, Mapping)):
            continue
        candidate = [*out[:n], {**kept, "data": part.get("data")}, *out[n + 1 :]]
        if len(canonical_json(candidate)) <= WITH_IMAGES_MAX_BYTES:
            out = candidate
    return out


def model_content(parts: list[Any], structured: Any = None) -> Any:
    """What the model is given of a result (see the module docstring): ``parts`` as JSON objects
    (the wire's field names), ``structured`` the ``structuredContent`` (None: not sent). Small
    images keep their data, for a model that accepts images (:func:`images_taken`)."""
    if structured is not None:
        return structured
    if all(isinstance(part, Mapping) and part.get("type") == "text" for part in parts):
        return "\n".join(str(part.get("text", "")) for part in parts)
    return _with_image_data(described_parts(parts), parts)


def images_taken(value: Any, *, passed: bool) -> tuple[Any, list[dict[str, str]]]:
    """``value`` (a recorded result) without the data of its images, and the images taken out
    (``mimeType``, base64 ``data``) when ``passed`` (the model accepts images): their note then
    says they follow. For a text model the images stay described, their data dropped."""
    images: list[dict[str, str]] = []

    def walk(node: Any, depth: int) -> Any:
        if depth > _WALK_DEPTH:
            return node
        if isinstance(node, list):
            return [walk(item, depth + 1) for item in node]
        if not isinstance(node, dict):
            return node
        if node.get("type") == "image" and isinstance(node.get("data"), str):
            kept = {key: item for key, item in node.items() if key != "data"}
            mime = node.get("mimeType")
            if passed and isinstance(mime, str) and mime in IMAGE_TYPES:
                images.append({"mimeType": mime, "data": node["data"]})
                kept["note"] = IMAGE_FOLLOWS
            return kept
        return {key: walk(item, depth + 1) for key, item in node.items()}

    return walk(value, 0), images


def schema_mismatch(tool: str, problem: str) -> str:
    """The tool error the model is told when a result does not match the tool's output schema."""
    return f"{SCHEMA_MISMATCH} ({tool}): {problem[:512]}"
