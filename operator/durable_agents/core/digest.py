"""Content digests: SHA-256 over RFC 8785 canonical JSON, so equal content has one digest."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import rfc8785

# The metadata that belongs to what an object says (the rest is server bookkeeping).
_CONTENT_METADATA = ("labels", "annotations")


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical JSON: one byte string for equal content."""
    return bytes(rfc8785.dumps(value))


def canonical_digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def object_content_digest(obj: Mapping[str, Any]) -> str:
    """Digest of what a Kubernetes object says: everything but server bookkeeping and status."""
    meta = obj.get("metadata") or {}
    content = {key: value for key, value in obj.items() if key not in ("metadata", "status")}
    content["metadata"] = {key: meta[key] for key in _CONTENT_METADATA if meta.get(key)}
    return canonical_digest(content)
