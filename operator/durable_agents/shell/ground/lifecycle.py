"""One start/stop shape for every long-running part of the operator (controller-runtime's Runnable).

A part implements ``run()``: it runs until cancelled and cleans up on its way out (a ``finally``
or an ``except CancelledError`` that re-raises). :class:`Background` gives it ``start()`` (one
task running ``run()``) and ``stop()`` (cancel it and wait until its clean-up is done), so a part
used on its own (a test, a part of a part) starts and stops as the manager's list does.
:class:`Runnables` is that list: started in order, stopped in the reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)


@runtime_checkable
class Runnable(Protocol):
    """A long-running part: ``run()`` until cancelled; ``start()``/``stop()`` around it."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


class Background:
    """``start()`` and ``stop()`` for a part that implements ``run()`` (run until cancelled)."""

    _task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    async def run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Run ``run()`` in a task of its own (a second start while running does nothing)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=type(self).__name__)

    async def _run(self) -> None:
        try:
            await self.run()
        except asyncio.CancelledError:
            raise
        except Exception:  # a part's crash is logged where it happened, never silently lost
            log.exception("%s stopped on an error", type(self).__name__)
            raise

    async def stop(self) -> None:
        """Cancel ``run()`` and wait until its clean-up has finished (idempotent)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def forever() -> None:
    """Wait until cancelled: the body of a ``run()`` whose work happens in tasks it started."""
    await asyncio.Event().wait()


class Runnables:
    """The manager's list of parts: each started in the order added, stopped in reverse order."""

    def __init__(self) -> None:
        self.parts: list[Runnable] = []
        self._started: list[Runnable] = []

    def add(self, part: Runnable) -> None:
        self.parts.append(part)

    def start(self) -> None:
        for part in self.parts:
            if part not in self._started:
                part.start()
                self._started.append(part)

    async def stop(self) -> None:
        while self._started:
            await self._started.pop().stop()
        self.parts.clear()
