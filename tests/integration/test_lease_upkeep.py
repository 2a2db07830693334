"""Lease upkeep on a real API server, with replicas wired as the worker wires them (a region
elector beside the shard Leases, the elector's writes keeping the leader live): an idle replica
writes one Lease per half duration and never a shard Lease, and a leader whose region Lease stops
being renewed stays live by its member Lease without losing a shard."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from kubernetes import client

from durable_agents.core.regions import region_lease_name
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ground.workqueue import cancel_all
from durable_agents.shell.ownership.regions import RegionElector
from durable_agents.shell.ownership.shards import ShardLeases, assignment, member_lease_name, shard_lease_name
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually_async

REGION = "r1"
SHARDS = 8
A, B = "op-1", "op-2"


@dataclass
class Replica:
    identity: str
    shards: ShardLeases
    elector: RegionElector

    def writes(self) -> int:
        return (self.shards.writes + self.elector.lock.writes).total()

    def leads(self) -> bool:
        return self.elector.leading() is not None


class Replicas:
    def __init__(self, kube: KubeEnv, namespace: str) -> None:
        self.kube = Kube(kube.api)
        self.namespace = namespace
        self.all: list[Replica] = []

    async def start(self, identity: str, duration: int) -> Replica:
        replica: Replica
        shards = ShardLeases(
            self.kube,
            identity,
            REGION,
            self.namespace,
            shards=SHARDS,
            duration_seconds=duration,
            leading=lambda: replica.elector.leading(),
        )
        elector = RegionElector(
            self.kube,
            identity,
            REGION,
            self.namespace,
            duration,
            on_change=lambda _hold: shards.poke(),
            on_renewed=shards.alive,
        )
        replica = Replica(identity, shards, elector)
        self.all.append(replica)
        await elector.start()
        await shards.start()
        return replica


@pytest.fixture
async def replicas(kube: KubeEnv, namespace: str) -> AsyncIterator[Replicas]:
    group = Replicas(kube, namespace)
    yield group
    for replica in group.all:
        await cancel_all([*replica.shards.tasks, *([replica.elector._task] if replica.elector._task else [])])
    group.kube.executor.shutdown(wait=False)


async def until(predicate: object, within: float, what: str) -> None:
    async def check() -> object:
        return predicate()  # type: ignore[operator]

    await eventually_async(check, within, what)


def split(*live: Replica) -> bool:
    owners = assignment(SHARDS, [r.identity for r in live])
    return all(set(r.shards.held()) == {i for i, o in owners.items() if o == r.identity} for r in live)


def versions(kube: KubeEnv, namespace: str) -> dict[str, str]:
    leases = client.CoordinationV1Api(kube.api).list_namespaced_lease(namespace).items
    return {lease.metadata.name: lease.metadata.resource_version for lease in leases}


async def test_an_idle_replica_writes_one_lease_per_half_duration_and_no_shard_lease(
    kube: KubeEnv, namespace: str, replicas: Replicas
) -> None:
    duration = 2
    a = await replicas.start(A, duration)
    b = await replicas.start(B, duration)
    await until(lambda: split(a, b) and (a.leads() or b.leads()), Within.COMMIT, "a leader and the split")
    leader, follower = (a, b) if a.leads() else (b, a)
    epochs = {r.identity: {i: h.epoch for i, h in r.shards.held().items()} for r in (a, b)}
    before = {r.identity: r.writes() for r in (a, b)}
    stored = versions(kube, namespace)
    window = 4 * duration  # eight half durations: measured, not awaited
    await asyncio.sleep(window)
    after = versions(kube, namespace)
    written = {r.identity: r.writes() - before[r.identity] for r in (a, b)}

    for i in range(SHARDS):
        name = shard_lease_name(REGION, i)
        assert after[name] == stored[name], f"shard Lease {name} written while idle"
    # The leader is kept live by the region Lease alone: its member Lease is not written.
    member = member_lease_name(REGION, leader.identity)
    assert after[member] == stored[member], "the leader wrote its member Lease while leading"
    assert after[region_lease_name(REGION)] != stored[region_lease_name(REGION)]
    assert (
        after[member_lease_name(REGION, follower.identity)]
        != stored[member_lease_name(REGION, follower.identity)]
    )
    rounds = window / (duration / 2)
    for identity, count in written.items():
        assert 1 <= count <= rounds + 1, (
            f"{identity}: {count} Lease writes in {window}s ({rounds:.0f} rounds)"
        )
    # Nothing changed hands and every hold is still valid.
    assert {r.identity: {i: h.epoch for i, h in r.shards.held().items()} for r in (a, b)} == epochs
    assert all(h.valid() for r in (a, b) for h in r.shards.held().values())
    per_minute = {k: round(v * 60 / window * duration / 15, 1) for k, v in written.items()}
    print(f"\nidle upkeep over {window}s at a {duration}s Lease: {written}; at 15 s: {per_minute} a minute")


async def test_a_leader_whose_region_lease_lapses_stays_live_by_its_member_lease(
    replicas: Replicas,
) -> None:
    duration = 2
    a = await replicas.start(A, duration)
    await until(
        lambda: a.leads() and len(a.shards.held()) == SHARDS, Within.COMMIT, "op-1 to lead and hold all"
    )
    held = dict(a.shards.held())
    member_writes = a.shards.writes.total()
    # The elector stops (as if stuck): no more region renewals, nothing released.
    task = a.elector._task
    assert task is not None
    await cancel_all([task])
    stuck_at = time.monotonic()
    lapses = 0
    while time.monotonic() - stuck_at < 2 * duration:  # sampled over two durations
        lapses += sum(not h.valid() for h in held.values())
        await asyncio.sleep(0.02)
    assert a.shards.writes.total() > member_writes, "op-1 never wrote its member Lease"
    assert a.elector.leading() is None
    # Still every shard, under the same holds and epochs, valid throughout.
    assert lapses == 0
    assert a.shards.held() == held
    assert all(h.valid() and not h.lost for h in held.values())
