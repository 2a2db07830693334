from __future__ import annotations

from datetime import timedelta

import pytest

from durable_agents.core.durations import InvalidDuration, parse_duration


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
