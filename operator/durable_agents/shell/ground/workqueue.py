"""A work queue that gives each key to one task at a time (as client-go's workqueue does).

Watch events put keys in; the latest body seen for a key rides along so the first read is free.
A key that is re-added while being processed is processed once more afterwards. Failures are
retried later through the wake scheduler, never in a tight loop.

A key whose only reason to run is a body the consumer already decided from (:meth:`WorkQueue.decided`:
the run worker's own status write, coming back through the watch) is not processed. Any add
without a body (a timer, an ActionRecord's outcome, a shard taken, a retry) is a reason of its own:
such a key is always processed, whatever body rides along.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_agents.shell.ground import fast_json, metrics
from durable_agents.shell.ground.kube import ObjectKey
from durable_agents.shell.ground.lifecycle import Background, forever
from durable_agents.shell.ground.scheduler import WakeScheduler

log = logging.getLogger(__name__)


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel background tasks and wait until each has finished; empties the list."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    tasks.clear()


def _compact(body: dict[str, Any]) -> bytes:
    return fast_json.packed(body)  # right-sized: thousands queued at once on a cold start


class WorkQueue(Background):
    def __init__(
        self,
        name: str,
        process: Callable[[ObjectKey, dict[str, Any] | None], Awaitable[None]],
        *,
        concurrency: int,
        retry_backoff: float = 2.0,
    ) -> None:
        self.name = name
        self._process = process
        self.concurrency = concurrency
        self.retry_backoff = retry_backoff
        self.scheduler = WakeScheduler(self.add)
        metrics.SCHEDULED_WAKEUPS.labels(name).set_function(lambda: len(self.scheduler))
        # The latest body per queued key, as compact JSON: a backlog of thousands (a cold start)
        # then costs one string each, not thousands of small objects that fragment the heap.
        self._latest: dict[ObjectKey, bytes] = {}
        self._queue: asyncio.Queue[ObjectKey] = asyncio.Queue()
        self._queued: set[ObjectKey] = set()
        self._active: set[ObjectKey] = set()
        self._finished = asyncio.Condition()  # notified whenever a unit of work ends
        self._dirty: set[ObjectKey] = set()
        # The resourceVersion a key's last unit decided from, until the key is next taken; keys
        # added without a body since they were last taken (those always run).
        self._decided: dict[ObjectKey, str] = {}
        self._nudged: set[ObjectKey] = set()
        self.processed = 0  # units of work done, ever

    @property
    def active(self) -> frozenset[ObjectKey]:
        """The keys being processed right now."""
        return frozenset(self._active)

    async def wait_until(self, done: Callable[[], bool]) -> None:
        """Return once ``done()`` holds, looking again each time a unit of work ends."""
        async with self._finished:
            await self._finished.wait_for(done)

    @property
    def idle(self) -> bool:
        return not self._queued and not self._active

    def add(self, key: ObjectKey, body: dict[str, Any] | None = None) -> None:
        if body is None:
            self._nudged.add(key)
        else:
            self._latest[key] = _compact(body)
        self._requeue(key)

    def _requeue(self, key: ObjectKey) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def compact(self) -> None:
        """Once drained after a burst (a cold start's list): the sets and the dict that held the
        backlog, made anew. Emptied, they keep the size they grew to (about 130 bytes per run
        of the burst, for good); only called while :attr:`idle`, when they hold next to nothing."""
        self._queued = set(self._queued)
        self._latest = dict(self._latest)
        self._dirty = set(self._dirty)
        self._nudged = set(self._nudged)

    def forget(self, key: ObjectKey) -> None:
        self._latest.pop(key, None)
        self._decided.pop(key, None)
        self._nudged.discard(key)
        self.scheduler.schedule(key, None)

    def decided(self, key: ObjectKey, record: dict[str, Any]) -> None:
        """The unit of work on ``key`` ended decided from ``record`` as stored: should that record
        come back (the watch delivering the consumer's own write) as the key's only reason to run,
        it is not processed. Asked once, when the key is next taken."""
        version = (record.get("metadata") or {}).get("resourceVersion")
        if version:
            self._decided[key] = str(version)

    @property
    def decided_pending(self) -> int:
        """Keys whose last decided record has not been looked for yet."""
        return len(self._decided)

    def wake_at(self, key: ObjectKey, at: datetime | None) -> None:
        self.scheduler.schedule(key, at)

    async def run(self) -> None:
        tasks = [asyncio.create_task(self.scheduler.run(), name=f"{self.name}-scheduler")]
        tasks += [
            asyncio.create_task(self._consume(), name=f"{self.name}-{i}") for i in range(self.concurrency)
        ]
        try:
            await forever()
        finally:
            await cancel_all(tasks)

    def _already_decided(self, key: ObjectKey, body: dict[str, Any] | None) -> bool:
        """Taken now: whether its only reason to run is a body the consumer decided from already."""
        nudged, version = key in self._nudged, self._decided.pop(key, None)
        self._nudged.discard(key)
        if body is None or nudged or version is None:
            return False
        return str((body.get("metadata") or {}).get("resourceVersion")) == version

    async def _consume(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                raw = self._latest.pop(key, None)
                body = fast_json.loads(raw) if raw is not None else None
                if self._already_decided(key, body):
                    metrics.OWN_WRITES_SKIPPED.labels(self.name).inc()
                else:
                    await self._process(key, body)
            except Exception:
                log.exception("%s: processing %s/%s failed; retrying later", self.name, *key)
                delay = self.retry_backoff * (1 + random.random())
                self.scheduler.schedule(key, datetime.now(UTC) + timedelta(seconds=delay))
            finally:
                self.processed += 1
                self._active.discard(key)
                async with self._finished:
                    self._finished.notify_all()
                if key in self._dirty:
                    self._dirty.discard(key)
                    self._requeue(key)  # its reasons (a body, a nudge) were kept as they came
            # A unit that never suspends (a parked run's own write coming back: decided idle from
            # memory) would let this loop drain thousands of keys at once, the event loop standing
            # still meanwhile, Lease renewals included (5.5 s at the end of parking 30,000 runs, 15 s
            # at 100,000, the region Lease lapsing): everything else gets a turn after each unit.
            await asyncio.sleep(0)
