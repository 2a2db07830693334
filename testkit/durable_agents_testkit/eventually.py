"""The one way tests wait: poll a condition until it holds, within a named, bounded timeout.

Tests never sleep a fixed time to let something happen: they wait for the condition that says it
happened, and a timeout fails with a message naming what was awaited and the last value seen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import TypeVar

T = TypeVar("T")


class Within(float, Enum):
    """Named timeouts (seconds), generous for a loaded 2-core machine: a slow pass is not a failure."""

    MOMENT = 5.0  # a local effect of the test's own action (a watch event, a port opening)
    COMMIT = 30.0  # an operator commit or dispatch that needs no wait to expire
    TAKEOVER = 60.0  # a Lease expiry and takeover, a process start, an API server restart
    RUN = 120.0  # a whole run or a batch of runs reaching a state
    SETTLE = 300.0  # many runs at once under kills and restarts (chaos sizes)


FIRST_INTERVAL = 0.05  # seconds: what a test awaits usually happens soon
LONGEST_INTERVAL = 0.25  # a long wait polls (an API server, mostly) at most 4 times a second
BACKOFF = 1.25


def eventually(
    predicate: Callable[[], T | None], within: Within | float, what: str, interval: float | None = None
) -> T:
    """Return the first truthy value of ``predicate``; TimeoutError naming ``what`` after ``within``.

    Polled every ``interval`` seconds if given; else from FIRST_INTERVAL, backing off to
    LONGEST_INTERVAL (on two cores, tests polling 20 times a second for whole runs cost the API
    server and the test process as much CPU as the operator under test)."""
    deadline = time.monotonic() + float(within)
    pause = FIRST_INTERVAL if interval is None else interval
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {float(within):.0f}s waiting for {what} (last: {value!r})")
        time.sleep(pause)
        if interval is None:
            pause = min(pause * BACKOFF, LONGEST_INTERVAL)


async def eventually_async(
    predicate: Callable[[], Awaitable[T | None]], within: Within | float, what: str, interval: float = 0.05
) -> T:
    """:func:`eventually` for a coroutine predicate, without blocking the event loop."""
    deadline = time.monotonic() + float(within)
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {float(within):.0f}s waiting for {what} (last: {value!r})")
        await asyncio.sleep(interval)
