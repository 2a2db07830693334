"""Shard Leases for a region: a fixed set of long-held ``coordination.k8s.io/v1`` Leases.

Each replica of a region's operator holds a member Lease (``durable-agents-member-<region>-<h>``)
that says it is alive. The region's runs are split into ``shards`` buckets by a stable hash
(:func:`shard_of`); bucket ``i`` is covered by the Lease ``durable-agents-shard-<region>-<i>``.
Who should hold a shard is decided by rendezvous (highest-random-weight) hashing over the live
members, so a replica joining or leaving moves only about ``shards / members`` shards, and every
replica computes the same answer from the same member list without talking to the others.

A replica takes a shard it should hold when the Lease is missing, released or expired, by
compare-and-swap (resourceVersion precondition), incrementing ``leaseTransitions``: that count is
the shard's epoch, the fencing token of every commit made under it. A shard that should now be
someone else's is handed over: the caller's ``drain`` finishes the units in flight, then the Lease
is released (empty holder) so the new owner takes it at once instead of waiting for expiry.

All of one replica's Leases are renewed together, every half duration (one patch per Lease per
period): a crashed replica's member and shard Leases then expire together, and a survivor takes
its shards within one duration (plus one poll) of its last write.

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
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import Counter

from durable_agents.core.regions import region_lease_name
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ground.workqueue import cancel_all
from durable_agents.shell.ownership.leases import MERGE_PATCH, LeaseRecord

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


def _micro(t: datetime) -> str:
    # MicroTime: RFC 3339 with exactly six fractional digits, as client-go writes it. The client
    # re-serializes a created body's times with isoformat(), which drops a zero fraction and the
    # API server then refuses the Lease (400): never send a whole second.
    t = t if t.microsecond else t + timedelta(microseconds=1)
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class ShardHold:
    """A shard Lease this replica holds. ``valid_until`` is on the local monotonic clock, counted
    from before the request that acquired or last renewed it was sent.

    ``taken_from_live_holder``: taken from an expired holder that had not released it; that holder
    may still be finishing a unit, so the runs of the shard must be fenced before they advance.
    ``draining``: being handed over; start no new unit under it. ``busy`` serializes the writes
    to the Lease (a renewal and a release must not race on its resourceVersion).
    """

    shard: int
    epoch: int
    record: LeaseRecord
    valid_until: float
    taken_from_live_holder: bool
    lost: bool = False
    draining: bool = False
    busy: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)

    def valid(self, margin: float = 0.0) -> bool:
        return not self.lost and time.monotonic() + margin < self.valid_until


@dataclass(frozen=True)
class ShardChange:
    """What :attr:`ShardLeases.on_change` is told: a shard acquired, or no longer held."""

    shard: int
    reason: Reason
    hold: ShardHold


@dataclass(frozen=True)
class _Seen:
    record: LeaseRecord
    labels: dict[str, str]


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
    ) -> None:
        self.kube = kube
        self.identity = identity
        self.region = region
        self.namespace = namespace
        self.shards = shards
        self.duration = duration_seconds
        self.drain = drain
        self.on_change = on_change
        # How often the Leases are listed: a released shard is taken within one poll.
        self.interval = max(0.1, min(1.0, duration_seconds / 8))
        self.members: tuple[str, ...] = ()  # live members at the last poll, self included
        self.region_view: RegionView | None = None  # the region Lease at the last poll
        self.foreign: dict[int, str] = {}  # shard -> uid of the foreign Lease under its name
        self.writes: collections.Counter[str] = collections.Counter()  # this replica's, by verb
        self.task: asyncio.Task[None] | None = None
        self._holds: dict[int, ShardHold] = {}
        self._handovers: dict[int, asyncio.Task[None]] = {}
        self._member: LeaseRecord | None = None
        self._member_ok = False
        self._renewed_at = float("-inf")
        self._wake = asyncio.Event()
        self._warned: set[str] = set()

    @property
    def api(self) -> client.CoordinationV1Api:
        return self.kube.coordination

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
        """Leave gracefully: delete the member Lease (others stop assigning us shards), drain each
        held shard, then release it so its new owner takes it without waiting for expiry."""
        handovers = list(self._handovers.values())
        await cancel_all([t for t in (self.task, *handovers) if t is not None])
        self.task = None
        self._handovers.clear()
        await self._leave()
        await asyncio.gather(*(self._hand_over(h, leaving=True) for h in list(self.held().values())))

    async def renew_now(self, hold: ShardHold) -> bool:
        """Extend ``hold`` by compare-and-swap; False, and the hold marked lost, if the Lease was
        taken, released or deleted meanwhile. Other API errors are raised; the hold stays."""
        async with hold.busy:
            if hold.lost:
                return False
            started = time.monotonic()
            try:
                lease = await self._patch(hold.record, {"renewTime": _micro(datetime.now(UTC))})
            except ApiException as err:
                if err.status in (404, 409):
                    self._lose(hold, "lost")
                    return False
                raise
            hold.record = LeaseRecord.parse(lease)
            hold.valid_until = started + self.duration
            return True

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
        seen = await self._list()
        now = datetime.now(UTC)
        renew = time.monotonic() >= self._renewed_at + self.duration / 2
        started = time.monotonic()
        await self._keep_member(seen.get(member_lease_name(self.region, self.identity)), renew)
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
                if renew or not hold.valid(self.duration / 4):
                    work.append(self._renew_logged(hold))
                if owners.get(i) != self.identity and i not in self._handovers:
                    self._handovers[i] = asyncio.create_task(self._hand_over(hold), name=f"handover-{i}")
            elif owners.get(i) == self.identity:
                work.append(self._acquire(i, seen.get(name), now))
        await asyncio.gather(*work)
        if renew:
            self._renewed_at = started

    async def _list(self) -> dict[str, _Seen]:
        leases = await self.kube.call(
            self.api.list_namespaced_lease, self.namespace, label_selector=f"{REGION_LABEL}={self.region}"
        )
        return {
            lease.metadata.name: _Seen(LeaseRecord.parse(lease), dict(lease.metadata.labels or {}))
            for lease in leases.items
        }

    def _region_view(self, seen: _Seen | None, now: datetime) -> RegionView | None:
        if seen is None or seen.labels.get(KIND_LABEL) != "region":
            return None  # none yet, or someone else's object under its name: no leader
        record = seen.record
        live = bool(record.holder) and not record.released and not record.expired(now)
        return RegionView(record.holder, record.transitions, live)

    def _live_members(self, seen: dict[str, _Seen], now: datetime) -> tuple[str, ...]:
        live = {
            s.record.holder
            for name, s in seen.items()
            if s.labels.get(KIND_LABEL) == "member"
            and name == member_lease_name(self.region, s.record.holder)
            and not s.record.expired(now)
        }
        live.discard(self.identity)
        if self._member_ok:
            live.add(self.identity)
        return tuple(sorted(live))

    def _moved(self, hold: ShardHold, seen: _Seen | None) -> bool:
        # The list is a consistent read made after our last write: another holder or epoch there
        # means the Lease was taken from us (we were paused past its expiry, or it was deleted).
        if seen is None:
            return True
        return seen.record.holder != self.identity or seen.record.transitions != hold.epoch

    # --- membership ---------------------------------------------------------------------

    def _labels(self, kind: str, shard: int | None = None) -> dict[str, str]:
        labels = {REGION_LABEL: self.region, KIND_LABEL: kind}
        if shard is not None:
            labels[SHARD_LABEL] = str(shard)
        return labels

    def _foreign(self, seen: _Seen, kind: str, shard: int | None = None) -> bool:
        expected = self._labels(kind, shard)
        if all(seen.labels.get(k) == v for k, v in expected.items()):
            return False
        key = f"{seen.record.name}/{seen.record.uid}"
        if key not in self._warned:
            self._warned.add(key)
            log.warning(
                "Lease %s/%s lacks the labels %s: it is not the operator's and is left alone",
                self.namespace,
                seen.record.name,
                expected,
            )
        return True

    async def _keep_member(self, seen: _Seen | None, renew: bool) -> None:
        """Write or renew our member Lease. A failed or raced write keeps what we knew (a member
        dropping out of its own view for one poll would hand over all its shards)."""
        name = member_lease_name(self.region, self.identity)
        try:
            if seen is None:
                seen = await self._read(name)
            if seen is None:
                created = await self._create(name, self._labels("member"), 0)
                self._member = created.record if created else self._member
            elif self._foreign(seen, "member"):
                self._member = None
            elif renew or seen.record.holder != self.identity or seen.record.released:
                lease = await self._cas(seen.record, self._spec(seen.record.transitions))
                self._member = LeaseRecord.parse(lease) if lease is not None else self._member
            else:
                self._member = seen.record
        except ApiException as err:
            log.warning(
                "member Lease %s/%s: write failed (%s %s)", self.namespace, name, err.status, err.reason
            )
        self._member_ok = self._member is not None

    async def _leave(self) -> None:
        member, self._member, self._member_ok = self._member, None, False
        if member is None:
            return
        try:
            await self.kube.call(
                self.api.delete_namespaced_lease,
                member.name,
                self.namespace,
                body={"preconditions": {"resourceVersion": member.resource_version}},
            )
        except ApiException as err:
            if err.status not in (404, 409):
                raise
        finally:
            self._count("delete")

    # --- shards -------------------------------------------------------------------------

    async def _acquire(self, shard: int, seen: _Seen | None, now: datetime) -> None:
        name = shard_lease_name(self.region, shard)
        if seen is None:
            seen = await self._read(name)  # not in the labelled list: missing, or someone else's
        if seen is None:
            self.foreign.pop(shard, None)
            started = time.monotonic()
            created = await self._create(name, self._labels("shard", shard), 1)
            if created is not None:
                self._took(shard, created.record, started, from_live_holder=False)
            return
        if self._foreign(seen, "shard", shard):
            self.foreign[shard] = seen.record.uid
            return
        self.foreign.pop(shard, None)
        record = seen.record
        if not record.expired(now):
            return  # held by a live holder: it hands over (releases) or expires first
        started = time.monotonic()
        lease = await self._cas(record, self._spec(record.transitions + 1))
        if lease is not None:
            self._took(shard, LeaseRecord.parse(lease), started, from_live_holder=not record.released)

    def _took(self, shard: int, record: LeaseRecord, started: float, from_live_holder: bool) -> None:
        hold = ShardHold(shard, record.transitions, record, started + self.duration, from_live_holder)
        self._holds[shard] = hold
        log.info("shard %s/%d acquired by %s at epoch %d", self.region, shard, self.identity, hold.epoch)
        self._changed(hold, "expired_takeover" if from_live_holder else "acquired")

    async def _renew_logged(self, hold: ShardHold) -> None:
        try:
            await self.renew_now(hold)
        except ApiException as err:
            log.warning(
                "renewing shard %s/%d failed (%s %s)", self.region, hold.shard, err.status, err.reason
            )

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
            try:
                await self._patch(hold.record, {"holderIdentity": "", "renewTime": _micro(datetime.now(UTC))})
            except ApiException as err:
                if err.status not in (404, 409):
                    raise
                self._lose(hold, "lost")
                return
            self._lose(hold, "released")

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

    # --- writes -------------------------------------------------------------------------

    def _spec(self, transitions: int) -> dict[str, Any]:
        now = _micro(datetime.now(UTC))
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def _count(self, verb: str) -> None:
        metrics.API_WRITES.labels("leases", verb).inc()
        self.writes[verb] += 1

    async def _read(self, name: str) -> _Seen | None:
        try:
            lease = await self.kube.call(self.api.read_namespaced_lease, name, self.namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return _Seen(LeaseRecord.parse(lease), dict(lease.metadata.labels or {}))

    async def _create(self, name: str, labels: dict[str, str], transitions: int) -> _Seen | None:
        """A new Lease held by us; None when it exists already (someone was faster)."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
            "spec": self._spec(transitions),
        }
        try:
            lease = await self.kube.call(self.api.create_namespaced_lease, self.namespace, body)
        except ApiException as err:
            if err.status == 409:
                return None
            raise
        finally:
            self._count("create")
        return _Seen(LeaseRecord.parse(lease), labels)

    async def _patch(self, record: LeaseRecord, spec: dict[str, Any]) -> Any:
        # resourceVersion in a merge patch is a precondition: 409 if the Lease moved meanwhile.
        body = {"metadata": {"resourceVersion": record.resource_version}, "spec": spec}
        try:
            return await self.kube.call(
                self.api.patch_namespaced_lease,
                record.name,
                record.namespace,
                body,
                _content_type=MERGE_PATCH,
            )
        finally:
            self._count("patch")

    async def _cas(self, record: LeaseRecord, spec: dict[str, Any]) -> Any | None:
        """:meth:`_patch`, None when we lost the race (the Lease moved or is gone)."""
        try:
            return await self._patch(record, spec)
        except ApiException as err:
            if err.status in (404, 409):
                return None
            raise
