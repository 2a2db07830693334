"""What the AgentRun subscribers keep per parked run (issue 38: 100,000 waiting runs on one
replica, operator RSS under 1 GiB). Measured with tracemalloc, relative to the size of the run
itself (never an absolute figure): each run is a real parked AgentRun (``bench/fixtures``),
decoded afresh and dropped after delivery as the reflector does, so whatever a subscriber still
holds afterwards is what it keeps. ``python -m bench.memory_per_run`` reports the same per subscriber.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from tests.unit.builders import KEYRING
from tests.unit.test_notifier_pass import NS as NOTIFY_NS
from tests.unit.test_notifier_pass import notifying_policy, parked

from durable_agents.core import stuck_unowned as unowned
from durable_agents.core.checkpoint import Fencing
from durable_agents.core.regions import DEFAULT_REGION
from durable_agents.shell.ground.memory import keep_memory
from durable_agents.shell.ground.packed import Packed
from durable_agents.shell.ground.workqueue import WorkQueue
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.intake.reflector import lean
from durable_agents.shell.observability.notifications import Notifier
from durable_agents.shell.ownership.rights import RunOwnership
from durable_agents.shell.ownership.shards import ShardChange, ShardHold, ShardLeases
from durable_agents.shell.runs.policy_status import PolicyStatusWriter
from durable_agents.shell.runs.stuck import StuckCheck, StuckConfig
from durable_agents.shell.runs.stuck_view import Kept

FIXTURE = Path(__file__).parents[2] / "bench" / "fixtures" / "parked_run.json"
TEXT = FIXTURE.read_text()
RUNS = 300
# A parked run's JSON as the API server sends it (compact), the unit the bounds are stated in.
BODY_BYTES = len(json.dumps(json.loads(TEXT), separators=(",", ":")))


def body(i: int) -> dict[str, Any]:
    """The i-th parked run, freshly decoded (its own strings), as the reflector delivers it."""
    return lean(json.loads(TEXT.replace("w00000", f"p{i:05d}").replace('"274"', f'"{1000 + i}"')))


def kept_per_run(deliver: Callable[[str | None, dict[str, Any]], None], after: Callable[[], None]) -> float:
    """Bytes still allocated per run once ``RUNS`` runs were delivered and ``after`` ran."""
    deliver(None, body(RUNS + 1))  # warm up: first-use allocations are not per run
    after()
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for i in range(RUNS):
            deliver(None, body(i))
        after()
        gc.collect()
        return (tracemalloc.get_traced_memory()[0] - start) / RUNS
    finally:
        tracemalloc.stop()


def test_the_reflector_delivers_runs_without_their_managed_fields_and_one_namespace_string() -> None:
    raw = json.loads(TEXT)
    assert raw["metadata"]["managedFields"], "the fixture is a run as the API server sends it"
    first, second = body(1), body(2)
    assert "managedFields" not in first["metadata"]
    assert first["metadata"]["namespace"] is second["metadata"]["namespace"], "interned"
    assert len(json.dumps(first)) < 0.6 * len(json.dumps(raw)), "managed fields are half a parked run"
    same = lean(json.loads(TEXT))
    assert {k: v for k, v in raw["metadata"].items() if k != "managedFields"} == same["metadata"]
    assert raw["spec"] == same["spec"], "nothing else changed"
    assert raw["status"] == same["status"], "nothing else changed"


def stuck_check(*, holds: bool, **config: Any) -> StuckCheck:
    """A stuck check with no API behind it (nothing these tests reach calls one)."""
    return StuckCheck(
        None,  # type: ignore[arg-type]
        holds=lambda key: holds,
        region=DEFAULT_REGION,
        keyring=KEYRING,
        policies=PolicyCache(None),  # type: ignore[arg-type]
        events=None,  # type: ignore[arg-type]
        **config,
    )


def test_the_stuck_check_keeps_a_parked_run_packed_and_not_parsed() -> None:
    """A parked run with its own expiry is judged once; then the check keeps its slim copy as one
    packed value and drops the parsed models (before: about three times the run's own size)."""
    stuck = stuck_check(holds=True)
    per_run = kept_per_run(stuck.observe_run, lambda: asyncio.run(stuck.check_once()))
    assert stuck.judged == RUNS + 1, "every run was judged"
    assert len(stuck.settled) == RUNS + 1, "and judged for good: not again until it changes"
    assert not stuck._parsed, "a run judged for good keeps no parsed models"
    assert all(isinstance(kept, Kept) and isinstance(kept.packed, bytes) for kept in stuck.runs.values())
    assert per_run < 0.4 * BODY_BYTES, f"{per_run:.0f} bytes kept per parked run of {BODY_BYTES}"


def test_a_changed_run_is_judged_again_from_its_packed_copy() -> None:
    stuck = stuck_check(holds=True)
    run = body(1)
    stuck.observe_run(None, run)
    asyncio.run(stuck.check_once())
    changed = json.loads(json.dumps(run))
    changed["metadata"]["resourceVersion"] = "99999"
    stuck.observe_run("MODIFIED", changed)
    key = (run["metadata"]["namespace"], run["metadata"]["name"])
    assert stuck.runs[key].version == "99999"
    asyncio.run(stuck.check_once())
    assert stuck.judged == 2
    assert stuck.settled[key] == ("99999", None)
    assert stuck.runs[key].body()["status"]["checkpoint"] == {
        "pendingInput": {"expiresAt": run["status"]["checkpoint"]["pendingInput"]["expiresAt"]},
        "retry": {},
    }
    assert [c["type"] for c in stuck.runs[key].body()["status"]["conditions"]] == [], "only Stuck is kept"


def test_the_notifier_keeps_a_run_due_a_notice_packed() -> None:
    notifier = Notifier(
        None,  # type: ignore[arg-type]
        PolicyCache(None),  # type: ignore[arg-type]
        holds=lambda key: True,
        region=DEFAULT_REGION,
        keyring=KEYRING,
        events=None,  # type: ignore[arg-type]
    )
    per_run = kept_per_run(notifier.observe, lambda: asyncio.run(notifier.pass_once()))
    assert len(notifier.runs) == RUNS + 1, "a run waiting for input is due a notice: kept"
    assert all(isinstance(kept, Packed) for kept in notifier.runs.values())
    assert per_run < 0.25 * BODY_BYTES, f"{per_run:.0f} bytes kept per parked run of {BODY_BYTES}"


def test_the_runs_of_a_shard_share_one_right_under_a_hold() -> None:
    """A run owned and parked keeps an entry in the epochs chosen, not a Right and a Fencing model of
    its own: the runs of a shard at the same epoch share one (frozen), a new hold gets a new one."""

    def hold(epoch: int) -> ShardHold:
        return cast(ShardHold, SimpleNamespace(shard=0, epoch=epoch, draining=False))

    held = {0: hold(3)}
    shards = cast(ShardLeases, SimpleNamespace(shards=1, hold=held.get))
    ownership = RunOwnership(shards, "replica-a")
    first, second = ownership.right(("ns", "a"), None), ownership.right(("ns", "b"), ("old", 1))
    assert first is not None
    assert first is second, "the same shard, hold and epoch: one Right"
    assert first.epoch == Fencing(holder="replica-a", lease_transitions=3)
    ahead = ownership.right(("ns", "c"), ("old", 7))
    assert ahead is not None
    assert ahead.epoch.lease_transitions == 8, "a run recorded at a higher epoch goes one past it"
    assert ownership.right(("ns", "a"), None) is first, "chosen once per run and hold"
    ownership.changed(ShardChange(0, "lost", held[0]))
    held[0] = hold(4)
    again = ownership.right(("ns", "a"), None)
    assert again is not None
    assert again is not first
    assert again.epoch.lease_transitions == 4


def test_a_drained_queue_gives_back_what_its_backlog_grew() -> None:
    """A cold start queues every run at once; once the queue has drained, the worker's memory
    trimmer makes anew the containers that held the backlog (emptied, a set or a dict keeps the
    size it grew to)."""

    async def burst() -> tuple[int, int]:
        async def process(key: Any, body: dict[str, Any] | None) -> None:
            return None

        queue = WorkQueue("lean-test", process, concurrency=2)
        for i in range(RUNS * 10):
            queue.add(("ns", f"r{i}"), {"metadata": {"name": f"r{i}"}})
        queue.start()
        while not queue.idle:  # noqa: ASYNC110  (the queue signals no drain)
            await asyncio.sleep(0.01)

        def size() -> int:
            return sys.getsizeof(queue._queued) + sys.getsizeof(queue._latest)

        grown = size()
        trimmer = asyncio.create_task(keep_memory(queue, every=0.01, units=1))
        for _ in range(200):
            if size() < grown:
                break
            await asyncio.sleep(0.01)
        trimmer.cancel()
        compacted = size()
        await queue.stop()
        return grown, compacted

    grown, compacted = asyncio.run(burst())
    assert grown > 30 * RUNS, "the backlog grew them"
    assert compacted < grown / 100, f"{compacted} bytes left of {grown}"


class LiveOwner:
    """Every run's shard held by a live replica (not this one), as the Lease list says."""

    async def refresh(self, now: datetime, reuse: float = 0.0) -> None:
        return None

    def region(self, region: str, namespace: str, name: str) -> unowned.RegionSeen:
        lease = unowned.LeaseSeen("shard-0", "replica-b", datetime.now(UTC), timedelta(seconds=15))
        return unowned.RegionSeen(region, 1, lease)


def test_the_stuck_check_keeps_another_replicas_runs_unparsed() -> None:
    """The runs a live replica owns are looked at every pass once past the unowned bound: from the
    index (region, first sight), never parsed and kept parsed (before: every such run's models)."""
    stuck = stuck_check(holds=False, config=StuckConfig(lease_namespace="leases", unowned_after=0))
    stuck.leases = LiveOwner()  # type: ignore[assignment]
    per_run = kept_per_run(stuck.observe_run, lambda: asyncio.run(stuck.check_once()))
    assert len(stuck.runs) == RUNS + 1
    assert not stuck._parsed, "owned by a live replica: not parsed"
    assert stuck.judged == 0
    assert per_run < 0.4 * BODY_BYTES, f"{per_run:.0f} bytes kept per parked run of {BODY_BYTES}"


def test_the_notifier_does_not_decode_another_replicas_runs_on_every_pass(monkeypatch: Any) -> None:
    """A run a notifying policy governs on a shard not held here stays due (the shard may come
    here), but its packed copy is decoded again only once the run, the policies or the shard change."""
    held: set[tuple[str, str]] = set()
    policies = PolicyCache(None)  # type: ignore[arg-type]
    notifier = Notifier(
        None,  # type: ignore[arg-type]
        policies,
        holds=lambda key: key in held,
        region=DEFAULT_REGION,
        keyring=KEYRING,
        events=None,  # type: ignore[arg-type]
    )
    policies.observe("ADDED", notifying_policy("notify"))
    for i in range(20):
        notifier.observe("ADDED", parked(f"r{i}", "1", policy="notify"))
    decoded: list[str] = []
    unpack = Packed.body

    def counted(kept: Packed) -> dict[str, Any]:
        body = unpack(kept)
        decoded.append(body["metadata"]["name"])
        return body

    monkeypatch.setattr(Packed, "body", counted)
    asyncio.run(notifier.pass_once())
    assert len(decoded) == 20, "each run looked at once"
    asyncio.run(notifier.pass_once())
    assert len(decoded) == 20, "not held here: still due, not decoded again"
    assert notifier.due == {(NOTIFY_NS, f"r{i}") for i in range(20)}
    held.add((NOTIFY_NS, "r3"))
    notifier.observe("MODIFIED", parked("r4", "2", policy="notify"))
    asyncio.run(notifier.pass_once())
    assert sorted(decoded[20:]) == ["r3", "r4"], "the shard now held, the run changed: looked at"
    assert (NOTIFY_NS, "r3") not in notifier.due, "held: nothing due to it (runEnded only), settled"
    policies.observe("ADDED", notifying_policy("notify", version=2))
    asyncio.run(notifier.pass_once())
    assert len(decoded) == 22 + 20, "the policies changed: every run looked at again"


def test_the_policy_status_writer_shares_one_entry_per_policy_and_bucket() -> None:
    """The writer counts runs per policy and bucket: every run it keeps names one shared value,
    not a tuple and a copy of its policy's name of its own."""
    policies = PolicyCache(None)  # type: ignore[arg-type]
    writer = PolicyStatusWriter(None, asyncio.Event(), governs=policies.governing_key)  # type: ignore[arg-type]
    per_run = kept_per_run(writer.observe_run, lambda: None)
    values = {id(value) for value in writer.governed.values()}
    assert len(writer.governed) == RUNS + 1
    assert len(values) == 1, "one policy, one bucket: one value"
    assert per_run < 0.04 * BODY_BYTES, f"{per_run:.0f} bytes kept per parked run of {BODY_BYTES}"
    policy = next(iter(writer.governed.values()))[0]
    writer.observe_policy("DELETED", {"metadata": {"namespace": policy[0], "name": policy[1]}})
    assert not writer._shared, "a policy gone: its shared values go (its runs keep theirs)"
    assert writer.counts[policy]["running"] == RUNS + 1, "counted as before"


def test_a_queued_run_costs_its_json_alone() -> None:
    """A cold start queues every run with its body (the first read is free): each costs its compact
    JSON, not the encoder's whole output buffer (orjson's is about twice the JSON)."""
    queue = WorkQueue("lean-test", lambda key, body: asyncio.sleep(0), concurrency=1)
    per_run = kept_per_run(
        lambda kind, run: queue.add((run["metadata"]["namespace"], run["metadata"]["name"]), run),
        lambda: None,
    )
    lean_bytes = len(json.dumps(body(0), separators=(",", ":")))
    assert per_run < lean_bytes + 600, f"{per_run:.0f} bytes per queued run of JSON {lean_bytes}"
