"""The Events of commits are posted in the background, a few at a time, and a backlog past its
bound drops new ones (counted, said once) instead of growing without end: 100,000 runs parking at
once must not queue 100,000 Event posts in front of the run work and the Lease renewals."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest
from tests.unit.builders import T0, apply, commit_of, new_run, step

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.shell.ground import metrics
from durable_agents.shell.observability import reporting
from durable_agents.shell.observability.reporting import CommitReporter

pytestmark = pytest.mark.unit


class HeldEvents:
    """An Event recorder whose posts wait until released: counts what is posted and at once."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.posting = 0
        self.most_at_once = 0
        self.posted = 0

    async def record(self, *args: Any, **kwargs: Any) -> None:
        self.posting += 1
        self.most_at_once = max(self.most_at_once, self.posting)
        try:
            await self.release.wait()
            self.posted += 1
        finally:
            self.posting -= 1


async def test_a_burst_of_commit_events_is_posted_a_few_at_a_time_and_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = new_run()
    commit = commit_of(step(run, T0))
    body = apply(run, commit)
    events = HeldEvents()
    reporter = CommitReporter(cast(Any, events), all_events=True)  # every commit gets an Event
    dropped_before = metrics.EVENTS_DROPPED._value.get()
    burst = reporting.MAX_PENDING + 25
    with caplog.at_level(logging.WARNING, logger="durable_agents.shell.runs.worker"):
        for _ in range(burst):
            reporter.report(body, RunState.PENDING, commit)
        await asyncio.sleep(0.05)  # let the posting tasks start (they all wait on `release`)
        assert events.posting == reporting.IN_FLIGHT
        assert metrics.EVENTS_DROPPED._value.get() - dropped_before == 25
        said = [r for r in caplog.records if "Kubernetes Events are waiting" in r.getMessage()]
        assert len(said) == 1, said  # once for the burst, not once per Event dropped
        events.release.set()
        await reporter.flush()
    assert events.posted == reporting.MAX_PENDING
    assert events.most_at_once == reporting.IN_FLIGHT
    # The backlog drained: the next Event is posted, not dropped.
    reporter.report(body, RunState.PENDING, commit)
    await reporter.flush()
    assert events.posted == reporting.MAX_PENDING + 1
    assert metrics.EVENTS_DROPPED._value.get() - dropped_before == 25
