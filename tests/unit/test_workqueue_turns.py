"""The work queue gives the event loop back after each unit (``shell/ground/workqueue.py``). A unit
that never suspends (a parked run's own write coming back, decided idle from memory) would otherwise
let a consumer drain every queued key in one go, and nothing else would run meanwhile: not a Lease
renewal, not a heartbeat (the region Lease lapsed so at the end of parking 100,000 runs)."""

from __future__ import annotations

import asyncio
from typing import Any

from durable_agents.shell.ground.workqueue import WorkQueue

UNITS = 2_000


def test_other_tasks_run_while_units_that_never_suspend_drain() -> None:
    async def scenario() -> tuple[int, int]:
        processed = 0

        async def process(key: Any, body: Any) -> None:
            nonlocal processed
            processed += 1  # decided from memory: no await that suspends

        queue = WorkQueue("turns-test", process, concurrency=2)
        for i in range(UNITS):
            queue.add(("ns", f"r{i}"), {"metadata": {"name": f"r{i}"}})
        turns = 0
        seen_while_draining = 0

        async def other() -> None:  # a renewal, a heartbeat: anything else on the loop
            nonlocal turns, seen_while_draining
            while True:
                turns += 1
                if 0 < processed < UNITS:
                    seen_while_draining += 1
                await asyncio.sleep(0)

        beside = asyncio.create_task(other())
        await asyncio.sleep(0)
        queue.start()
        while processed < UNITS:  # noqa: ASYNC110  (the queue signals no drain)
            await asyncio.sleep(0.01)
        beside.cancel()
        await queue.stop()
        return processed, seen_while_draining

    processed, seen = asyncio.run(scenario())
    assert processed == UNITS
    # Two consumers each give a turn after every unit: the other task runs about once per two.
    assert seen >= UNITS // 4, f"the other task ran {seen} times while {UNITS} units drained"
