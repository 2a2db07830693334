"""Region ownership on a real API server: one owner per region at a time, a prompt handover on a
graceful stop, a takeover from a crashed owner after the Lease duration with the next epoch (the
crashed owner cannot renew afterwards), and a foreign Lease under the region's name left alone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes import client

from durable_agents.core.regions import region_lease_name
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ownership.regions import LEASE_KIND_LABEL, REGION_LABEL, RegionElector, RegionHold
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually_async

DURATION = 2  # seconds: short, so that takeovers after expiry happen within the test's bounds
RETRY = 0.1  # how often a follower looks at the Lease


class Electors:
    """Electors of one test, each with a record of its on_change calls; all stopped at the end."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.all: list[RegionElector] = []
        self.changes: dict[str, list[int | None]] = {}

    def add(self, identity: str, region: str = "r1", duration: int = DURATION) -> RegionElector:
        changes = self.changes.setdefault(identity, [])

        def on_change(hold: RegionHold | None) -> None:
            changes.append(None if hold is None else hold.epoch)

        elector = RegionElector(
            self.kube, identity, region, self.namespace, duration, on_change=on_change, retry_seconds=RETRY
        )
        self.all.append(elector)
        return elector

    async def start(self, *identities: str, region: str = "r1") -> list[RegionElector]:
        electors = [self.add(i, region) for i in identities]
        for e in electors:
            await e.start()
        return electors


@pytest.fixture
async def electors(kube: KubeEnv, namespace: str) -> AsyncIterator[Electors]:
    made = Electors(Kube(kube.api), namespace)
    yield made
    for elector in made.all:
        await elector.stop()


def crash(elector: RegionElector) -> None:
    """A process that dies (or freezes): its election stops, nothing is released."""
    assert elector._task is not None
    elector._task.cancel()


async def sole_leader(electors: list[RegionElector], what: str) -> RegionElector:
    async def one() -> RegionElector | None:
        leaders = [e for e in electors if e.leading() is not None]
        return leaders[0] if len(leaders) == 1 else None

    return await eventually_async(one, Within.COMMIT, what)


def read_lease(kube: KubeEnv, namespace: str, region: str) -> Any:
    return client.CoordinationV1Api(kube.api).read_namespaced_lease(region_lease_name(region), namespace)


class Sampler:
    """Looks at every elector every few milliseconds and notes any moment with two valid owners."""

    def __init__(self, electors: list[RegionElector]) -> None:
        self.electors = electors
        self.samples = 0
        self.overlaps: list[tuple[str, ...]] = []
        self.epochs: list[tuple[str, int]] = []  # (owner, epoch) each time the owner changes
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            holds = [(e.identity, h) for e in self.electors if (h := e.leading()) is not None]
            if len(holds) > 1:
                self.overlaps.append(tuple(i for i, _ in holds))
            if holds and (not self.epochs or self.epochs[-1] != (holds[0][0], holds[0][1].epoch)):
                self.epochs.append((holds[0][0], holds[0][1].epoch))
            self.samples += 1
            await asyncio.sleep(0.005)

    async def saw(self, identity: str) -> None:
        """Wait until a sample caught ``identity`` owning (on a loaded machine the sampling task
        may not run between an owner's election and a test's next step)."""

        async def caught() -> bool:
            return any(owner == identity for owner, _ in self.epochs)

        await eventually_async(caught, Within.COMMIT, f"the sampler to see {identity} own the region")

    async def close(self) -> None:
        self._task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self._task


async def test_one_owner_at_a_time_among_three_electors(
    electors: Electors, kube: KubeEnv, namespace: str
) -> None:
    group = await electors.start("op-1", "op-2", "op-3")
    sampler = Sampler(group)
    try:
        first = await sole_leader(group, "one owner among three electors")
        await sampler.saw(first.identity)
        await first.stop()  # a graceful handover
        second = await sole_leader([e for e in group if e is not first], "an owner after a graceful stop")
        await sampler.saw(second.identity)
        crash(second)  # a takeover after expiry
        third = await sole_leader([e for e in group if e not in (first, second)], "an owner after a crash")
        looked = first.attempts + second.attempts
        await first.start()  # a rejoin: it follows, the owner stays
        await second.start()  # the crashed one comes back: it finds its hold lost and follows

        async def rejoined() -> bool:
            return first.attempts + second.attempts >= looked + 10

        await eventually_async(rejoined, Within.COMMIT, "both rejoined electors to look at the Lease again")
        assert third.leading() is not None, "a rejoining elector displaced the owner"
        assert electors.changes[second.identity][-1] is None, "the crashed owner is told it lost the region"
    finally:
        await sampler.close()
    assert sampler.overlaps == [], f"two valid owners at once: {sampler.overlaps[:5]}"
    assert sampler.samples > 100
    owners = [o for o, _ in sampler.epochs]
    epochs = [e for _, e in sampler.epochs]
    assert owners == [first.identity, second.identity, third.identity], sampler.epochs
    assert epochs == sorted(set(epochs)), f"region epochs must grow with every owner: {sampler.epochs}"
    assert read_lease(kube, namespace, "r1").spec.holder_identity == third.identity


