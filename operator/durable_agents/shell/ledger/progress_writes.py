"""The progress a called system reports while an action is dispatching, written to the
ActionRecord's ``status.progress`` within the status-write budget.

A server may send a progress notification per millisecond; the API server must not see a write per
notification. The notifications only replace the latest progress in memory (:meth:`ProgressWrites.seen`,
no I/O); a writer beside the dispatch writes that latest value at most once per
:data:`PROGRESS_WRITE_INTERVAL`, and only when it changed, so a call shorter than the interval
costs no write at all and a call of ``T`` seconds at most ``T / PROGRESS_WRITE_INTERVAL`` writes,
however many notifications came. The next write of the record's state (the answer) clears it.

The record is written in the state it has: ``dispatching`` under a claim, ``intent`` when sent
under its creator's first claim (no claim write: the first claim in its spec says who sends it
until when; a dispatcher that sees the progress write waits for that claim, as for any). The
writes are the dispatcher's own compare-and-swap writes of the record (stamped, as every status
write): the writer hands the record it wrote back to the dispatcher, whose answer is then written
on top of it. A write that fails (the record moved on, the API server refused) ends the progress
writes of this attempt, never the call: the dispatcher's answer is written on the last record it
knows, as without progress.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Final

from durable_agents.api.v1alpha1 import ActionProgress, ActionRecordStatus, ActionState
from durable_agents.shell.agent.mcp_notices import Progress
from durable_agents.shell.ledger.actions import ActionStore

log = logging.getLogger(__name__)

PROGRESS_WRITE_INTERVAL: Final = 5.0
"""Seconds between two progress writes of one action (and before the first)."""


class ProgressWrites:
    """The progress writes of one dispatch attempt of the record ``body`` (status ``status``)."""

    def __init__(self, store: ActionStore, body: dict[str, Any], status: ActionRecordStatus) -> None:
        self.store, self.body, self.status = store, body, status
        self.latest: Progress | None = None
        self.written: Progress | None = None
        self.writes = 0
        self._done = asyncio.Event()

    def seen(self, progress: Progress) -> None:
        """A progress notification: kept, not written (cheap: runs in the MCP client's loop)."""
        self.latest = progress

    async def _write(self, latest: Progress) -> bool:
        shown = ActionProgress(
            progress=latest.progress,
            total=latest.total,
            message=latest.message,
            notifications=latest.notifications,
            at=datetime.now(UTC),
        )
        status = self.status.model_copy(update={"progress": shown})
        try:
            body = await self.store.commit_status(self.body, status.wire())
        except Exception as err:  # a conflict, an API error: progress never fails the call
            log.debug("progress of %s not written: %s", self.body["metadata"]["name"], err)
            return False
        self.body, self.status = body, ActionRecordStatus.model_validate(body["status"])
        self.written, self.writes = latest, self.writes + 1
        return True

    async def _run(self) -> None:
        if self.status.state not in (ActionState.DISPATCHING, ActionState.INTENT):
            return
        while True:
            try:
                await asyncio.wait_for(self._done.wait(), PROGRESS_WRITE_INTERVAL)
                return
            except TimeoutError:
                pass
            latest = self.latest
            if latest is not None and latest is not self.written and not await self._write(latest):
                return

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[ProgressWrites]:
        """Write progress while the body runs; on leaving, a write under way is finished (never
        cut: the dispatcher's answer must be written on the record it made)."""
        task = asyncio.create_task(self._run())
        try:
            yield self
        finally:
            self._done.set()
            await task
