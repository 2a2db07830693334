"""Keep the process's memory small after bursts of work, without stalling it.

What a parked run keeps alive is small (a wake-up entry, a version number); what a burst leaves
behind is freed memory that the C allocator keeps: the JSON of thousands of bodies, parsed and
dropped. ``malloc_trim`` (glibc) returns it; elsewhere that is a no-op.

Two costs grow with the runs a replica knows, and either one held on the event loop stops the Lease
renewals it starts: a full pass of Python's cyclic garbage collector walks every long-lived object
holding the GIL (2.2 s over 100,000 parked runs on an idle machine, seen with py-spy), and
``malloc_trim`` walks the C heap. So what survives a
burst is frozen (``gc.freeze``): after a full collection of what was made since the last look
(bounded by the work done in between, not by the runs kept), no later collection walks it again.
``malloc_trim`` runs in a thread (ctypes lets go of the GIL). The price of freezing: a frozen object
that later becomes part of a reference cycle, and garbage, is not freed until the next deep
collection, which unfreezes everything, collects and freezes again: rarely, while the queue is idle.

Every collection's pause is measured (``durable_agents_gc_pause_seconds``); one over a second is
logged as a warning, since nothing in the process ran meanwhile.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.workqueue import WorkQueue

log = logging.getLogger(__name__)

LONG_PAUSE = 1.0  # seconds: a pause this long is logged (a Lease renewal waits as long)


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


_TRIM = _malloc_trim()


def trim_heap() -> None:
    """Give the C allocator's free memory back to the OS (releases the GIL: call it in a thread)."""
    if _TRIM is not None:
        _TRIM(0)


def settle() -> None:
    """Collect what was made since the last freeze, then freeze what is left: the objects that
    survived are long-lived, and no collection walks them again."""
    gc.collect()
    gc.freeze()


def deep_collect() -> None:
    """Everything collected once more, frozen objects included, then frozen again: frees the
    reference cycles that became garbage after their objects were frozen. Its pause grows with
    the heap: only while idle, rarely."""
    gc.unfreeze()
    settle()


class CollectorPauses:
    """Times each collection of the cyclic garbage collector (``gc.callbacks``). The callback only
    appends: metrics, logging and their locks stay out of the collector's way; :meth:`report`
    hands the pauses on."""

    def __init__(self) -> None:
        self.pauses: deque[tuple[int, float]] = deque(maxlen=10_000)
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((int(info.get("generation", 2)), time.perf_counter() - self._started))

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self)
        self.report()

    def report(self) -> None:
        while self.pauses:
            generation, seconds = self.pauses.popleft()
            metrics.GC_PAUSES.labels(str(generation)).observe(seconds)
            if seconds >= LONG_PAUSE:
                log.warning(
                    "a garbage collection (generation %d) held this process for %.1f s: nothing else "
                    "ran meanwhile, Lease renewals included",
                    generation,
                    seconds,
                )


async def keep_memory(
    queue: WorkQueue, *, every: float = 5, units: int = 100, deep_every: float = 3600
) -> None:
    """Forever, looking every ``every`` seconds: once ``units`` units of work were done since the
    last look, settle the heap (:func:`settle`); once ``queue`` has drained after them, give the
    memory they freed back to the OS; while idle and ``deep_every`` seconds after the last deep
    collection, collect deeply (:func:`deep_collect`)."""
    settled_at = trimmed_at = 0
    deep_at = time.monotonic()
    with CollectorPauses() as pauses:
        while True:
            await asyncio.sleep(every)
            pauses.report()
            if queue.processed - settled_at >= units:
                settled_at = queue.processed
                settle()
            if queue.idle and queue.processed - trimmed_at >= units:
                trimmed_at = queue.processed
                queue.compact()
                await asyncio.to_thread(trim_heap)
            elif queue.idle and time.monotonic() - deep_at >= deep_every:
                deep_at = time.monotonic()
                deep_collect()
                await asyncio.to_thread(trim_heap)
