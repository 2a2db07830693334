"""The memory keeper (``shell/ground/memory.py``): what survives a burst is frozen out of the
garbage collector's passes, so a full collection no longer walks the runs a replica keeps (2.2 s
over 100,000 parked runs, idle); a deep collection still frees the cycles frozen
while alive; malloc_trim runs off the event loop; each collection's pause is measured."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from typing import Any

import pytest

from durable_agents.shell.ground import memory, metrics
from durable_agents.shell.ground.workqueue import WorkQueue


class Node:
    """A GC-tracked object that can be part of a reference cycle and be weakly referenced."""

    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> tuple[Node, weakref.ref[Node]]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


def walked(obj: object) -> bool:
    """Whether a collection walks ``obj``: it is in one of the collector's generations."""
    return any(o is obj for o in gc.get_objects())


def test_settling_collects_the_garbage_made_since_and_freezes_the_survivors() -> None:
    kept = [Node() for _ in range(50_000)]  # the long-lived objects of parked runs
    garbage, dead = cycle()
    del garbage
    assert walked(kept[0])

    memory.settle()

    assert dead() is None, "the cycle that was garbage is collected before freezing"
    assert not walked(kept[0]), "a full collection walks the kept objects"
    assert not walked(kept[-1])
    assert gc.get_freeze_count() >= len(kept)
    assert len(gc.get_objects()) < len(kept), "what a full collection walks no longer grows with them"


def test_a_cycle_frozen_alive_is_freed_by_the_deep_collection_only() -> None:
    holder: list[Node] = []
    node, alive = cycle()
    holder.append(node)
    del node
    memory.settle()
    holder.clear()  # garbage now, but frozen

    gc.collect()
    assert alive() is not None, "frozen: an ordinary full collection does not free it"

    memory.deep_collect()
    assert alive() is None
    assert gc.get_freeze_count() > 0, "what survives the deep collection is frozen again"


def pause_count(generation: str) -> float:
    samples = metrics.GC_PAUSES.collect()[0].samples
    return next(
        s.value for s in samples if s.name.endswith("_count") and s.labels["generation"] == generation
    )


def test_every_collection_is_timed_and_a_long_one_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(memory, "LONG_PAUSE", 0.0)  # every pause counts as long here
    metrics.GC_PAUSES.labels("2")
    before = pause_count("2")
    with caplog.at_level(logging.WARNING, "durable_agents.shell.ground.memory"):
        with memory.CollectorPauses():
            gc.collect()
            gc.collect()
        assert not any(isinstance(c, memory.CollectorPauses) for c in gc.callbacks), "removed on exit"
    assert pause_count("2") >= before + 2
    logged = [r.getMessage() for r in caplog.records]
    assert any("garbage collection (generation 2) held this process" in m for m in logged), logged


def test_the_collector_callback_only_records(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses = memory.CollectorPauses()
    times = iter([10.0, 12.5])
    monkeypatch.setattr(memory.time, "perf_counter", lambda: next(times))
    pauses("start", {"generation": 1})
    pauses("stop", {"generation": 1, "collected": 0})
    assert list(pauses.pauses) == [(1, 2.5)]


async def _keeper(queue: WorkQueue, **kwargs: Any) -> asyncio.Task[None]:
    return asyncio.create_task(memory.keep_memory(queue, every=0.01, units=1, **kwargs))


def test_the_heap_is_trimmed_in_a_thread_while_the_loop_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """malloc_trim walks the C heap (seconds after a large burst); on the loop it would stop
    every Lease renewal meanwhile."""
    trimming = {"ticks_during": -1}

    async def scenario() -> None:
        ticks = 0

        def slow_trim() -> None:
            start = ticks
            time.sleep(0.5)
            trimming["ticks_during"] = ticks - start

        monkeypatch.setattr(memory, "trim_heap", slow_trim)

        async def process(key: Any, body: Any) -> None:
            return None

        queue = WorkQueue("keeper-test", process, concurrency=1)
        queue.start()
        queue.add(("ns", "r1"), {"metadata": {"name": "r1"}})
        keeper = await _keeper(queue)
        deadline = time.monotonic() + 30
        while trimming["ticks_during"] < 0:
            assert time.monotonic() < deadline, "the heap was never trimmed after the burst"
            await asyncio.sleep(0.01)
            ticks += 1
        keeper.cancel()
        await queue.stop()

    asyncio.run(scenario())
    assert trimming["ticks_during"] > 0, "the event loop stood still while the heap was trimmed"


def test_an_idle_keeper_collects_deeply_once_due(monkeypatch: pytest.MonkeyPatch) -> None:
    deep: list[float] = []
    monkeypatch.setattr(memory, "deep_collect", lambda: deep.append(time.monotonic()))
    monkeypatch.setattr(memory, "trim_heap", lambda: None)

    async def scenario(deep_every: float) -> int:
        deep.clear()

        async def process(key: Any, body: Any) -> None:
            return None

        queue = WorkQueue("keeper-test", process, concurrency=1)
        queue.start()
        keeper = await _keeper(queue, deep_every=deep_every)
        await asyncio.sleep(0.3)
        keeper.cancel()
        await queue.stop()
        return len(deep)

    assert asyncio.run(scenario(3600)) == 0, "not due: no deep collection"
    assert asyncio.run(scenario(0.05)) >= 2, "due while idle: collected deeply, again once due again"
