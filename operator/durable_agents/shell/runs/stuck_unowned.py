"""The Leases a live replica reads to judge the runs nobody alive owns
(:mod:`durable_agents.core.stuck_unowned`).

One list of the operator's member, region and shard Leases (every region's, in the Lease namespace), only
on a pass that has a run this replica does not own that has not advanced for the unowned bound,
and reused for three passes: a replica among others with parked runs makes one list per three
passes, not one request per run. From it,
for each region: how many replicas are live (an unexpired member Lease, or the live region Lease's
holder), how many shards it has (its shard Leases) and the shard Lease that covers a run, judged
by its holder's last liveness write (shard Leases are written only when they change hands).

Who writes: the replica that owns a run writes its ``Stuck`` condition (the owned causes); a run
that nobody alive owns has no such replica, so every live replica that sees it may write the
unowned cause. They cannot fight: the words are the same from each (a compare-and-swap write of
the same condition is a no-op for the second), a non-owner never clears a condition (the owner
does, once it is back or a survivor took the shard) and never writes on a run a live replica owns.
The gauge ``durable_agents_stuck_unowned_runs{region,reason}`` is each replica's own count of
what it sees: the alert takes the ``max`` over replicas, not the sum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import Gauge

from durable_agents.core import stuck_unowned as core
from durable_agents.core.regions import region_lease_name
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ownership.leases import LeaseLock, LeaseRecord
from durable_agents.shell.ownership.shards import (
    KIND_LABEL,
    REGION_LABEL,
    SHARD_LABEL,
    member_lease_name,
    shard_lease_name,
    shard_of,
)

STUCK_UNOWNED = Gauge(
    "durable_agents_stuck_unowned_runs",
    "Runs this replica sees that no live replica owns, stuck, by their region and what would unstick them",
    ["region", "reason"],
)


@dataclass
class _Region:
    shards: dict[int, LeaseRecord] = field(default_factory=dict)
    liveness: dict[str, LeaseRecord] = field(default_factory=dict)  # holder -> its newest live Lease


def _newer(a: LeaseRecord | None, b: LeaseRecord) -> bool:
    return a is None or b.expires_at() > a.expires_at()


class LeaseView:
    """Every region's member, region and shard Leases, as of the last :meth:`refresh`."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.namespace = namespace
        self.lock = LeaseLock(kube, "stuck-check", 1)  # reads only
        self._regions: dict[str, _Region] = {}
        self._listed_at: datetime | None = None
        self._now: datetime | None = None

    async def refresh(self, now: datetime, reuse: float = 0.0) -> None:
        """List the Leases again, unless the last list is younger than ``reuse`` seconds."""
        if self._listed_at is not None and (now - self._listed_at).total_seconds() < reuse:
            return
        leases = await self.lock.select(self.namespace, f"{KIND_LABEL} in (member,shard,region)")
        self._listed_at = now
        regions: dict[str, _Region] = {}
        for lease in leases:
            region = lease.labels.get(REGION_LABEL, "")
            seen = regions.setdefault(region, _Region())
            kind = lease.labels.get(KIND_LABEL)
            liveness = (kind == "member" and lease.name == member_lease_name(region, lease.holder)) or (
                kind == "region" and lease.name == region_lease_name(region)
            )
            if liveness and lease.holder and _newer(seen.liveness.get(lease.holder), lease):
                seen.liveness[lease.holder] = lease
            elif kind == "shard" and (lease.labels.get(SHARD_LABEL) or "").isdigit():
                shard = int(lease.labels[SHARD_LABEL])
                if lease.name == shard_lease_name(region, shard):
                    seen.shards[shard] = lease
        self._regions = regions

    def region(self, region: str, namespace: str, name: str) -> core.RegionSeen:
        """The region's Leases that bear on the run ``namespace/name`` of that region."""
        seen = self._regions.get(region)
        if seen is None or self._listed_at is None:
            return core.RegionSeen(region, 0, None)
        live = sum(not lease.expired(self._listed_at) for lease in seen.liveness.values())
        # The region's shard count is its number of shard Leases (each is kept once a member ran).
        count = max(seen.shards, default=-1) + 1
        shard = seen.shards.get(shard_of(namespace, name, count)) if count else None
        if shard is None:
            return core.RegionSeen(region, live, None)
        # A shard lasts as long as its holder is live: judged by the holder's last liveness write.
        kept = seen.liveness.get(shard.holder, shard)
        return core.RegionSeen(
            region,
            live,
            core.LeaseSeen(
                shard.name, shard.holder, kept.renew_time, timedelta(seconds=kept.duration_seconds)
            ),
        )


def set_gauge(counts: dict[tuple[str, str], int], previous: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Set the gauge to ``counts``; the series of the last pass that are gone now go to 0."""
    for key in previous - set(counts):
        STUCK_UNOWNED.labels(*key).set(0)
    for key, count in counts.items():
        STUCK_UNOWNED.labels(*key).set(count)
    return set(counts)


class Cached:
    """Values read from the API, reused for ``ttl`` seconds."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._values: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any) -> tuple[bool, Any]:
        hit = self._values.get(key)
        if hit is None or time.monotonic() - hit[0] > self.ttl:
            return False, None
        return True, hit[1]

    def put(self, key: Any, value: Any) -> Any:
        self._values[key] = (time.monotonic(), value)
        return value
