"""The one start/stop shape: a part runs until cancelled and cleans up on its way out; the
manager's list starts its parts in order and stops them in reverse order, each stop waiting for
that part's clean-up before the next part is stopped."""

from __future__ import annotations

import asyncio

import pytest

from durable_agents.shell.ground.lifecycle import Background, Runnable, Runnables, forever

pytestmark = pytest.mark.unit


class Part(Background):
    def __init__(self, name: str, journal: list[str]) -> None:
        self.name, self.journal = name, journal

    async def run(self) -> None:
        self.journal.append(f"start {self.name}")
        try:
            await forever()
        finally:
            await asyncio.sleep(0)  # a clean-up that awaits (say, releasing a Lease)
            self.journal.append(f"stop {self.name}")


async def test_parts_start_in_order_and_stop_in_reverse_order_after_their_clean_up() -> None:
    journal: list[str] = []
    parts = Runnables()
    for name in ("worker", "dispatcher", "reflector"):
        parts.add(Part(name, journal))
    assert all(isinstance(part, Runnable) for part in parts.parts)
    parts.start()
    parts.start()  # a second start starts nothing twice
    await asyncio.sleep(0.01)
    assert journal == ["start worker", "start dispatcher", "start reflector"]
    await parts.stop()
    assert journal[3:] == ["stop reflector", "stop dispatcher", "stop worker"]
    await parts.stop()  # idempotent
    assert len(journal) == 6


async def test_a_part_that_fails_is_logged_and_its_stop_still_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(Background):
        async def run(self) -> None:
            raise RuntimeError("the API server said no")

    part = Broken()
    part.start()
    await asyncio.sleep(0.01)
    assert "Broken stopped on an error" in caplog.text
    assert "the API server said no" in caplog.text
    await part.stop()
    assert not part.running
