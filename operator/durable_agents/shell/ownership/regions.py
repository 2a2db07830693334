"""Region ownership: leader election on one ``coordination.k8s.io/v1`` Lease per region.

The Lease ``durable-agents-region-<region>`` in the operator's namespace names the process that
owns the region right now. It is kept with the Lease primitive (:class:`~.leases.LeaseLock`:
client-go's fields, every write a compare-and-swap). ``leaseTransitions`` is the region epoch, a
fencing token: every new hold increments it, so a former owner that was paused or partitioned
holds a lower epoch than the current owner (:class:`RegionOwnership`).

Expiry is judged as client-go judges it, on the local monotonic clock and not from the
``renewTime`` another host's clock wrote: a Lease whose resourceVersion this elector has seen
unchanged for ``leaseDurationSeconds`` is expired. The holder counts its own validity from before
its last successful request was sent, so it stops leading before any other elector may take over
(provided the clocks run at the same rate). A freshly started elector therefore waits up to one
duration before taking over from a dead holder; a stopped one releases the Lease (holder emptied)
and the next takes over at once.

A Lease under the region's name without the operator's labels is someone else's object: it is
never taken over, and the elector stays a follower, saying why (:attr:`RegionElector.foreign`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from durable_agents.core.regions import RegionOwnership, region_lease_name, validate_region
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ownership.leases import Acquired, LeaseHold, LeaseLock, LeaseRecord

log = logging.getLogger(__name__)

REGION_LABEL = "durable-agents.io/region"
LEASE_KIND_LABEL = "durable-agents.io/lease-kind"


@dataclass(kw_only=True)
class RegionHold(LeaseHold):
    """This process's ownership of a region, at ``epoch`` (the Lease's ``leaseTransitions``)."""

    region: str
    epoch: int

    @property
    def ownership(self) -> RegionOwnership:
        return RegionOwnership(self.region, self.epoch)


OnChange = Callable[["RegionHold | None"], None]


class RegionElector:
    """Elects one owner of ``region`` among the processes that run an elector for it.

    ``on_change(hold)`` is called when this process becomes the owner, ``on_change(None)`` when it
    stops being the owner (lost, lapsed or released); it runs on the elector's task and must not
    block. ``leading()`` is the current hold while it is valid.
    """

    def __init__(
        self,
        kube: Kube,
        identity: str,
        region: str,
        namespace: str,
        duration_seconds: int = 15,
        *,
        on_change: OnChange | None = None,
        on_renewed: Callable[[float, float], None] | None = None,
        retry_seconds: float | None = None,
    ) -> None:
        self.kube = kube
        self.identity = identity
        self.lock = LeaseLock(kube, identity, duration_seconds)
        self.region = validate_region(region)
        self.namespace = namespace
        self.duration = duration_seconds
        self.name = region_lease_name(region)
        metrics.REGION_OWNED.labels(self.region).set(0)  # the series exists before any election
        self.on_change = on_change
        # Told (valid until, landed at; monotonic) after each write that holds the Lease: while
        # this process leads, those writes are what keeps it live for its shards.
        self.on_renewed = on_renewed
        # How often a follower looks at the Lease (client-go: 2 s for a 15 s Lease).
        self.retry = retry_seconds if retry_seconds is not None else max(0.1, duration_seconds / 8)
        self.foreign: str | None = None  # why the Lease under our name is not ours, if it is not
        self.attempts = 0  # acquisition attempts (reads of the Lease as a follower)
        self._hold: RegionHold | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._observed: tuple[str, float] | None = None  # (resourceVersion, when first seen: monotonic)
        self._highest_epoch = -1  # so a recreated Lease never starts below an epoch seen before

    # --- public API -------------------------------------------------------------------------

    def leading(self) -> RegionHold | None:
        hold = self._hold
        return hold if hold is not None and hold.valid() else None

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._stopping.clear()
            self._task = asyncio.create_task(self._run(), name=f"region-elector-{self.region}")

    async def stop(self) -> None:
        """Stop electing; release the region (holder emptied by compare-and-swap) if we own it."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None:
            # Let a request in flight finish (cancelling it would not stop it on the server, and a
            # renewal landing after the release's read would leave the Lease held): bounded.
            done, _ = await asyncio.wait({task}, timeout=self.duration)
            if not done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        hold = self._hold
        if hold is not None:
            await self._release(hold)

    async def renew_now(self, hold: RegionHold) -> bool:
        """Extend ``hold`` by compare-and-swap; False (and the hold lost) if the Lease moved on."""
        renewed = await self.lock.renew(hold, self._taken)
        if renewed:
            self._renewed(hold.valid_until)
        return renewed

    # --- the election loop ------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping.is_set():
            hold = self._hold
            try:
                if hold is None or hold.lost:
                    await self._try_acquire()
                elif not hold.valid():
                    self._lose(hold, "it was not renewed in time")
                elif time.monotonic() >= hold.valid_until - self.duration / 2:
                    await self.renew_now(hold)
            except Exception as err:  # an API or network error: try again, the hold lapses alone
                log.warning("region %s: Lease %s/%s: %s", self.region, self.namespace, self.name, err)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._pause())

    def _pause(self) -> float:
        hold = self._hold
        if hold is None or hold.lost:
            return self.retry
        # Renew at half the duration; after a failed renewal, retry at the follower's pace.
        due = hold.valid_until - self.duration / 2 - time.monotonic()
        return due if due > 0 else self.retry

    async def _try_acquire(self) -> None:
        self.attempts += 1
        record = await self.lock.read(self.namespace, self.name)
        if record is None:
            self.foreign = None
            await self._create()
            return
        self._highest_epoch = max(self._highest_epoch, record.transitions)
        if not self._check_ours(record):
            return
        if self._expired(record):
            await self._take_over(record)

    def _check_ours(self, record: LeaseRecord) -> bool:
        expected = {REGION_LABEL: self.region, LEASE_KIND_LABEL: "region"}
        wrong = sorted(k for k, v in expected.items() if record.labels.get(k) != v)
        if not wrong:
            self.foreign = None
            return True
        why = "it lacks " + ", ".join(f"the label {k}={expected[k]}" for k in wrong)
        if self.foreign != why:
            log.warning(
                "region %s: Lease %s/%s was not made by the operator for the region (%s): it is never"
                " taken over, and this process does not own the region until it is removed",
                self.region,
                record.namespace,
                record.name,
                why,
            )
        self.foreign = why
        return False

    def _expired(self, record: LeaseRecord) -> bool:
        now = time.monotonic()
        if self._observed is None or self._observed[0] != record.resource_version:
            self._observed = (record.resource_version, now)
        return record.released or now - self._observed[1] >= record.duration_seconds

    async def _create(self) -> None:
        labels = {REGION_LABEL: self.region, LEASE_KIND_LABEL: "region"}
        acquired = await self.lock.create(self.namespace, self.name, labels, self._highest_epoch + 1)
        if acquired is not None:  # None: another elector created it first
            self._won(acquired)

    async def _take_over(self, record: LeaseRecord) -> None:
        acquired = await self.lock.take(record, record.transitions + 1)
        if acquired is None:  # moved on since we read it: someone else was faster
            return
        if record.holder:
            log.info("region %s: took over from %s (expired)", self.region, record.holder)
        self._won(acquired)

    def _won(self, acquired: Acquired) -> None:
        record = acquired.record
        self._highest_epoch = max(self._highest_epoch, record.transitions)
        hold = RegionHold(
            region=self.region, epoch=record.transitions, record=record, valid_until=acquired.valid_until
        )
        self._hold = hold
        log.info("region %s: %s owns it, epoch %d", self.region, self.identity, hold.epoch)
        self._renewed(hold.valid_until)
        self._notify(hold)

    def _renewed(self, valid_until: float) -> None:
        if self.on_renewed is None:
            return
        try:
            self.on_renewed(valid_until, time.monotonic())
        except Exception:
            log.exception("region %s: on_renewed callback failed", self.region)

    def _taken(self, hold: RegionHold) -> None:
        self._lose(hold, "its Lease was taken over, released or deleted meanwhile")

    def _lose(self, hold: RegionHold, why: str) -> None:
        if hold.lost:
            return
        hold.lost = True
        log.warning(
            "region %s: %s no longer owns it (epoch %d): %s", self.region, self.identity, hold.epoch, why
        )
        self._notify(None)

    def _notify(self, hold: RegionHold | None) -> None:
        metrics.OWNERSHIP_CHANGES.labels("region").inc()
        metrics.REGION_OWNED.labels(self.region).set(1 if hold is not None else 0)
        if self.on_change is None:
            return
        try:
            self.on_change(hold)
        except Exception:  # a broken callback must not stop the election
            log.exception("region %s: on_change callback failed", self.region)

    async def _release(self, hold: RegionHold) -> None:
        async with hold.busy:
            if hold.lost:
                return
            # Stop leading first (nothing may commit with this epoch any more), then hand over
            # (the holder emptied; a Lease that moved on already has nothing of ours to release).
            self._lose(hold, "released on stop")
            await self.lock.cas(hold.record, {"holderIdentity": None})
