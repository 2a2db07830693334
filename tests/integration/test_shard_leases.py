"""Shard Leases on a real API server: replicas of one region split its shards, hand them over on
a join or a graceful stop, take them over from a crashed holder after expiry, never both hold a
shard validly at once, and leave a foreign Lease under a shard name alone."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import datetime

import pytest
from kubernetes import client
from prometheus_client import REGISTRY

from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ground.workqueue import cancel_all
from durable_agents.shell.ownership.shards import (
    KIND_LABEL,
    REGION_LABEL,
    SHARD_LABEL,
    ShardChange,
    ShardLeases,
    assignment,
    member_lease_name,
    shard_lease_name,
)
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually_async

REGION = "r1"
SHARDS = 8
ALL = set(range(SHARDS))
# Fixed identities, so the rendezvous split is known: op-1/op-2 split 4/4, op-1/2/3 split 2/3/3.
A, B, C = "op-1", "op-2", "op-3"


class Replicas:
    """The replicas of one test (one process, one event loop, one client): each its own
    ShardLeases; those still running at the end are cancelled as a crash would leave them."""

    def __init__(self, kube: KubeEnv, namespace: str) -> None:
        self.kube = Kube(kube.api)
        self.namespace = namespace
        self.all: list[ShardLeases] = []

    def new(self, identity: str, duration: int) -> ShardLeases:
        replica = ShardLeases(
            self.kube, identity, REGION, self.namespace, shards=SHARDS, duration_seconds=duration
        )
        self.all.append(replica)
        return replica

    def writes(self) -> Counter[str]:
        return sum((r.writes for r in self.all), Counter())


@pytest.fixture
async def replicas(kube: KubeEnv, namespace: str) -> AsyncIterator[Replicas]:
    group = Replicas(kube, namespace)
    yield group
    for replica in group.all:
        await cancel_all(replica.tasks)
    group.kube.executor.shutdown(wait=False)


async def until(predicate: Callable[[], object], within: float, what: str) -> None:
    async def check() -> object:
        return predicate()

    await eventually_async(check, within, what)


def split_as_assigned(*live: ShardLeases) -> bool:
    """Each live replica holds exactly the shards rendezvous hashing gives it, and nothing else."""
    owners = assignment(SHARDS, [r.identity for r in live])
    return all(set(r.held()) == {i for i, o in owners.items() if o == r.identity} for r in live)


def changes(reason: str) -> float:
    return (
        REGISTRY.get_sample_value("durable_agents_shard_ownership_changes_total", {"reason": reason}) or 0.0
    )


def lease(kube: KubeEnv, namespace: str, name: str) -> client.V1Lease:
    return client.CoordinationV1Api(kube.api).read_namespaced_lease(name, namespace)


class Sampler:
    """Every ~10 ms, from each replica's own view: which replicas hold each shard validly."""

    def __init__(self, replicas: list[ShardLeases]) -> None:
        self.replicas = replicas
        self.samples = 0
        self.overlaps: list[tuple[int, list[str]]] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            for i in range(SHARDS):
                valid = [r.identity for r in self.replicas if (h := r.hold(i)) is not None and h.valid()]
                if len(valid) > 1:
                    self.overlaps.append((i, valid))
            self.samples += 1
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        await cancel_all([self.task])


async def test_one_replica_holds_every_shard_at_epoch_one(
    kube: KubeEnv, namespace: str, replicas: Replicas
) -> None:
    acquired = changes("acquired")
    a = replicas.new(A, duration=3)
    await a.start()
    await until(lambda: set(a.held()) == ALL, Within.MOMENT, "op-1 to hold all 8 shards")
    assert {i: h.epoch for i, h in a.held().items()} == dict.fromkeys(ALL, 1)
    assert not any(h.taken_from_live_holder for h in a.held().values())
    assert changes("acquired") - acquired == SHARDS
    stored = lease(kube, namespace, shard_lease_name(REGION, 5))
    assert stored.metadata.labels == {REGION_LABEL: REGION, KIND_LABEL: "shard", SHARD_LABEL: "5"}
    assert (stored.spec.holder_identity, stored.spec.lease_transitions) == (A, 1)
    member = lease(kube, namespace, member_lease_name(REGION, A))
    assert member.metadata.labels == {REGION_LABEL: REGION, KIND_LABEL: "member"}
    assert a.writes["create"] == SHARDS + 1  # the member Lease and 8 shard Leases

    await a.stop()
    assert a.held() == {}
    assert lease(kube, namespace, shard_lease_name(REGION, 5)).spec.holder_identity in ("", None)
    with pytest.raises(client.ApiException) as gone:
        lease(kube, namespace, member_lease_name(REGION, A))
    assert gone.value.status == 404


