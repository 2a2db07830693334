"""Give memory back to the OS after a burst of work (a cold start's initial list, a wave of runs).

What a parked run keeps alive is small (a wake-up entry, a version number); what a burst leaves
behind is freed memory that the C allocator keeps: the JSON of thousands of bodies, parsed and
dropped. ``malloc_trim`` (glibc) returns it; elsewhere this is a no-op.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable

from durable_agents.shell.ground.workqueue import WorkQueue

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


_TRIM = _malloc_trim()


def release_memory() -> None:
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


async def trim_after_bursts(queue: WorkQueue, *, every: float = 5, units: int = 100) -> None:
    """Forever: once ``queue`` has drained after at least ``units`` units of work, release the
    memory they freed (looked at every ``every`` seconds)."""
    trimmed_at = 0
    while True:
        await asyncio.sleep(every)
        if queue.idle and queue.processed - trimmed_at >= units:
            trimmed_at = queue.processed
            queue.compact()
            release_memory()
