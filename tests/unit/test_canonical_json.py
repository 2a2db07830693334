"""canonical_json (core/digest.py) writes exactly what ``rfc8785`` writes, or refuses what it refuses.

Every checkpoint is stamped and verified over these bytes and every digest the runs record is taken
over them, so one byte of difference from the last release would fail the stamps of stored runs.
The fast path (orjson, keys sorted) is taken only where it is the canonical form; these tests hold
it to the ``rfc8785`` package on generated values: every string the JSON model allows (control
characters, quotes, characters beyond the BMP, whose UTF-16 key order differs from code point
order), the integers RFC 8785 admits and those it refuses, floats, deep nesting.
"""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_agents.core.digest import canonical_json

pytestmark = pytest.mark.unit

# Text the JSON model can hold: any code point but a lone surrogate (tested apart below).
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
# Keys that force the order questions: ASCII, Latin, the BMP's private area, beyond the BMP.
_keys = _text | st.sampled_from(["a", "B", "é", "\ue000", "\uffff", "\U0001f600", "\U00010000", ""])
_ints = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
_scalars = st.none() | st.booleans() | _ints | _text
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=30,
)


def _reference(value: Any) -> bytes | type[BaseException]:
    try:
        return bytes(rfc8785.dumps(value))
    except Exception as err:
        return type(err)


def _ours(value: Any) -> bytes | type[BaseException]:
    try:
        return canonical_json(value)
    except Exception as err:
        return type(err)


@settings(max_examples=3000, deadline=None)
@given(_values)
def test_plain_values_are_written_as_rfc8785_writes_them(value: Any) -> None:
    assert _ours(value) == _reference(value)


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers()).flatmap(
        lambda number: st.just({"n": number, "list": [number, "x"]})
    )
)
def test_numbers_rfc8785_writes_its_own_way_or_refuses_are_left_to_it(value: Any) -> None:
    """Floats (ECMAScript's shortest form, not Python's repr) and integers past 2**53 (refused)."""
    assert _ours(value) == _reference(value)


@pytest.mark.parametrize(
    "value",
    [
        {"\U0001f600": 1, "\uffff": 2},  # UTF-16 order puts the emoji (a surrogate pair) first
        {"k": "\ud800"},  # a lone surrogate: refused by both
        ['\x00\x1f\x7f\u2028"\\/\b\f\n\r\t'],
        {"b": {"d": [1, True, None], "c": ""}, "a": -(2**53) + 1},
    ],
)
def test_the_corners(value: Any) -> None:
    assert _ours(value) == _reference(value)


def test_nesting_past_orjsons_limit_is_still_canonical() -> None:
    deep: Any = "leaf"
    for _ in range(300):
        deep = [deep]
    assert canonical_json(deep) == bytes(rfc8785.dumps(deep))