async def test_a_joining_replica_takes_only_its_share_handed_over_without_overlap(
    replicas: Replicas,
) -> None:
    a, b = replicas.new(A, duration=3), replicas.new(B, duration=3)
    await a.start()
    await until(lambda: set(a.held()) == ALL, Within.MOMENT, "op-1 to hold all 8 shards")
    kept = {i: h for i, h in a.held().items()}
    sampler = Sampler([a, b])
    before, released = replicas.writes(), changes("released")
    started = time.monotonic()
    await b.start()
    await until(lambda: split_as_assigned(a, b), Within.COMMIT, "op-1 and op-2 to split the shards")
    elapsed = time.monotonic() - started
    writes = replicas.writes() - before
    await sampler.stop()

    moved = set(b.held())
    assert moved == {i for i, o in assignment(SHARDS, [A, B]).items() if o == B}
    assert set(a.held()) | moved == ALL
    assert not set(a.held()) & moved
    # A kept the rest under the same hold and epoch: nothing moved that did not have to.
    assert all(a.held()[i] is kept[i] and kept[i].epoch == 1 for i in a.held())
    assert all(h.epoch == 2 and not h.taken_from_live_holder for h in b.held().values())
    assert changes("released") - released == len(moved)
    assert sampler.overlaps == [], f"a shard had two valid holders: {sampler.overlaps[:5]}"
    assert sampler.samples > 10
    print(
        f"\nrebalance 1->2: {len(moved)}/{SHARDS} shards moved in {elapsed:.2f}s,"
        f" writes {dict(writes)} (total {writes.total()}), {sampler.samples} samples"
    )


async def test_a_replica_that_stops_gracefully_hands_its_shards_over_before_they_expire(
    kube: KubeEnv, namespace: str, replicas: Replicas
) -> None:
    duration = 4
    a, b = replicas.new(A, duration=duration), replicas.new(B, duration=duration)
    await a.start()
    await b.start()
    await until(lambda: split_as_assigned(a, b), Within.COMMIT, "op-1 and op-2 to split the shards")
    theirs = set(b.held())
    started = time.monotonic()
    await b.stop()
    await until(lambda: set(a.held()) == ALL, Within.COMMIT, "op-1 to take op-2's shards")
    elapsed = time.monotonic() - started
    # Released, not expired: taken without waiting for expiry and without fencing.
    assert not any(a.held()[i].taken_from_live_holder for i in theirs)
    assert elapsed < duration / 2, f"took {elapsed:.2f}s, a release should be seen within a poll"
    with pytest.raises(client.ApiException) as gone:
        lease(kube, namespace, member_lease_name(REGION, B))
    assert gone.value.status == 404
    print(f"\ngraceful stop: {len(theirs)} shards taken over {elapsed:.2f}s after stop() began")


async def test_a_crashed_replicas_shards_are_taken_after_expiry_and_fenced(
    kube: KubeEnv, namespace: str, replicas: Replicas
) -> None:
    duration = 3
    seen_at_takeover: dict[int, bool] = {}
    a = replicas.new(A, duration=duration)
    b = replicas.new(B, duration=duration)

    def on_change(change: ShardChange) -> None:
        if change.reason == "expired_takeover":
            old = b.hold(change.shard)
            seen_at_takeover[change.shard] = old is not None and old.valid()

    a.on_change = on_change
    await a.start()
    await b.start()
    await until(lambda: split_as_assigned(a, b), Within.COMMIT, "op-1 and op-2 to split the shards")
    epochs = {i: h.epoch for i, h in b.held().items()}

    await cancel_all(b.tasks)  # a crash: nothing released, the member Lease left behind
    # A shard hold lasts as long as its holder is live: the takeover is timed from op-2's last
    # liveness write (its member Lease), not from when it took a shard (possibly a poll later).
    last_write = lease(kube, namespace, member_lease_name(REGION, B)).spec.renew_time
    await until(lambda: set(a.held()) == ALL, Within.TAKEOVER, "op-1 to take the crashed op-2's shards")

    for i, epoch in epochs.items():
        hold = a.held()[i]
        assert hold.taken_from_live_holder
        assert hold.epoch == epoch + 1
        assert isinstance(hold.record.acquire_time, datetime)
        late = (hold.record.acquire_time - last_write).total_seconds()
        assert duration <= late <= duration + 1, f"shard {i} taken {late:.2f}s after op-2's last write"
    assert seen_at_takeover == dict.fromkeys(epochs, False), "taken while op-2 still held it validly"
    lag = max((a.held()[i].record.acquire_time - last_write).total_seconds() for i in epochs)
    print(f"\ncrash: {len(epochs)} shards taken over at most {lag:.2f}s after op-2's last write")


