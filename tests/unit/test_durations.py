from __future__ import annotations

from datetime import timedelta

import pytest

from durable_agents.core.durations import MAX_DURATION, InvalidDuration, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("250ms", timedelta(milliseconds=250)),
        ("1.5h", timedelta(minutes=90)),
    ],
)
def test_parse(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "10", "1d", "h", "1h 30m", "-5s", "5s!"])
def test_reject(text: str) -> None:
    with pytest.raises(InvalidDuration, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    "text", ["99999999999999999999h", "9" * 400 + "s", "8761h", "8760h1s", "1" * 60 + "h"]
)
def test_too_long_is_a_value_error_not_an_overflow(text: str) -> None:
    with pytest.raises(InvalidDuration, match=r"maximum|longer than") as caught:
        parse_duration(text)
    assert isinstance(caught.value, ValueError)
    assert len(str(caught.value)) < 200  # the message names the text, shortened


def test_the_maximum_itself_parses() -> None:
    assert parse_duration("8760h") == MAX_DURATION
