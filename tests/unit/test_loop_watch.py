"""The loop watch (``shell/ground/loop_watch.py``): a callback that holds the event loop (and with it
every request, Lease renewals included) is seen from a thread, named by its stack, and measured."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from durable_agents.shell.ground.loop_watch import LoopWatch


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # a synchronous pass over every run kept, say


async def watched(watch: LoopWatch, work: float, hold: float) -> None:
    task = asyncio.create_task(watch.run())
    await asyncio.sleep(work)
    if hold:
        hold_the_loop(hold)
    await asyncio.sleep(work)  # the loop runs again: the stall is measured
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_a_stall_is_logged_with_where_the_loop_stood_and_measured(caplog: pytest.LogCaptureFixture) -> None:
    watch = LoopWatch(beat=0.05, stall=1.0)
    with caplog.at_level(logging.WARNING, "durable_agents.shell.ground.loop_watch"):
        asyncio.run(watched(watch, 0.5, 3.0))
    messages = [r.getMessage() for r in caplog.records]
    standing = [m for m in messages if "has not run for" in m]
    assert len(standing) == 1, messages
    assert "hold_the_loop" in standing[0], "the stack names the callback that holds the loop"
    ran_again = [m for m in messages if "ran again after standing still" in m]
    assert len(ran_again) == 1, messages
    assert "hold_the_loop" in ran_again[0], "the stacks sampled while it stood name the callback"
    assert len(watch.stalls) == 1
    assert 1.5 < watch.stalls[0] < 6, watch.stalls


def test_a_loop_that_keeps_running_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    watch = LoopWatch(beat=0.05, stall=1.0)
    with caplog.at_level(logging.WARNING, "durable_agents.shell.ground.loop_watch"):
        asyncio.run(watched(watch, 1.0, 0.0))
    assert watch.stalls == []
    assert not caplog.records
