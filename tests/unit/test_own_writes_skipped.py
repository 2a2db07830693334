"""A run's own write coming back through the watch is not decided again
(``WorkQueue.decided``, ``shell/ground/workqueue.py``): the work queue skips a key only when
the body it carries is the record the last unit decided from, and nothing else asked for the run.
Any add without a body (a timer, an ActionRecord's outcome, a shard taken) runs it, whatever body
rides along, and so does any other resourceVersion."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.workqueue import WorkQueue

KEY = ("ns", "run-a")


def _record(version: str) -> dict[str, Any]:
    return {"metadata": {"namespace": KEY[0], "name": KEY[1], "resourceVersion": version}}


def _skipped() -> float:
    return metrics.OWN_WRITES_SKIPPED.labels("own-writes-test")._value.get()


class Harness:
    """A queue whose units record the body they got; a unit may 'write' (decide from a version)."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []
        self.during: Callable[[], Awaitable[None]] | None = None  # runs inside the next unit
        self.queue = WorkQueue("own-writes-test", self.process, concurrency=1)

    async def process(self, key: Any, body: dict[str, Any] | None) -> None:
        self.seen.append(None if body is None else body["metadata"]["resourceVersion"])
        if self.during is not None:
            during, self.during = self.during, None
            await during()

    async def drained(self) -> None:
        for _ in range(200):
            await asyncio.sleep(0)
            if self.queue.idle:
                return
        raise AssertionError("the queue did not drain within 200 loop turns")


def run(scenario: Callable[[Harness], Awaitable[None]]) -> Harness:
    async def main() -> Harness:
        harness = Harness()
        harness.queue.start()
        try:
            await scenario(harness)
        finally:
            await harness.queue.stop()
        return harness

    return asyncio.run(main())


def test_the_echo_of_the_record_decided_from_is_skipped_and_counted() -> None:
    before = _skipped()

    async def scenario(h: Harness) -> None:
        h.queue.add(KEY, _record("10"))
        await h.drained()
        h.queue.decided(KEY, _record("11"))  # the unit wrote 11 and found the run waiting
        h.queue.add(KEY, _record("11"))  # its echo
        await h.drained()

    h = run(scenario)
    assert h.seen == ["10"], f"the echo was decided again: {h.seen}"
    assert _skipped() == before + 1
    assert h.queue.decided_pending == 0, "the entry is taken by its echo"


def test_another_version_runs() -> None:
    async def scenario(h: Harness) -> None:
        h.queue.decided(KEY, _record("11"))
        h.queue.add(KEY, _record("12"))  # somebody else wrote after us: an approval, a cancel
        await h.drained()

    assert run(scenario).seen == ["12"]


def test_an_add_without_a_body_runs_the_key_though_the_echo_rides_along() -> None:
    async def scenario(h: Harness) -> None:
        h.queue.decided(KEY, _record("11"))
        h.queue.add(KEY)  # e.g. its ActionRecord's outcome: enqueue without a body
        h.queue.add(KEY, _record("11"))  # the echo, coalesced with it
        await h.drained()

    assert run(scenario).seen == ["11"], "a nudge merged with the echo must still run the unit"


def test_a_nudge_while_the_unit_runs_is_kept_for_its_next_run() -> None:
    async def scenario(h: Harness) -> None:
        async def during() -> None:
            h.queue.add(KEY, _record("11"))  # the echo arrives before the unit has finished
            h.queue.add(KEY)  # and so does an outcome to look at
            h.queue.decided(KEY, _record("11"))  # then the unit ends, the run waiting

        h.during = during
        h.queue.add(KEY, _record("10"))
        await h.drained()

    assert run(scenario).seen == ["10", "11"]


def test_the_echo_arriving_while_its_unit_runs_is_skipped_after_it() -> None:
    async def scenario(h: Harness) -> None:
        async def during() -> None:
            h.queue.add(KEY, _record("11"))  # the watch is faster than the unit's end
            h.queue.decided(KEY, _record("11"))

        h.during = during
        h.queue.add(KEY, _record("10"))
        await h.drained()

    assert run(scenario).seen == ["10"]


def test_a_wake_up_runs_the_key() -> None:
    async def scenario(h: Harness) -> None:
        h.queue.decided(KEY, _record("11"))
        h.queue.add(KEY, _record("11"))
        await h.drained()
        h.queue.scheduler.schedule(KEY, None)
        h.queue.add(KEY)  # what the scheduler does at the wake-up time
        await h.drained()

    assert run(scenario).seen == [None]


def test_a_queue_never_told_of_a_decision_runs_every_body() -> None:
    async def main() -> list[str]:
        seen: list[str] = []

        async def process(key: Any, body: dict[str, Any] | None) -> None:
            seen.append(body["metadata"]["resourceVersion"] if body else "")

        queue = WorkQueue("own-writes-plain", process, concurrency=1)
        queue.start()
        queue.add(KEY, _record("11"))
        for _ in range(200):
            await asyncio.sleep(0)
            if queue.idle:
                break
        await queue.stop()
        return seen

    assert asyncio.run(main()) == ["11"]


def test_the_entry_is_asked_once_and_forgotten_with_the_run() -> None:
    async def scenario(h: Harness) -> None:
        h.queue.decided(KEY, _record("11"))
        h.queue.add(KEY, _record("11"))
        await h.drained()
        h.queue.add(KEY, _record("11"))  # a second delivery (a relist) after the echo runs
        await h.drained()
        h.queue.decided(KEY, _record("12"))
        h.queue.forget(KEY)
        assert h.queue.decided_pending == 0
        h.queue.decided(KEY, {"metadata": {}})  # no version: nothing to recognize it by
        assert h.queue.decided_pending == 0

    assert run(scenario).seen == ["11"]
