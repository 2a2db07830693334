"""The recovery tests' fault points: a trigger fires at its write, and only once."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from durable_agents.shell.ground.faults import FaultPoints, Trigger

pytestmark = pytest.mark.unit


@pytest.fixture
def received() -> Iterator[list[int]]:
    """SIGUSR1 stands in for SIGSTOP/SIGKILL: delivered to this process, recorded, harmless."""
    got: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        got.append(signum)

    previous = signal.signal(signal.SIGUSR1, handler)
    yield got
    signal.signal(signal.SIGUSR1, previous)


def test_fires_before_the_nth_successful_write(received: list[int]) -> None:
    points = FaultPoints([Trigger.parse("before:2", signal.SIGUSR1)])
    points.before()
    assert received == []
    points.after()  # the first write succeeded
    points.before()
    assert received == [signal.SIGUSR1]


def test_a_refused_write_after_the_trigger_does_not_fire_it_again(received: list[int]) -> None:
    # A zombie resumed after SIGCONT: its prepared 2nd write is refused (409, not counted), so its
    # next write is "the 2nd" again. Freezing it a second time would make it unobservable.
    points = FaultPoints([Trigger.parse("before:2", signal.SIGUSR1)])
    points.before()
    points.after()
    points.before()  # fires; the write is then refused: no after()
    points.before()
    points.after()
    assert received == [signal.SIGUSR1]


def test_after_triggers_count_successful_writes_only(received: list[int]) -> None:
    points = FaultPoints([Trigger.parse("after:1", signal.SIGUSR1)])
    points.before()  # refused: no after()
    assert received == []
    points.before()
    points.after()
    assert received == [signal.SIGUSR1]


@pytest.mark.parametrize("text", ["during:1", "before:0", "before:x", "after:"])
def test_malformed_triggers_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="before:N or after:N"):
        Trigger.parse(text, signal.SIGUSR1)
