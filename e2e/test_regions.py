"""Regions on one control plane: each operator deployment advances only its own region's runs.

Two deployments (two replicas each: separate processes) serve regions ``east`` and ``west``. Each
region's runs are split over that region's shard Leases; a run is advanced only by a replica of
its home region (``spec.region``). With both ``east`` replicas dead, its runs do not move, while
``west`` goes on: there is no automatic cross-region failover.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from durable_agents_testkit.eventually import Within
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.runs import Runs, assert_history_is_gapless

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
