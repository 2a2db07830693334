"""JSON on the hot paths (watch events, status reads and writes, the work queue, admission reviews)
through orjson, several times faster than ``json`` there (issue 38's profile: ``json`` was a fifth
of the operator's CPU), with ``json``'s results exactly.

orjson differs from ``json`` in a few corners, each sent to ``json`` here: it reads an integer past
64 bits as a float (``json`` keeps the int: a digest over it must not change), refuses nesting past
1024 levels, ``NaN`` and ``1e400``; it writes datetimes, dataclasses and subclasses of the builtin
types its own way (passed through, so ``json``'s rules or its caller's conversion apply).
"""

from __future__ import annotations

import gc
import json
import re
from typing import Any

import orjson

# A number token of 19 digits or more may be an integer orjson reads as a float (the API server
# itself writes a float64 below 1e21 that way: 18446744073709552000), so ``json`` reads a document
# holding one. Found by mapping every digit to 0 and looking for 19 zeros (a quarter of orjson's own
# time, where a regular expression took ten times it), then looking at what precedes the run: a
# number's first digit follows ``:``, ``[``, ``,``, whitespace or a minus sign itself so placed; a
# run inside a string (a hex trace ID holds one now and then) follows a letter, a quote or a
# ``-`` after a digit. A string holding ``": "`` before 19 digits goes to ``json`` too: slower, the same.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19
_NOT_A_DIGIT = re.compile(rb"[^0]")
_MINUS = ord("-")
_BEFORE_A_NUMBER = frozenset(b":[, \t\n\r")
_AS_JSON_WOULD = (
    orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def _may_hold_a_long_integer(raw: bytes) -> bool:
    zeros = raw.translate(_DIGITS_AS_ZERO)
    at = zeros.find(_LONG_NUMBER)
    while at >= 0:  # ``at`` starts a run of digits: a run found from a non-digit starts there
        start = at - 1 if at > 0 and raw[at - 1] == _MINUS else at
        if start == 0 or raw[start - 1] in _BEFORE_A_NUMBER:
            return True
        after = _NOT_A_DIGIT.search(zeros, at + len(_LONG_NUMBER))
        if after is None:
            return False
        at = zeros.find(_LONG_NUMBER, after.start())
    return False


# A document this large (a list page of runs, not a watch event) is read with the cyclic garbage
# collector paused: what a parse makes is a tree, nothing in it to collect, and the collector's
# passes over the objects it makes (and over the heap they join) cost twice the parse itself (a 3 MB
# page of 500 runs with a heap kept: 47 ms, 15 ms paused; ``json``: 134 and 23 ms).
QUIET_COLLECTOR_FROM = 1 << 16


def loads(data: bytes | bytearray | str) -> Any:
    """``json.loads(data)``, faster."""
    try:
        raw = data.encode() if isinstance(data, str) else bytes(data)
    except UnicodeEncodeError:  # a lone surrogate: json's own way (and its own error)
        return json.loads(data)
    if len(raw) < QUIET_COLLECTOR_FROM or not gc.isenabled():
        return _loads(data, raw)
    gc.disable()
    try:
        return _loads(data, raw)
    finally:
        gc.enable()


def _loads(data: bytes | bytearray | str, raw: bytes) -> Any:
    if not _may_hold_a_long_integer(raw):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # deep nesting, NaN, 1e400: json reads them, or raises its own error
    return json.loads(data)


def dumps(value: Any) -> bytes | None:
    """Compact JSON of a plain value (dicts with str keys, lists, str, int, float, bool, None), or
    None when orjson cannot write it as ``json`` would (an integer past 64 bits, a datetime, a
    subclass, a non-str key): the caller falls back to its ``json`` way."""
    try:
        return orjson.dumps(value, option=_AS_JSON_WOULD)
    except TypeError:
        return None


def packed(value: Any) -> bytes:
    """Compact JSON bytes of ``value`` to keep (``json``'s when orjson cannot write it as ``json``
    would), right-sized: orjson hands back its whole output buffer, about twice the JSON's size
    (measured), and a part keeping a copy per run keeps thousands (issue 38)."""
    written = dumps(value)
    if written is None:
        return json.dumps(value, separators=(",", ":")).encode()
    return bytes(memoryview(written))