async def test_a_paused_holder_cannot_renew_after_the_takeover(replicas: Replicas) -> None:
    a, b = replicas.new(A, duration=2), replicas.new(B, duration=2)
    await a.start()
    await until(lambda: set(a.held()) == ALL, Within.MOMENT, "op-1 to hold all 8 shards")
    zombie = a.held()
    await cancel_all(a.tasks)  # paused: no renewal from now on, holds kept in memory
    await b.start()
    await until(lambda: set(b.held()) == ALL, Within.TAKEOVER, "op-2 to take the paused op-1's shards")
    assert all(h.taken_from_live_holder and h.epoch == 2 for h in b.held().values())
    assert not any(h.valid() for h in zombie.values())
    refused = await asyncio.gather(*(a.renew_now(h) for h in zombie.values()))
    assert refused == [False] * SHARDS
    assert all(h.lost for h in zombie.values())
    assert a.held() == {}
    assert all(await asyncio.gather(*(b.renew_now(h) for h in b.held().values())))


async def test_scaling_one_to_three_to_one_never_has_two_valid_holders(replicas: Replicas) -> None:
    duration = 3
    a, b, c = (replicas.new(name, duration=duration) for name in (A, B, C))
    live = [a]
    sampler = Sampler(live)
    await a.start()
    await until(lambda: set(a.held()) == ALL, Within.MOMENT, "op-1 to hold all 8 shards")
    before = replicas.writes()
    started = time.monotonic()
    live += [b, c]
    await asyncio.gather(b.start(), c.start())
    await until(lambda: split_as_assigned(a, b, c), Within.COMMIT, "three replicas to split the shards")
    up = replicas.writes() - before
    up_seconds = time.monotonic() - started

    before = replicas.writes()
    started = time.monotonic()
    await b.stop()  # one leaves gracefully ...
    await cancel_all(c.tasks)  # ... one crashes
    await until(lambda: set(a.held()) == ALL, Within.TAKEOVER, "op-1 to hold all 8 shards again")
    down = replicas.writes() - before
    down_seconds = time.monotonic() - started
    await sampler.stop()

    assert sampler.overlaps == [], f"a shard had two valid holders: {sampler.overlaps[:5]}"
    assert sampler.samples > 50
    print(
        f"\nscale 1->3: {dict(up)} in {up_seconds:.2f}s; 3->1 (one stop, one crash): {dict(down)}"
        f" in {down_seconds:.2f}s; {sampler.samples} samples, no overlap"
    )


async def test_a_foreign_lease_under_a_shard_name_is_never_touched(
    kube: KubeEnv, namespace: str, replicas: Replicas, caplog: pytest.LogCaptureFixture
) -> None:
    api = client.CoordinationV1Api(kube.api)
    expired = {
        "holderIdentity": "someone-else",
        "leaseDurationSeconds": 1,
        "renewTime": "2020-01-01T00:00:00.123456Z",
    }
    unlabelled = {"metadata": {"name": shard_lease_name(REGION, 3)}, "spec": expired}
    half_labelled = {
        "metadata": {"name": shard_lease_name(REGION, 5), "labels": {REGION_LABEL: REGION}},
        "spec": expired,
    }
    foreign = {
        3: api.create_namespaced_lease(namespace, unlabelled),
        5: api.create_namespaced_lease(namespace, half_labelled),
    }

    caplog.set_level(logging.WARNING, logger="durable_agents.shell.ownership.shards")
    a = replicas.new(A, duration=2)
    await a.start()
    await until(lambda: set(a.held()) == ALL - {3, 5}, Within.MOMENT, "op-1 to hold every shard but 3 and 5")
    assert a.foreign == {i: lease.metadata.uid for i, lease in foreign.items()}
    # Two more renewal rounds with the foreign Leases in the way (and looked at on every poll).
    patches = a.writes["patch"]
    await until(lambda: a.writes["patch"] >= patches + 2 * 7, Within.COMMIT, "two renewal rounds")
    await a.stop()

    for i, created in foreign.items():
        now = lease(kube, namespace, shard_lease_name(REGION, i))
        assert now.metadata.resource_version == created.metadata.resource_version
        assert now.spec.holder_identity == "someone-else"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for i in foreign:
        assert sum(shard_lease_name(REGION, i) in w for w in warnings) == 1, warnings
