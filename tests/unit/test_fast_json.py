"""The hot paths' JSON (orjson) reads and writes exactly what ``json`` does, or hands over to it."""

from __future__ import annotations

import gc
import json
import math
import sys
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_agents.shell.ground import fast_json

pytestmark = pytest.mark.unit

VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


def typed(value: Any) -> Any:
    """The value with every leaf's type beside it: 1 and 1.0 (equal in Python) tell apart."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


@given(VALUES)
def test_reads_what_json_reads_with_the_same_types(value: Any) -> None:
    text = json.dumps(value)
    assert typed(fast_json.loads(text)) == typed(json.loads(text))
    assert typed(fast_json.loads(text.encode())) == typed(json.loads(text))


@given(VALUES)
def test_writes_what_json_reads_back_the_same_or_hands_over(value: Any) -> None:
    written = fast_json.dumps(value)
    if written is None:  # only an integer past 64 bits is handed over here
        assert any(abs(n) >= 2**63 for n in _ints(value)), f"handed over without cause: {value!r}"
        return
    assert typed(json.loads(written)) == typed(value)


def _ints(value: Any) -> list[int]:
    if isinstance(value, dict):
        return [n for v in value.values() for n in _ints(v)]
    if isinstance(value, list):
        return [n for v in value for n in _ints(v)]
    return [value] if type(value) is int else []


@pytest.mark.parametrize(
    "text",
    [
        '{"replicas": 111111111111111111111111111111}',  # orjson alone: 1.1e29, a float
        '{"n": -9223372036854775809}',
        '{"n": 18446744073709551616}',
        '{"x": 1e400}',
        '{"x": NaN}',
    ],
)
def test_the_corners_orjson_reads_otherwise_are_read_as_json_reads_them(text: str) -> None:
    expected = json.loads(text)
    got = fast_json.loads(text)
    assert repr(typed(got)) == repr(typed(expected))


def test_nesting_deeper_than_orjson_reads_raises_as_json_does() -> None:
    deep = "[" * 1500 + "]" * 1500  # the webhook reads it again with a higher recursion limit
    with pytest.raises(RecursionError):
        json.loads(deep)
    with pytest.raises(RecursionError):
        fast_json.loads(deep)


def test_an_invalid_document_raises_json_s_own_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        fast_json.loads('{"a": ')


class Colour(StrEnum):
    RED = "red"


@pytest.mark.parametrize(
    "value",
    [{"at": datetime(2026, 12, 4, tzinfo=UTC)}, {"n": 2**70}, {1: "a"}],
    ids=["datetime", "big-int", "int-key"],
)
def test_what_json_would_write_its_own_way_is_handed_back(value: Any) -> None:
    assert fast_json.dumps(value) is None


def test_an_enum_is_written_as_json_writes_it() -> None:
    assert fast_json.dumps({"c": Colour.RED}) == json.dumps({"c": Colour.RED}, separators=(",", ":")).encode()


def test_a_float_is_written_so_it_reads_back_exactly() -> None:
    for x in (0.1, 1e-300, 1.7976931348623157e308, -0.0, 2.0**53 + 1):
        written = fast_json.dumps({"x": x})
        assert written is not None
        back = json.loads(written)["x"]
        assert back == x
        assert math.copysign(1, back) == math.copysign(1, x)


def test_a_float_the_api_server_writes_as_digits_is_read_as_json_reads_it() -> None:
    """The API server writes a float64 below 1e21 without an exponent (integration test
    test_api_server_numbers): json reads that literal as an int, orjson alone as a float."""
    text = '{"u64": 18446744073709552000, "negative": -9223372036854776000}'
    assert repr(typed(fast_json.loads(text))) == repr(typed(json.loads(text)))
    assert type(fast_json.loads(text)["u64"]) is int


def test_a_lone_surrogate_is_read_as_json_reads_it() -> None:
    text = '{"a": "\\ud800"}'
    assert fast_json.loads(text) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"trace": "00-44855ce2f55f79632714308027730061-12950b0b0383bbea-01"}',
        '{"id": "a12345678901234567890", "hex": "f55f7963271430802773006"}',
        '{"digits": "12345678901234567890", "x": 1.12345678901234567890123}',
        '{"at": "2026-12-04T22:05:46.240514123456789012Z"}',
    ],
)
def test_a_long_run_of_digits_inside_a_string_or_a_fraction_is_read_by_orjson(text: str) -> None:
    """A hex trace ID with 19 digits in a row sent a whole list page to ``json`` (a cold start's
    profile: 6 % of it); only a number token of 19 digits is, now."""
    assert not fast_json._may_hold_a_long_integer(text.encode())
    assert typed(fast_json.loads(text)) == typed(json.loads(text))


@pytest.mark.parametrize(
    "text",
    [
        "12345678901234567890",
        "-12345678901234567890",
        '{"n":12345678901234567890}',
        '{"n": -12345678901234567890}',
        "[1,12345678901234567890]",
        '{"trace": "00-44855ce2f55f79632714308027730061", "n":\n\t12345678901234567890}',
        '{"s": "a: 12345678901234567890"}',  # inside a string, but placed as a number: json reads it
    ],
)
def test_a_number_token_of_19_digits_goes_to_json(text: str) -> None:
    assert fast_json._may_hold_a_long_integer(text.encode())
    assert repr(typed(fast_json.loads(text))) == repr(typed(json.loads(text)))


@given(
    st.lists(
        st.one_of(
            st.integers(min_value=-(10**25), max_value=10**25),
            st.text(alphabet="0123456789abcdef-:, ", max_size=40),
            st.floats(allow_nan=False, allow_infinity=False),
        ),
        max_size=6,
    )
)
def test_digit_runs_in_strings_and_numbers_read_as_json_reads_them(values: list[Any]) -> None:
    for text in (json.dumps(values), json.dumps(values, indent=1), json.dumps({"v": values})):
        assert repr(typed(fast_json.loads(text))) == repr(typed(json.loads(text)))


def test_a_list_page_is_read_without_the_collector_s_passes_and_the_collector_is_back_after() -> None:
    page = json.dumps([{"run": [i, {"state": "waiting_input"}]} for i in range(50_000)]).encode()
    assert len(page) >= fast_json.QUIET_COLLECTOR_FROM
    expected = json.loads(page)
    passes: list[str] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        passes.append(phase)

    gc.callbacks.append(seen)
    try:
        json.loads(page)
        unpaused = len(passes)
        passes.clear()
        got = fast_json.loads(page)
        paused = len(passes)
        with pytest.raises(json.JSONDecodeError):
            fast_json.loads(page[:-1])
    finally:
        gc.callbacks.remove(seen)
    assert unpaused > 0, "the collector runs during a parse this large when not paused"
    assert paused == 0
    assert got == expected
    assert gc.isenabled()


@given(VALUES)
def test_a_packed_copy_is_json_s_value_in_bytes_of_its_own_size(value: Any) -> None:
    kept = fast_json.packed({"v": value})
    assert typed(json.loads(kept)) == typed({"v": value})
    assert sys.getsizeof(kept) == sys.getsizeof(b"") + len(kept)  # not orjson's whole buffer
