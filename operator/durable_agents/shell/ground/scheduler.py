"""Wake-ups for idle runs: one heap and one task, however many runs wait.

A waiting run holds no worker and no Lease; it only has an entry here, so that its expiry (or
deadline) is acted on at the right time even if nothing else happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Callable
from datetime import UTC, datetime

from durable_agents.shell.ground.kube import ObjectKey


class WakeScheduler:
    def __init__(self, wake: Callable[[ObjectKey], None]) -> None:
        self._wake = wake
        self._heap: list[tuple[float, int, ObjectKey]] = []
        self._due: dict[ObjectKey, tuple[float, int]] = {}
        self._seq = itertools.count()
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._due)

    def schedule(self, key: ObjectKey, at: datetime | None) -> None:
        """Wake ``key`` at ``at`` (replacing an earlier request); None cancels."""
        if at is None:
            self._due.pop(key, None)
            return
        when = at.astimezone(UTC).timestamp()
        entry = (when, next(self._seq))
        self._due[key] = entry
        heapq.heappush(self._heap, (entry[0], entry[1], key))
        if len(self._heap) > 2 * len(self._due) + 1024:
            # Replaced entries stay in the heap until due: compact, so memory follows live wake-ups.
            self._heap = [(w, s, k) for k, (w, s) in self._due.items()]
            heapq.heapify(self._heap)
        self._changed.set()

    async def run(self) -> None:
        while True:
            self._changed.clear()
            now = datetime.now(UTC).timestamp()
            while self._heap and self._heap[0][0] <= now:
                when, seq, key = heapq.heappop(self._heap)
                if self._due.get(key) == (when, seq):  # stale entries were replaced or canceled
                    del self._due[key]
                    self._wake(key)
            timeout = self._heap[0][0] - now if self._heap else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
