"""The gauges computed over runs: how many runs wait in each waiting state and how old the oldest
is, counting only the runs whose shard this replica holds (a sum or max over replicas is then
right) and that its region owns (a run of another region may hash to a shard number this replica
holds); and the oldest action outcome that is unknown right now.

The census keeps, from the AgentRun watch this process has anyway, only (state, since) of each
waiting run, and recomputes the gauges on a timer on the event loop: no API request, nothing per
run that does not wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from durable_agents.api.v1alpha1.states import WAITING_STATES, RunState
from durable_agents.core.regions import owning_region_of
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import ObjectKey
from durable_agents.shell.ground.lifecycle import Background

log = logging.getLogger(__name__)

Held = Callable[[str, str], bool]
"""Whether this replica holds the shard of the run (namespace, name)."""


def _parse(stamp: Any) -> datetime | None:
    if not isinstance(stamp, str):
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


class RunCensus(Background):
    def __init__(
        self, held: Held, region: str, keyring: Keyring | None = None, interval: float = 5.0
    ) -> None:
        self.held = held
        self.region, self.keyring = region, keyring
        self.interval = interval
        self._waiting: dict[ObjectKey, tuple[RunState, datetime]] = {}

    def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A watch event for an AgentRun: remember it only while it waits."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        status = body.get("status") or {}
        try:
            state = RunState(str(status.get("state")))
        except ValueError:
            state = RunState.PENDING
        since = _parse(status.get("stateSince"))
        if (
            event_type == "DELETED"
            or state not in WAITING_STATES
            or since is None
            or owning_region_of(body, self.keyring) != self.region
        ):
            self._waiting.pop(key, None)
        else:
            self._waiting[key] = (state, since)

    def refresh(self, now: datetime | None = None) -> dict[RunState, tuple[int, float]]:
        """Set the gauges; returns (runs, oldest age in seconds) per waiting state."""
        now = now or datetime.now(UTC)
        out = {state: (0, 0.0) for state in WAITING_STATES}
        for (namespace, name), (state, since) in self._waiting.items():
            if not self.held(namespace, name):
                continue
            count, oldest = out[state]
            out[state] = (count + 1, max(oldest, (now - since).total_seconds()))
        for state, (count, oldest) in out.items():
            metrics.WAITING_RUNS.labels(state.value).set(count)
            metrics.OLDEST_WAITING.labels(state.value).set(max(0.0, oldest))
        return out

    async def run(self) -> None:
        while True:
            try:
                self.refresh()
            except Exception:  # a census must never stop the operator; try again next time
                log.exception("run census failed")
            await asyncio.sleep(self.interval)


class UnknownOutcomes:
    """Action records whose outcome is unknown right now, and since when (the dispatcher's)."""

    def __init__(self) -> None:
        self._since: dict[ObjectKey, datetime] = {}
        # Read at scrape time (the metrics server's thread): a copy of the values, taken at once.
        metrics.OLDEST_UNKNOWN_OUTCOME.set_function(self.oldest_seconds)

    def track(self, key: ObjectKey, unknown: bool, since: datetime | None) -> None:
        if unknown:
            when = since or self._since.get(key) or datetime.now(UTC)
            self._since[key] = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
        else:
            self._since.pop(key, None)
        metrics.UNKNOWN_OUTCOMES.set(len(self._since))

    def __len__(self) -> int:
        return len(self._since)

    def oldest_seconds(self, now: datetime | None = None) -> float:
        oldest = min(list(self._since.values()), default=None)
        if oldest is None:
            return 0.0
        return max(0.0, ((now or datetime.now(UTC)) - oldest).total_seconds())
