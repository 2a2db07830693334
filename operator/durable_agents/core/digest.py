"""Content digests: SHA-256 over RFC 8785 canonical JSON, so equal content has one digest."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

import orjson
import rfc8785

# The metadata that belongs to what an object says (the rest is server bookkeeping).
_CONTENT_METADATA = ("labels", "annotations")

# RFC 8785 (I-JSON) integers: what an IEEE 754 double holds exactly; rfc8785 refuses the rest.
_INT_MAX = 2**53 - 1
_INT_MIN = -(2**53) + 1

# orjson, keys sorted, writes what RFC 8785 writes for the values :func:`_json_exact` admits: no
# whitespace, strings in UTF-8 escaped as ECMAScript does (only '"', '\\' and control characters,
# the same short forms, lowercase \u00XX), keys in code point order, which is RFC 8785's UTF-16
# order when no character lies beyond the BMP (a 4-byte UTF-8 sequence, which starts F0-F4).
# tests/unit/test_canonical_json.py holds it to ``rfc8785`` on generated values.
_SORTED = orjson.OPT_SORT_KEYS
_BEYOND_BMP = re.compile(rb"[\xf0-\xff]")


def _json_exact(value: Any) -> bool:
    """True if ``value`` holds only dicts with str keys, lists, str, bool, None and I-JSON
    integers (exact types): the values whose ``json`` encoding is the RFC 8785 one. Floats are
    left out (RFC 8785 writes them as ECMAScript does, not as Python's ``repr``)."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (type(item) is not str and not _json_exact(item)):
                return False
        return True
    if kind is list:
        for item in value:  # noqa: SIM110 (a loop: all() over a generator is slower on this hot path)
            if type(item) is not str and not _json_exact(item):
                return False
        return True
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(_INT_MIN <= value <= _INT_MAX)
    return False


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical JSON: one byte string for equal content.

    The pure-Python ``rfc8785`` writer was a measurable share of the operator's CPU (every
    checkpoint is stamped and verified over it), so plain values go through orjson (ten times the
    standard library's C encoder, which was 7 % of the operator in the model row, issue 38); its
    output is taken only where it is byte-for-byte the canonical one. Anything else (floats, other
    types, a lone surrogate, nesting too deep) is written, or refused, by ``rfc8785`` itself.
    """
    try:
        if _json_exact(value):
            raw = orjson.dumps(value, option=_SORTED)
            if raw.isascii() or _BEYOND_BMP.search(raw) is None:
                return raw
    except (RecursionError, TypeError):  # orjson: a lone surrogate, nesting past 254 levels
        pass
    return bytes(rfc8785.dumps(value))


def canonical_digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def object_content_digest(obj: Mapping[str, Any]) -> str:
    """Digest of what a Kubernetes object says: everything but server bookkeeping and status."""
    meta = obj.get("metadata") or {}
    content = {key: value for key, value in obj.items() if key not in ("metadata", "status")}
    content["metadata"] = {key: meta[key] for key in _CONTENT_METADATA if meta.get(key)}
    return canonical_digest(content)
