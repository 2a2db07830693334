"""Seeing the event loop stand still, and where.

Every request the operator makes starts on its event loop, Lease renewals included: a callback that
holds the loop for longer than half a Lease lets the Lease lapse (the hold is then given up, as it
must be). Such a stall shows in nothing the operator sends, so a thread of its own watches a
heartbeat the loop keeps. Once the loop has not beaten for ``stall`` seconds, the thread logs a
warning with the loop thread's stack as it is then, and looks again every ``stall / 8`` seconds;
when the loop runs again, it logs how long it stood still
(``durable_agents_event_loop_stall_seconds``) and the stacks it saw most often: where it stood.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections import Counter

from durable_agents.shell.ground import metrics

log = logging.getLogger(__name__)


class LoopWatch:
    def __init__(self, *, beat: float = 0.5, stall: float = 2.0) -> None:
        self.beat, self.stall = beat, stall
        self.last = time.monotonic()
        self.stalls: list[float] = []  # the length of each stall seen, seconds
        self._stopped = threading.Event()
        self._loop_thread = threading.get_ident()

    async def run(self) -> None:
        """Keep the heartbeat on the loop (and the watching thread running) until cancelled."""
        self._loop_thread = threading.get_ident()
        self.last = time.monotonic()
        self._stopped.clear()
        watcher = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
        watcher.start()
        try:
            while True:
                self.last = time.monotonic()
                await asyncio.sleep(self.beat)
        finally:
            self._stopped.set()

    def _watch(self) -> None:
        seen_at: float | None = None  # the heartbeat a stall was reported for
        where: Counter[str] = Counter()  # while stalled: the loop thread's stacks, sampled
        while not self._stopped.wait(min(self.beat, self.stall / 8)):
            last = self.last
            if seen_at is None and time.monotonic() - last >= self.stall:
                seen_at = last
                where.clear()
            if seen_at is not None and last == seen_at:
                where[self._stack()] += 1
                if sum(where.values()) == 1:
                    log.warning(
                        "the event loop has not run for %.1f s (every request starts on it, Lease "
                        "renewals included); it is in:\n%s",
                        time.monotonic() - last,
                        next(iter(where)),
                    )
            elif seen_at is not None:
                stood = max(0.0, last - seen_at - self.beat)  # beats are ``beat`` apart
                self.stalls.append(stood)
                metrics.LOOP_STALLS.observe(stood)
                samples = sum(where.values())
                log.warning(
                    "the event loop ran again after standing still for %.1f s; where it stood, of %d "
                    "looks:\n%s",
                    stood,
                    samples,
                    "\n".join(f"{n} of {samples}:\n{stack}" for stack, n in where.most_common(3)),
                )
                seen_at = None

    def _stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        return "".join(traceback.format_stack(frame, limit=14)) if frame is not None else "?"
