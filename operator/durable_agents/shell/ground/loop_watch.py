"""Seeing the event loop stand still, and where.

Every request the operator makes starts on its event loop, Lease renewals included: a callback that
holds the loop for longer than half a Lease lets the Lease lapse (the hold is then given up, as it
must be). Such a stall shows in nothing the operator sends, so a thread of its own watches a
heartbeat the loop keeps. Once the loop has not beaten for ``stall`` seconds, the thread logs a
warning with the loop thread's stack as it is then (where it stands still), and when the loop runs
again, how long it stood still (``durable_agents_event_loop_stall_seconds``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

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
        while not self._stopped.wait(min(self.beat, self.stall / 4)):
            last = self.last
            lag = time.monotonic() - last
            if lag >= self.stall and seen_at != last:
                seen_at = last
                frame = sys._current_frames().get(self._loop_thread)
                where = "".join(traceback.format_stack(frame, limit=12)) if frame is not None else "?"
                log.warning(
                    "the event loop has not run for %.1f s (every request starts on it, Lease renewals "
                    "included); it is in:\n%s",
                    lag,
                    where,
                )
            elif seen_at is not None and last != seen_at:
                stood = max(0.0, last - seen_at - self.beat)  # beats are ``beat`` apart
                self.stalls.append(stood)
                metrics.LOOP_STALLS.observe(stood)
                log.warning("the event loop ran again after standing still for %.1f s", stood)
                seen_at = None