async def test_each_region_has_its_own_owner(electors: Electors, kube: KubeEnv, namespace: str) -> None:
    east = await electors.start("op-e1", "op-e2", region="east")
    west = await electors.start("op-w1", "op-w2", region="west")
    east_owner = await sole_leader(east, "one owner of east")
    west_owner = await sole_leader(west, "one owner of west")
    for region, owner in (("east", east_owner), ("west", west_owner)):
        lease = read_lease(kube, namespace, region)
        assert lease.spec.holder_identity == owner.identity
        assert lease.metadata.labels == {REGION_LABEL: region, LEASE_KIND_LABEL: "region"}
        hold = owner.leading()
        assert hold is not None
        assert (hold.region, hold.epoch) == (region, lease.spec.lease_transitions)
    # Stopping the owner of one region leaves the other's owner and epoch as they were.
    west_hold = west_owner.leading()
    assert west_hold is not None
    await east_owner.stop()
    await sole_leader([e for e in east if e is not east_owner], "the other east elector to own east")
    assert west_owner.leading() is west_hold
    assert await west_owner.renew_now(west_hold)


async def test_a_graceful_stop_hands_over_promptly_with_the_next_epoch(electors: Electors) -> None:
    group = await electors.start("op-1", "op-2", "op-3")
    owner = await sole_leader(group, "one owner")
    hold = owner.leading()
    assert hold is not None
    stopped_at = time.monotonic()
    await owner.stop()
    assert hold.lost
    assert owner.leading() is None
    assert electors.changes[owner.identity] == [hold.epoch, None], "the owner is told it lost the region"
    successor = await sole_leader([e for e in group if e is not owner], "a successor")
    elapsed = time.monotonic() - stopped_at
    new_hold = successor.leading()
    assert new_hold is not None
    assert new_hold.epoch == hold.epoch + 1
    assert new_hold.ownership.fences(hold.ownership)
    assert elapsed < DURATION, f"a released region waited {elapsed:.2f}s, as if it had expired"
    assert electors.changes[successor.identity] == [new_hold.epoch]


async def test_a_crashed_owner_is_replaced_after_the_duration_and_cannot_renew(electors: Electors) -> None:
    group = await electors.start("op-1", "op-2", "op-3")
    owner = await sole_leader(group, "one owner")
    hold = owner.leading()
    assert hold is not None
    crash(owner)
    crashed_at = time.monotonic()
    others = [e for e in group if e is not owner]

    async def successor() -> RegionElector | None:
        leaders = [e for e in others if e.leading() is not None]
        return leaders[0] if leaders else None

    new_owner = await eventually_async(successor, DURATION + 1, "a takeover within the duration + 1 s")
    elapsed = time.monotonic() - crashed_at
    new_hold = new_owner.leading()
    assert new_hold is not None
    assert new_hold.epoch == hold.epoch + 1
    # Its validity was counted from before its last request: it lapsed before anyone could take over.
    assert not hold.valid(), f"the crashed owner still thinks it owns the region after {elapsed:.2f}s"

    # The crashed process resumes: its renewal is refused (the Lease moved on), the hold is lost.
    assert not await owner.renew_now(hold)
    assert hold.lost
    await owner.start()

    async def follows() -> bool:
        return owner.attempts > 0 and owner.leading() is None

    await eventually_async(follows, Within.MOMENT, "the resumed elector to follow")
    assert new_owner.leading() is new_hold
    assert await new_owner.renew_now(new_hold)


@pytest.mark.parametrize(
    "labels",
    [{}, {REGION_LABEL: "r1"}, {REGION_LABEL: "r1", LEASE_KIND_LABEL: "shard"}],
    ids=["no labels", "no kind", "another kind"],
)
async def test_a_foreign_lease_under_the_regions_name_is_never_taken_over(
    electors: Electors, kube: KubeEnv, namespace: str, labels: dict[str, str]
) -> None:
    api = client.CoordinationV1Api(kube.api)
    # Released and long expired: an elector that did not check whose it is would take it at once.
    body = {
        "metadata": {"name": region_lease_name("r1"), "labels": labels},
        "spec": {
            "leaseDurationSeconds": 1,
            "renewTime": "2020-01-01T00:00:00.123456Z",
            "leaseTransitions": 7,
        },
    }
    before = api.create_namespaced_lease(namespace, body)
    (elector,) = await electors.start("op-1")

    async def declined() -> str | None:
        return elector.foreign

    why = await eventually_async(declined, Within.MOMENT, "the elector to notice the Lease is foreign")
    assert "durable-agents.io/" in why
    looked = elector.attempts

    async def looked_again() -> bool:
        return elector.attempts >= looked + 2 * DURATION / RETRY  # past any expiry it could judge

    await eventually_async(looked_again, Within.COMMIT, "the elector to look at the Lease again and again")
    assert elector.leading() is None
    assert electors.changes["op-1"] == []
    after = api.read_namespaced_lease(region_lease_name("r1"), namespace)
    assert after.metadata.resource_version == before.metadata.resource_version, "a foreign Lease was written"

    # Once the foreign Lease is gone, the region gets its own Lease and an owner.
    api.delete_namespaced_lease(region_lease_name("r1"), namespace)
    await sole_leader([elector], "the elector to own the region once the foreign Lease is gone")
    assert elector.foreign is None
    hold = elector.leading()
    assert hold is not None
    assert hold.epoch == 8, "a recreated Lease continues from the highest epoch this elector saw"
