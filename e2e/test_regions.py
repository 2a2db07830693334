"""Regions on one control plane: each operator deployment advances only its own region's runs.

Two deployments (two replicas each: separate processes) serve regions ``east`` and ``west``. Each
region's runs are split over that region's shard Leases; a run is advanced only by a replica of
its home region (``spec.region``). With both ``east`` replicas dead, its runs do not move, while
``west`` goes on: there is no automatic cross-region failover.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.shell.ownership.shards import desired_owner, shard_of
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless
from durable_agents_testkit.scrape import free_port, metric, scrape

LEASE = 2
DONE = {"name": "done", "complete": {"result": "ok"}}
ASK = {"name": "confirm", "ask": {"question": "go on?"}}


def spec(region: str) -> dict[str, Any]:
    return {"taskType": "regions", "objective": "stay home", "region": region, "steps": [ASK, DONE]}


def test_each_region_advances_only_its_own_runs_and_a_dead_region_waits(
    start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    east = [start_operator(f"east{i}", LEASE, DURABLE_AGENTS_REGION="east") for i in range(2)]
    west = [start_operator(f"west{i}", LEASE, DURABLE_AGENTS_REGION="west") for i in range(2)]
    names = {
        region: [runs.create(spec(region), f"{region}-{i}") for i in range(6)] for region in ("east", "west")
    }
    for name in names["east"] + names["west"]:
        runs.wait_state(name, "waiting_input", timeout=Within.RUN)
        runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    for region, replicas in (("east", east), ("west", west)):
        identities = {op.identity for op in replicas}
        for name in names[region]:
            done = runs.wait_state(name, "completed", timeout=Within.RUN)
            holders = {h["holder"] for h in assert_history_is_gapless(done)}
            assert holders <= identities, f"{name} ({region}) advanced by {holders - identities}"
    shards = {lease.metadata.name: lease.spec.holder_identity for lease in runs.shard_leases()}
    for region, replicas in (("east", east), ("west", west)):
        mine = {n: h for n, h in shards.items() if n.startswith(f"durable-agents-shard-{region}-")}
        assert len(mine) == 16, mine
        assert set(mine.values()) <= {op.identity for op in replicas}, mine

    # Region east loses both replicas: its runs wait for it; west goes on.
    for op in east:
        op.kill()
    stranded = runs.create(spec("east"), "east-stranded")
    moving = runs.create(spec("west"), "west-moving")
    runs.wait_state(moving, "waiting_input", timeout=Within.RUN)
    # The window itself (not a wait for a condition): twice a shard takeover (lease + a poll), in
    # which west, alive and working, could take east's run if anything let it.
    time.sleep(2 * LEASE + 2)
    assert (runs.get(stranded).get("status") or {}).get("stateVersion", 0) == 0, "nobody outside east took it"
    replacement = start_operator("east-again", LEASE, DURABLE_AGENTS_REGION="east")
    asked = runs.wait_state(stranded, "waiting_input", timeout=Within.RUN)
    assert {h["holder"] for h in asked["status"]["history"]} == {replacement.identity}


def conflicts(port: int) -> float:
    """The operator's refused run commits (409: the run moved since it was read); 0 before any, or
    while its metrics do not answer (a process just resumed from SIGSTOP, on a loaded machine)."""
    name = 'durable_agents_commit_conflicts_total{resource="agentruns"}'
    try:
        text = scrape(port)
    except OSError:
        return 0.0
    return metric(text, name, default=0.0)


def payment(region: str, url: str) -> dict[str, Any]:
    """Asks first (so it waits mid-run), then pays once at the counting server, then completes."""
    return {
        "taskType": "regions",
        "objective": "pay once, whichever region finishes it",
        "region": region,
        "steps": [
            ASK,
            {
                "name": "pay",
                "effect": {
                    "effect": "http.post",
                    "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
                    "arguments": {"amount": 1},
                },
            },
            DONE,
        ],
    }


@pytest.mark.local_plane("webhook")
def test_failover_verifies_adopts_and_the_paused_former_owner_commits_nothing(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    kube: KubeEnv,
    refsystem: ReferenceSystemThread,
) -> None:
    """East loses both replicas, one of them frozen (SIGSTOP) with a commit prepared. Its runs wait
    until `kubectl agentrun region failover east --to west`; west verifies and adopts them and
    completes them, each effect applied once; the frozen east replica, resumed, commits nothing."""
    many = 6
    # The east replica that freezes: its first `many` commits take each run to its question; the
    # next (an answered run's answer + intent) is prepared and then frozen, never sent.
    frozen_port = free_port()
    # Both east identities are chosen first, so that the runs can be named for where rendezvous
    # hashing puts their shards: half stay with the replica to freeze once the other joins (the
    # victim is one of them), half move to the other (left to chance, all six moved now and then).
    frozen_id, other_id = (f"east-{role}-{uuid.uuid4().hex[:6]}" for role in ("frozen", "other"))

    def stays(name: str) -> bool:
        return desired_owner(shard_of(runs.namespace, name, 16), [frozen_id, other_id]) == frozen_id

    candidates = [f"east-pay-{i}" for i in range(200)]
    staying = [n for n in candidates if stays(n)][: many // 2]
    moving = [n for n in candidates if not stays(n)][: many - many // 2]
    assert len(staying) + len(moving) == many, "200 names, and not enough on one side of the hash"
    frozen = start_operator(
        "east-frozen",
        LEASE,
        identity=frozen_id,
        DURABLE_AGENTS_REGION="east",
        DURABLE_AGENTS_TEST_STOP_AT=f"before:{many + 1}",
        DURABLE_AGENTS_METRICS_PORT=str(frozen_port),
    )
    names = [runs.create(payment("east", refsystem.url), name) for name in sorted(staying + moving)]
    for name in names:
        runs.wait_state(name, "waiting_input", timeout=Within.RUN)
    other = start_operator("east-other", LEASE, identity=other_id, DURABLE_AGENTS_REGION="east")
    west = [
        start_operator(
            "west0", LEASE, DURABLE_AGENTS_REGION="west", DURABLE_AGENTS_WEBHOOK_PORT=str(free_port())
        ),
        start_operator("west1", LEASE, DURABLE_AGENTS_REGION="west"),
    ]
    # west0 installs the webhook configurations at start, pointing at its own webhook process,
    # which serves a moment later: until then writes fail closed (connection refused).
    runs.await_webhook(Within.TAKEOVER)

    def holder_of(name: str) -> str | None:
        held = {lease.metadata.name: lease.spec.holder_identity for lease in runs.shard_leases()}
        return held.get(f"durable-agents-shard-east-{shard_of(runs.namespace, name, 16)}")

    def stays_with_frozen(name: str) -> bool:
        # Rendezvous hashing over both replicas gives this run's shard to the one to freeze: it is
        # not handed over to the other while the test answers the run (a shard still held in the
        # middle of a rebalance may be, and then the other replica commits the answer).
        shard = shard_of(runs.namespace, name, 16)
        return desired_owner(shard, [frozen.identity, other.identity]) == frozen.identity

    def split() -> tuple[str] | None:
        # The other replica holds some of east's shards (not necessarily one of these runs'),
        # and the one to freeze still holds one of these runs' shards.
        held = {lease.spec.holder_identity for lease in runs.shard_leases()}
        mine = [n for n in names if holder_of(n) == frozen.identity]
        mine.sort(key=lambda n: not stays_with_frozen(n))  # those that stay first
        return (mine[0],) if mine and other.identity in held else None

    (victim,) = eventually(split, Within.TAKEOVER, "east's shards to be spread over both replicas")
    runs.patch_spec(victim, {"answers": {"confirm": "yes"}})
    eventually(frozen.stopped, Within.COMMIT, "the east replica to freeze with its commit prepared")
    other.kill()
    for name in names:
        if name != victim:
            runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    # The window itself: twice a shard takeover, in which west (alive) could take east's runs if
    # anything let it. Nothing may move: there is no automatic cross-region failover.
    before = {n: runs.get(n)["status"]["stateVersion"] for n in names}
    time.sleep(2 * LEASE + 2)
    assert {n: runs.get(n)["status"]["stateVersion"] for n in names} == before, "east's runs moved"
    assert refsystem.counts() == {}

    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    plugin = [sys.executable, "-m", "durable_agents.kubectl.main"]
    out = subprocess.run(
        [
            *plugin,
            "region",
            "failover",
            "east",
            "--to",
            "west",
            "--reason",
            "east is gone",
            "--wait",
            "--timeout",
            "120",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    failovers = runs.custom.list_cluster_custom_object(GROUP, VERSION, "regionfailovers")["items"]
    (failover,) = [f for f in failovers if f["spec"]["from"] == "east"]
    status = failover["status"]
    assert status["phase"] == "Completed", status
    assert sorted(r["name"] for r in status["adopted"] if r["namespace"] == runs.namespace) == sorted(names)
    assert not status.get("notAdopted"), status

    west_ids = {op.identity for op in west}
    for name in names:
        done = runs.wait_state(name, "completed", timeout=Within.RUN)
        history = assert_history_is_gapless(done)
        ownership = done["status"]["ownership"]
        assert (ownership["region"], ownership["adoptedFrom"]) == ("west", "east")
        assert ownership["failover"] == failover["metadata"]["name"]
        # East took each run to its question; west did all the rest, from the answer on.
        holders = [h["holder"] for h in history]
        first_west = next(i for i, h in enumerate(holders) if h in west_ids)
        assert set(holders[:first_west]) <= {frozen.identity, other.identity}, (name, holders)
        assert set(holders[first_west:]) <= west_ids, (name, holders)
        assert history[first_west - 1]["to"] == "waiting_input", (name, history)
    counts = refsystem.counts()
    assert len(counts) == many, counts
    assert set(counts.values()) == {1}, counts

    # The frozen east replica resumes: its prepared commit is refused (the run moved on), and it
    # does not take the runs back: they are west's now.
    settled = {n: runs.get(n)["metadata"]["resourceVersion"] for n in names}
    frozen.signal(signal.SIGCONT)
    refused = f"commit to {runs.namespace}/{victim} refused (409"
    eventually(
        lambda: frozen.logged(refused) and conflicts(frozen_port) >= 1,
        Within.COMMIT,
        "the resumed east replica's prepared commit to be refused (its log and its metric)",
    )
    time.sleep(2 * LEASE + 2)  # the window in which it could commit, if anything let it
    assert frozen.alive, "the resumed replica runs on"
    assert not frozen.stopped(), "the resumed replica is not frozen again"
    assert {n: runs.get(n)["metadata"]["resourceVersion"] for n in names} == settled
    assert refsystem.counts() == counts
