"""Shard Leases for a region: a fixed set of long-held ``coordination.k8s.io/v1`` Leases.

Each replica of a region's operator holds a member Lease (``durable-agents-member-<region>-<h>``)
that says it is alive. The region's runs are split into ``shards`` buckets by a stable hash
(:func:`shard_of`); bucket ``i`` is covered by the Lease ``durable-agents-shard-<region>-<i>``.
Who should hold a shard is decided by rendezvous (highest-random-weight) hashing over the live
members, so a replica joining or leaving moves only about ``shards / members`` shards, and every
replica computes the same answer from the same member list without talking to the others.

Every Lease is kept with the Lease primitive (:class:`~.leases.LeaseLock`). A replica takes a
shard it should hold when the Lease is missing, released, or held by a replica that is not live
(see below), by compare-and-swap (resourceVersion precondition), incrementing
``leaseTransitions``: that count is the shard's epoch, the fencing token of every commit made under
it. A shard that should now be someone else's is handed over: the caller's ``drain`` finishes the
units in flight, then the Lease is released (empty holder) so the new owner takes it at once.

A shard Lease is written only when it changes hands: a hold lasts as long as its holder is live.
A replica is live while its member Lease is unexpired, or while it holds the region Lease (the
leader's renewals of that Lease keep it live, so it writes no member Lease meanwhile). Idle upkeep
is therefore one write per half duration per replica, whatever the number of shards. A replica
counts its own liveness on the local monotonic clock from before each liveness write was sent; a
liveness write that lands after that deadline passed may have come after a survivor judged it dead
and took its shards, so every hold is dropped first (and taken again by compare-and-swap, at a new
epoch, fencing the runs). Others judge liveness from a list of the Leases, against the wall-clock
time from before the list was sent, so a renewal that landed before the list is never missed.

A Lease under these names without the labels this module writes is someone else's object: it is
never taken over, released or deleted, only reported (a warning and :attr:`ShardLeases.foreign`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from kubernetes.client.rest import ApiException
from prometheus_client import Counter

from durable_agents.core.regions import region_lease_name
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ground.workqueue import cancel_all
from durable_agents.shell.ownership.leases import Acquired, LeaseHold, LeaseLock, LeaseRecord, micro_time

log = logging.getLogger(__name__)

REGION_LABEL = "durable-agents.io/region"
KIND_LABEL = "durable-agents.io/lease-kind"
SHARD_LABEL = "durable-agents.io/shard"

Reason = Literal["acquired", "released", "expired_takeover", "lost"]
OWNERSHIP_CHANGES = Counter(
    "durable_agents_shard_ownership_changes_total",
    "Shard Lease ownership changes seen by this process (acquired, released, expired_takeover, lost)",
    ["reason"],
)


def _hash64(text: str) -> int:
    # sha256, not hash(): the same on every replica and across restarts (no hash seed).
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def shard_of(namespace: str, name: str, shards: int) -> int:
    """The shard of the run ``namespace/name``: stable across processes, versions and restarts."""
    return _hash64(f"{namespace}/{name}") % shards


def desired_owner(shard: int, members: Iterable[str]) -> str | None:
    """Rendezvous hashing: the member with the highest weight for this shard (ties by name)."""
    return max(members, key=lambda member: (_hash64(f"{shard}/{member}"), member), default=None)


def assignment(shards: int, members: Iterable[str]) -> dict[int, str]:
    """Shard -> desired owner over ``members`` (empty when there are none)."""
    live = sorted(set(members))
    if not live:
        return {}
    return {i: owner for i in range(shards) if (owner := desired_owner(i, live)) is not None}


def shard_lease_name(region: str, shard: int) -> str:
    return f"durable-agents-shard-{region}-{shard}"


def member_lease_name(region: str, identity: str) -> str:
    # The identity is hashed: it may be long or hold characters a name may not.
    return f"durable-agents-member-{region}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


@dataclass(kw_only=True)
class ShardHold(LeaseHold):
    """A shard Lease this replica holds, at ``epoch`` (its ``leaseTransitions``).

    ``taken_from_live_holder``: taken from an expired holder that had not released it; that holder
    may still be finishing a unit, so the runs of the shard must be fenced before they advance.
    ``draining``: being handed over; start no new unit under it.
    """

    shard: int
    epoch: int
    taken_from_live_holder: bool
    draining: bool = False


@dataclass(frozen=True)
class ShardChange:
    """What :attr:`ShardLeases.on_change` is told: a shard acquired, or no longer held."""

    shard: int
    reason: Reason
    hold: ShardHold


@dataclass(frozen=True)
class RegionView:
    """The region's leader-election Lease as this replica last saw it: its holder, the region
    epoch (``leaseTransitions``) and whether a holder was live then (not expired, not released)."""

    holder: str
    epoch: int
    live: bool


Drain = Callable[[int], Awaitable[None]]


class ShardLeases:
    """One replica's share of a region's shards. ``start()`` joins, ``stop()`` leaves gracefully."""

    def __init__(
        self,
        kube: Kube,
        identity: str,
        region: str,
        namespace: str,
        shards: int = 8,
        duration_seconds: int = 15,
        drain: Drain | None = None,
        on_change: Callable[[ShardChange], None] | None = None,
        leading: Callable[[], LeaseHold | None] | None = None,
    ) -> None:
        self.kube = kube
        self.identity = identity
        self.lock = LeaseLock(kube, identity, duration_seconds)
        self.region = region
        self.namespace = namespace
        self.shards = shards
        self.duration = duration_seconds
        self.drain = drain
        self.on_change = on_change
        # The region Lease while this replica holds it: its renewals keep the replica live.
        self.leading = leading or (lambda: None)
        # How often the Leases are listed: a released shard is taken within one poll.
        self.interval = max(0.1, min(1.0, duration_seconds / 8))
        self.members: tuple[str, ...] = ()  # live members at the last poll, self included
        self.region_view: RegionView | None = None  # the region Lease at the last poll
        self.foreign: dict[int, str] = {}  # shard -> uid of the foreign Lease under its name
        self.task: asyncio.Task[None] | None = None
        self._holds: dict[int, ShardHold] = {}
        self._handovers: dict[int, asyncio.Task[None]] = {}
        self._member: LeaseRecord | None = None
        self._renewed_at = float("-inf")  # when the member Lease's last write was sent (monotonic)
        self._alive_until = float("-inf")  # until when no one may judge us dead (monotonic)
        self._member_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._warned: set[str] = set()

    @property
    def writes(self) -> collections.Counter[str]:
        """This replica's Lease writes, by verb."""
        return self.lock.writes

    # --- public API ---------------------------------------------------------------------

    def hold(self, shard: int) -> ShardHold | None:
        """Our current hold of ``shard`` (possibly expired locally: check ``valid()``), or None."""
        hold = self._holds.get(shard)
        return hold if hold is not None and not hold.lost else None

    def hold_for(self, namespace: str, name: str) -> ShardHold | None:
        return self.hold(shard_of(namespace, name, self.shards))

    def held(self) -> dict[int, ShardHold]:
        return {i: h for i, h in self._holds.items() if not h.lost}

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The background tasks; cancelling them without :meth:`stop` is what a crash leaves."""
        return [t for t in (self.task, *self._handovers.values()) if t is not None]

    def poke(self) -> None:
        """Poll now (for example on a Lease watch event) instead of at the next interval."""
        self._wake.set()

    async def start(self) -> None:
        """Join: write the member Lease, take what is ours, and keep polling in the background."""
        await self._poll()
        self.task = asyncio.create_task(self._loop(), name=f"shard-leases-{self.region}")

    async def stop(self) -> None:
        """Leave gracefully: drain each held shard and release it, then delete the member Lease (a
        released shard is taken by its new owner at once; one still held by a live replica is not
        taken at all, so nothing is fenced)."""
        handovers = list(self._handovers.values())
        await cancel_all([t for t in (self.task, *handovers) if t is not None])
        self.task = None
        self._handovers.clear()
        if self.held():  # live by our member Lease while we drain (the region Lease may go first)
            await self._write_member(raising=False)
        await asyncio.gather(*(self._hand_over(h, leaving=True) for h in list(self.held().values())))
        await self._leave()

    async def renew_now(self, hold: ShardHold) -> bool:
        """Extend ``hold`` (by a write of our member Lease, which every hold lasts by); False when
        the hold is lost, or was dropped because our liveness lapsed before the write landed.
        API errors are raised; the hold stays until it expires."""
        if hold.lost:
            return False
        await self._write_member(raising=True)
        return hold.valid()

    def alive(self, until: float, landed: float) -> None:
        """A liveness write of ours (member or region Lease) landed at ``landed``, keeping us live
        until ``until`` (both monotonic). Landed after our last deadline: a survivor may have
        judged us dead meanwhile and taken a shard, so every hold is dropped first."""
        if landed >= self._alive_until:
            self._lapse("its liveness lapsed before a write of it landed")
        self._alive_until = max(self._alive_until, until)
        for hold in self._holds.values():
            hold.valid_until = self._alive_until

    def _lapse(self, why: str) -> None:
        holds = list(self.held().values())
        if holds:
            log.warning(
                "shard Leases of region %s: %s dropped %d holds: %s",
                self.region,
                self.identity,
                len(holds),
                why,
            )
        for hold in holds:
            self._lose(hold, "lost")

    # --- the poll -----------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()
            try:
                await self._poll()
            except ApiException as err:
                log.warning(
                    "shard Leases of region %s: poll failed (%s %s)", self.region, err.status, err.reason
                )
            except Exception:
                log.exception("shard Leases of region %s: poll failed", self.region)

    async def _poll(self) -> None:
        now = datetime.now(UTC)  # before the list: a write that landed before it is in the list
        seen = await self._list()
        if time.monotonic() >= self._alive_until:
            self._lapse("its liveness lapsed")
        await self._keep_member(seen.get(member_lease_name(self.region, self.identity)))
        self.members = self._live_members(seen, now)
        self.region_view = self._region_view(seen.get(region_lease_name(self.region)), now)
        owners = assignment(self.shards, self.members)
        work: list[Awaitable[Any]] = []
        for i in range(self.shards):
            name = shard_lease_name(self.region, i)
            hold = self.hold(i)
            if hold is not None:
                if self._moved(hold, seen.get(name)):
                    self._lose(hold, "lost")
                    continue
                if owners.get(i) != self.identity and i not in self._handovers:
                    self._handovers[i] = asyncio.create_task(self._hand_over(hold), name=f"handover-{i}")
            elif owners.get(i) == self.identity:
                work.append(self._acquire(i, seen.get(name), now))
        await asyncio.gather(*work)

    async def _list(self) -> dict[str, LeaseRecord]:
        leases = await self.lock.select(self.namespace, f"{REGION_LABEL}={self.region}")
        return {lease.name: lease for lease in leases}

    def _region_view(self, record: LeaseRecord | None, now: datetime) -> RegionView | None:
        if record is None or record.labels.get(KIND_LABEL) != "region":
            return None  # none yet, or someone else's object under its name: no leader
        live = bool(record.holder) and not record.released and not record.expired(now)
        return RegionView(record.holder, record.transitions, live)

    def _live_members(self, seen: dict[str, LeaseRecord], now: datetime) -> tuple[str, ...]:
        """Who is live: the holders of unexpired member Leases, and the live holder of the region
        Lease (the leader is kept live by that Lease); we are while our own deadline lasts."""
        live = {
            s.holder
            for name, s in seen.items()
            if s.labels.get(KIND_LABEL) == "member"
            and name == member_lease_name(self.region, s.holder)
            and not s.expired(now)
        }
        region = self._region_view(seen.get(region_lease_name(self.region)), now)
        if region is not None and region.live:
            live.add(region.holder)
        live.discard(self.identity)
        if time.monotonic() < self._alive_until:
            live.add(self.identity)
        return tuple(sorted(live))

    def _moved(self, hold: ShardHold, seen: LeaseRecord | None) -> bool:
        # The list is a consistent read made after our last write: another holder or epoch there
        # means the Lease was taken from us (we were paused past its expiry, or it was deleted).
        if seen is None:
            return True
        return seen.holder != self.identity or seen.transitions != hold.epoch

    # --- membership ---------------------------------------------------------------------

    def _labels(self, kind: str, shard: int | None = None) -> dict[str, str]:
        labels = {REGION_LABEL: self.region, KIND_LABEL: kind}
        if shard is not None:
            labels[SHARD_LABEL] = str(shard)
        return labels

    def _foreign(self, seen: LeaseRecord, kind: str, shard: int | None = None) -> bool:
        expected = self._labels(kind, shard)
        if all(seen.labels.get(k) == v for k, v in expected.items()):
            return False
        key = f"{seen.name}/{seen.uid}"
        if key not in self._warned:
            self._warned.add(key)
            log.warning(
                "Lease %s/%s lacks the labels %s: it is not the operator's and is left alone",
                self.namespace,
                seen.name,
                expected,
            )
        return True

    async def _keep_member(self, seen: LeaseRecord | None) -> None:
        """Write our member Lease when it is due: every half duration, unless the region Lease we
        hold keeps us live (the leader writes no member Lease), and at once when it is missing,
        released or not ours. A failed write keeps what we knew: our deadline decides."""
        if seen is not None and self._foreign(seen, "member"):
            self._member = None
            return
        lead = self.leading()
        covered = lead is not None and lead.valid(self.duration / 4)
        due = time.monotonic() >= self._renewed_at + self.duration / 2
        mine = seen is not None and seen.holder == self.identity and not seen.released
        if mine and (covered or not due):
            return
        await self._write_member(raising=False, seen=seen)

    async def _write_member(self, raising: bool, seen: LeaseRecord | None = None) -> None:
        """Create, take or renew our member Lease, our deadline extended from before the write.
        ``seen``: the Lease as listed (None: as we last wrote it, or read now)."""
        name = member_lease_name(self.region, self.identity)
        async with self._member_lock:
            if seen is None and time.monotonic() < self._renewed_at + self.duration / 4:
                return  # a concurrent caller wrote it just now
            started = time.monotonic()
            try:
                acquired = await self._member_write(name, seen or self._member)
                if acquired is None:  # our copy was stale (moved, deleted): once more from a read
                    acquired = await self._member_write(name, None)
            except ApiException as err:
                log.warning(
                    "member Lease %s/%s: write failed (%s %s)", self.namespace, name, err.status, err.reason
                )
                if raising:
                    raise
                return
            if acquired is None:
                return
            self._member = acquired.record
            self._renewed_at = started
            self.alive(acquired.valid_until, time.monotonic())

    async def _member_write(self, name: str, current: LeaseRecord | None) -> Acquired | None:
        if current is None:
            current = await self.lock.read(self.namespace, name)
        if current is None:
            return await self.lock.create(self.namespace, name, self._labels("member"), 0)
        if self._foreign(current, "member"):
            self._member = None
            return None
        return await self.lock.take(current, current.transitions)

    async def _leave(self) -> None:
        member, self._member = self._member, None
        self._alive_until = float("-inf")
        if member is not None:
            await self.lock.delete(member)

    # --- shards -------------------------------------------------------------------------

    async def _acquire(self, shard: int, seen: LeaseRecord | None, now: datetime) -> None:
        name = shard_lease_name(self.region, shard)
        if seen is None:  # not in the labelled list: missing, or someone else's
            seen = await self.lock.read(self.namespace, name)
        if seen is None:
            self.foreign.pop(shard, None)
            created = await self.lock.create(self.namespace, name, self._labels("shard", shard), 1)
            if created is not None:
                self._took(shard, created, from_live_holder=False)
            return
        if self._foreign(seen, "shard", shard):
            self.foreign[shard] = seen.uid
            return
        self.foreign.pop(shard, None)
        if seen.holder and not seen.released and seen.holder != self.identity and seen.holder in self.members:
            return  # its holder is live: it hands over (releases) or stops being live first
        taken = await self.lock.take(seen, seen.transitions + 1)
        if taken is not None:
            self._took(shard, taken, from_live_holder=not seen.released)

    def _took(self, shard: int, acquired: Acquired, from_live_holder: bool) -> None:
        record = acquired.record
        hold = ShardHold(
            shard=shard,
            epoch=record.transitions,
            record=record,
            valid_until=min(acquired.valid_until, self._alive_until),  # as long as we are live
            taken_from_live_holder=from_live_holder,
        )
        self._holds[shard] = hold
        log.info("shard %s/%d acquired by %s at epoch %d", self.region, shard, self.identity, hold.epoch)
        self._changed(hold, "expired_takeover" if from_live_holder else "acquired")

    async def _hand_over(self, hold: ShardHold, leaving: bool = False) -> None:
        """Drain the shard's units in flight, then release its Lease (unless, meanwhile, it is
        ours again). A failing drain keeps the shard: the handover is retried at the next poll."""
        hold.draining = True
        try:
            if self.drain is not None:
                await self.drain(hold.shard)
            if not leaving and desired_owner(hold.shard, self.members) == self.identity:
                hold.draining = False
                return
            await self._release(hold)
        except ApiException as err:
            log.warning(
                "releasing shard %s/%d failed (%s %s)", self.region, hold.shard, err.status, err.reason
            )
        except Exception:
            hold.draining = False
            log.exception("draining shard %s/%d failed; kept for now", self.region, hold.shard)
        finally:
            if not leaving:
                self._handovers.pop(hold.shard, None)

    async def _release(self, hold: ShardHold) -> None:
        async with hold.busy:
            if hold.lost:
                return
            # Invalid before the request is sent: the new owner may take it as soon as it lands.
            hold.lost = True
            empty = {"holderIdentity": "", "renewTime": micro_time(datetime.now(UTC))}
            released = await self.lock.cas(hold.record, empty)
            self._lose(hold, "released" if released is not None else "lost")

    def _lose(self, hold: ShardHold, reason: Reason) -> None:
        hold.lost = True
        if self._holds.get(hold.shard) is hold:
            del self._holds[hold.shard]
            log.info(
                "shard %s/%d %s by %s (epoch %d)", self.region, hold.shard, reason, self.identity, hold.epoch
            )
            self._changed(hold, reason)

    def _changed(self, hold: ShardHold, reason: Reason) -> None:
        OWNERSHIP_CHANGES.labels(reason).inc()
        metrics.OWNERSHIP_CHANGES.labels("shard").inc()
        if self.on_change is not None:
            try:
                self.on_change(ShardChange(hold.shard, reason, hold))
            except Exception:
                log.exception("on_change for shard %s/%d failed", self.region, hold.shard)
