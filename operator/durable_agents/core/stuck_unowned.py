"""Stuck runs that no live replica owns, judged by a replica that is alive. Pure: no I/O.

A run is advanced (and judged by :mod:`durable_agents.core.stuck`) only by the replica of its
region that holds its shard Lease. When that replica hangs (a paused process, a partition) or the
region has no replica at all, nobody would ever flag the run; so every replica also looks at the
runs it sees but does not own, and calls one stuck when, from the Leases:

* ``OwnerNotRenewing``: its shard Lease has a holder that stopped renewing its Leases (a shard
  lasts as long as its holder is live: ``renewed`` is the holder's last liveness write), and
  nobody took it over: the region has no live member, or the holder expired more than one
  duration ago (the survivors of a region take such a shard within one duration). The fix: restart the hung
  replica, and run more than one per region.
* ``NoRegionOwner``: no replica of its region has a live member Lease and no replica holds its
  shard (the region's Deployment is gone, scaled to zero, or was never installed). The fix:
  deploy the operator for that region, or move its runs with a RegionFailover.

Either only once the run has not advanced for ``after`` (the unowned bound): a region that restarts
its only replica is not stuck. The words are the same from every replica that judges (no replica's
name, no running age in them), so two replicas writing the condition write the same one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from durable_agents.core.stuck import Stuck

NO_REGION_OWNER = "NoRegionOwner"
OWNER_NOT_RENEWING = "OwnerNotRenewing"
REASONS: tuple[str, ...] = (NO_REGION_OWNER, OWNER_NOT_RENEWING)
DEFAULT_AFTER = timedelta(minutes=10)


@dataclass(frozen=True)
class LeaseSeen:
    """A shard Lease as listed: its name, holder (empty: released), and the holder's last
    liveness write (member or region Lease) and that Lease's duration."""

    name: str
    holder: str
    renewed: datetime | None
    duration: timedelta

    def expired_for(self, now: datetime) -> timedelta | None:
        """How long ago it expired; None while it is valid (or was never renewed: not held)."""
        if self.renewed is None:
            return None
        late = now - (self.renewed + self.duration)
        return late if late > timedelta(0) else None


@dataclass(frozen=True)
class RegionSeen:
    """One region's Leases as a replica listed them."""

    region: str
    live_members: int  # member Leases not expired
    shard: LeaseSeen | None  # the shard Lease that covers the run (None: none under that name)


@dataclass(frozen=True)
class UnownedFacts:
    now: datetime
    lease_namespace: str
    region: RegionSeen
    unchanged_since: datetime | None  # since when the run's stateVersion has not changed
    after: timedelta = DEFAULT_AFTER


def stuck_unowned(namespace: str, name: str, facts: UnownedFacts) -> Stuck | None:
    """Whether a run nobody alive owns is stuck (see the module), and the fix; None otherwise."""
    if facts.unchanged_since is None or facts.now - facts.unchanged_since < facts.after:
        return None
    region, where = facts.region.region, facts.lease_namespace
    run = f"{name} -n {namespace}"
    shard = facts.region.shard
    if shard is not None and shard.holder:
        late = shard.expired_for(facts.now)
        if late is None:
            return None  # held and renewed: a live owner judges it
        # Survivors take an expired shard within one duration; with none, nobody ever will.
        if facts.region.live_members == 0 or late >= shard.duration:
            renewed = shard.renewed.isoformat() if shard.renewed is not None else "never"
            return Stuck(
                OWNER_NOT_RENEWING,
                f"its shard Lease {where}/{shard.name} (region {region!r}) is held by {shard.holder!r}, "
                f"which stopped renewing its Leases (last renewed {renewed}, valid "
                f"{int(shard.duration.total_seconds())}s) and no other replica of the region took it "
                f"over; that replica is hung or cut off: restart it (its Pod is named {shard.holder!r} "
                f"in the chart: kubectl delete pod -n {where} {shard.holder}) and run more than one "
                f"replica of region {region!r}; then see kubectl agentrun why {run}",
            )
    if facts.region.live_members == 0:
        return Stuck(
            NO_REGION_OWNER,
            f"no operator serves its region {region!r} (no live member Lease of region {region!r} in "
            f"namespace {where!r}); deploy the operator for it (helm upgrade --install ... --set "
            f"region={region}) or move the region's runs to a served one with a RegionFailover "
            "(docs: Operate > Regions)",
        )
    return None
