"""Whether this process may advance a run now, and under which epoch.

A run is advanced only under a valid hold of the shard Lease that covers it
(:mod:`durable_agents.shell.ownership.shards`: a few Leases per region, held for a long time by the live
replicas, a run mapped to a shard by a stable hash). No Lease is written per run or per unit of
work. The epoch written into a run's commits is (this process, a number): the shard Lease's epoch
(its ``leaseTransitions``, which only grow), or one more than the epoch recorded in the run if
that is higher (a run committed by an earlier release under its per-run Lease, or by a holder of
the shard with a higher number for it): a run's epochs only grow, one holder each, whatever Lease
they came from. It is chosen when the run is first touched under a hold and kept for that hold.

Three lines keep a run from being advanced by two holders:

* a commit is a compare-and-swap on the run's resourceVersion;
* before a commit the hold must still be valid on the local monotonic clock, with a margin, else
  it is renewed by compare-and-swap on the shard Lease (a paused process finds it taken: lost);
* a shard taken from a holder that had not released it (it may be a zombie with a commit in
  flight) is fenced run by run: before a run advances under the new hold, its checkpoint is
  stamped with the new epoch (a write without a transition), so the zombie's prepared commit is
  refused. After this process has written a run under a hold, a checkpoint with another epoch
  means someone else advanced it since: :meth:`RunOwnership.lost`.

Runs of an earlier release were held by a Lease per run (``agentrun-<run>``). During a rolling
upgrade a Pod of that release may still hold one: a live one, held by another process, is
respected (the run waits for it to expire or go); an expired one is left to the garbage collector
(it is owned by its run).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from durable_agents.core.checkpoint import Fencing
from durable_agents.shell.ground.kube import ObjectKey
from durable_agents.shell.ownership.leases import LeaseRecord
from durable_agents.shell.ownership.shards import ShardChange, ShardHold, ShardLeases, shard_of

# A fence is a write without a transition: logged before and after, so a reader of the history knows.
FENCING = "fencing before advancing (its former holder may have a write in flight): epoch of"
FENCED = "fenced: epoch of"


class Lost(Exception):
    """Our lease epoch is no longer the run's: stop touching the run."""


@dataclass(frozen=True)
class Right:
    """The right to advance one run now: a hold of its shard, and the epoch its commits carry."""

    hold: ShardHold
    epoch: Fencing


class RunOwnership:
    def __init__(self, shards: ShardLeases, identity: str) -> None:
        self.shards = shards
        self.identity = identity
        self._epochs: dict[ObjectKey, Right] = {}  # the epoch chosen per run under our hold
        # One Right per (shard, epoch number) under a hold, shared by its runs (frozen): a run
        # parked under our hold costs an entry in _epochs, not a Right and a Fencing of its own.
        self._shared: dict[tuple[int, int], Right] = {}
        self._written: dict[ObjectKey, ShardHold] = {}  # runs this process wrote under a hold
        self._legacy: dict[ObjectKey, LeaseRecord] = {}  # per-run Leases of an earlier release
        self._looked: dict[ObjectKey, ShardHold] = {}  # runs whose per-run Lease we read, per hold

    def shard(self, key: ObjectKey) -> int:
        return shard_of(key[0], key[1], self.shards.shards)

    def holds(self, key: ObjectKey) -> bool:
        """Whether we hold the run's shard (and are not handing it over)."""
        hold = self.shards.hold(self.shard(key))
        return hold is not None and not hold.draining

    def right(self, key: ObjectKey, recorded: tuple[str, int] | None) -> Right | None:
        """Our right to advance the run: our hold of its shard and the epoch for it, or None when
        we hold no such shard or are handing it over. ``recorded``: the (holder, epoch) the run's
        checkpoint (or, unreadable, its history) carries."""
        hold = self.shards.hold(self.shard(key))
        if hold is None or hold.draining:
            return None
        chosen = self._epochs.get(key)
        if chosen is not None and chosen.hold is hold:
            return chosen
        number = hold.epoch
        if recorded is not None and recorded[1] >= number:
            number = recorded[1] + 1
        right = self._shared.get((hold.shard, number))
        if right is None or right.hold is not hold:
            right = Right(hold, Fencing(holder=self.identity, lease_transitions=number))
            self._shared[(hold.shard, number)] = right
        self._epochs[key] = right
        return right

    async def keep(self, right: Right, margin: float) -> bool:
        """Whether the hold is still valid ``margin`` seconds from now (renewed first if need be)."""
        if right.hold.draining:
            return False
        return right.hold.valid(margin) or await self.shards.renew_now(right.hold)

    def needs_fence(self, key: ObjectKey, right: Right) -> bool:
        return right.hold.taken_from_live_holder and self._written.get(key) is not right.hold

    def wrote(self, key: ObjectKey, right: Right) -> None:
        self._written[key] = right.hold

    def lost(self, key: ObjectKey, right: Right, recorded: Fencing | None) -> bool:
        """Whether someone else committed the run since we did under this hold."""
        return self._written.get(key) is right.hold and recorded is not None and recorded != right.epoch

    def forget(self, key: ObjectKey) -> None:
        self._epochs.pop(key, None)
        self._written.pop(key, None)
        self._looked.pop(key, None)
        self._legacy.pop(key, None)

    def changed(self, change: ShardChange) -> None:
        """A shard acquired or no longer held: what this process wrote under an old hold is moot."""
        if change.reason in ("released", "lost"):
            for key in [k for k, hold in self._written.items() if hold is change.hold]:
                del self._written[key]
            for key in [k for k, right in self._epochs.items() if right.hold is change.hold]:
                del self._epochs[key]
            for shared in [k for k, right in self._shared.items() if right.hold is change.hold]:
                del self._shared[shared]
            for key in [k for k, hold in self._looked.items() if hold is change.hold]:
                del self._looked[key]

    # --- per-run Leases of an earlier release -------------------------------------------------

    def must_look(self, key: ObjectKey, right: Right) -> bool:
        """Whether to read the run's per-run Lease before this unit: once under each hold, and
        again each time while one was seen live (nothing watches them: its holder may have renewed
        it since; the operator may read them only in managed namespaces, never watch them all)."""
        if self._looked.get(key) is right.hold and key not in self._legacy:
            return False
        self._looked[key] = right.hold
        return True

    def note_legacy(self, key: ObjectKey, record: LeaseRecord | None) -> None:
        if record is None:
            self._legacy.pop(key, None)
        else:
            self._legacy[key] = record

    def legacy_until(self, key: ObjectKey, uid: str, now: datetime) -> datetime | None:
        """When a live per-run Lease another process holds on the run expires, or None. Only one
        an earlier release made for this run counts (named, labelled and owned as it made them):
        anyone else's Lease under that name is no claim on the run and is left alone."""
        record = self._legacy.get(key)
        if record is None:
            return None
        if record.holder == self.identity or record.expired(now) or record.foreign_because(key[1], uid):
            del self._legacy[key]  # no claim on the run: not read again under this hold
            return None
        return record.expires_at()
