"""What each AgentRun subscriber keeps in memory per parked run (issue 38, item 4).

Every part of the operator that watches AgentRuns subscribes to the one reflector
(:mod:`durable_agents.shell.intake.reflector`) and keeps what it needs of each run. This script
builds each subscriber as the manager wires it (no API server: their intake never calls one),
feeds it ``--runs`` parked runs as a list delivers them (event type None, each body freshly
decoded from JSON and dropped after delivery, as the reflector does), lets the subscriber do what it
does with them on its own (the stuck check's pass, the run worker's unit of work on a run this
replica does not own, the wake-up of a run it owns), and reports the bytes tracemalloc sees still
allocated per run afterwards, per subscriber and for all of them fed together.

The runs are copies of a real one (``bench/fixtures/parked_run.json``: an AgentRun of
``bench.resources``' workload, taken to ``waiting_input`` by an operator on the local control
plane, finalizer and managed fields included), each with its own name, uid, runId and
resourceVersion.

    .venv/bin/python -m bench.memory_per_run --runs 2000 [--owned 500]

``--owned N`` adds the run worker as it is for the runs it owns (a unit of work each needs the API
server: its namespace, policy and definitions are read): N runs parked by an operator process on the
local control plane (``bench.core.environment``), then a worker in this process over them. Its
figures include fixed costs spread over N (the list's pages at the peak): two sizes of N give the
slope per run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes import client

FIXTURE = Path(__file__).parent / "fixtures" / "parked_run.json"

Deliver = Callable[[str | None, dict[str, Any]], None]


def bodies(count: int) -> Iterator[dict[str, Any]]:
    """``count`` parked runs as a list delivers them: each decoded from its own JSON text."""
    template = FIXTURE.read_text()
    base = json.loads(template)
    name, uid = base["metadata"]["name"], base["metadata"]["uid"]
    version = base["metadata"]["resourceVersion"]
    for i in range(count):
        text = template.replace(name, f"p{i:06d}").replace(uid, str(uuid.uuid4()))
        text = text.replace(f'"resourceVersion": "{version}"', f'"resourceVersion": "{1000 + i}"')
        yield delivered(json.loads(text))


def delivered(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the reflector hands it to its subscribers (trimmed first where it does so)."""
    from durable_agents.shell.intake import reflector

    lean = getattr(reflector, "lean", None)
    return lean(body) if lean is not None else body


def keyring() -> Any:
    from durable_agents_testkit.keys import session_keyring

    return session_keyring()


def _kube() -> Any:
    from durable_agents.shell.ground.kube import Kube

    return Kube(client.ApiClient())


def make_worker() -> tuple[Any, Deliver]:
    from durable_agents.shell.intake.policies import PolicyCache
    from durable_agents.shell.runs.worker import RunWorker, WorkerConfig

    kube = _kube()
    worker = RunWorker(kube, WorkerConfig(keyring=keyring()), PolicyCache(kube))
    return worker, worker.observe


def settle_worker(worker: Any, keys: list[tuple[str, str]]) -> None:
    """Each queued run taken through a unit of work as a replica that does not hold its shard
    does (no API request), then left with a wake-up at its expiry, as one that holds it is."""

    async def drain() -> None:
        queue = worker.queue
        while not queue._queue.empty():
            key = queue._queue.get_nowait()
            queue._queued.discard(key)
            raw = queue._latest.pop(key, None)
            await worker.process(key, json.loads(raw) if raw is not None else None)
        at = datetime.now(UTC) + timedelta(hours=72)
        for key in keys:
            queue.wake_at(key, at)

    asyncio.run(drain())


def make_census() -> tuple[Any, Deliver]:
    from durable_agents.core.regions import DEFAULT_REGION
    from durable_agents.shell.observability.census import RunCensus

    census = RunCensus(lambda namespace, name: True, DEFAULT_REGION, keyring())
    return census, census.observe


def make_stuck() -> tuple[Any, Deliver]:
    from durable_agents.core.regions import DEFAULT_REGION
    from durable_agents.shell.intake.policies import PolicyCache
    from durable_agents.shell.runs.stuck import StuckCheck

    stuck = StuckCheck(
        _kube(),
        holds=lambda key: True,
        region=DEFAULT_REGION,
        keyring=keyring(),
        policies=PolicyCache(None),  # type: ignore[arg-type]
        events=None,  # type: ignore[arg-type]
    )
    return stuck, stuck.observe_run


def settle_stuck(stuck: Any, keys: list[tuple[str, str]]) -> None:
    asyncio.run(stuck.check_once())  # every run judged once (for good: parked with an expiry)


def make_notifier() -> tuple[Any, Deliver]:
    from durable_agents.core.regions import DEFAULT_REGION
    from durable_agents.shell.intake.policies import PolicyCache
    from durable_agents.shell.observability.notifications import Notifier

    notifier = Notifier(
        _kube(),
        PolicyCache(None),  # type: ignore[arg-type]
        holds=lambda key: True,
        region=DEFAULT_REGION,
        keyring=keyring(),
        events=None,  # type: ignore[arg-type]
    )
    return notifier, notifier.observe


def settle_notifier(notifier: Any, keys: list[tuple[str, str]]) -> None:
    asyncio.run(notifier.pass_once())  # no policy asks for notices here: each run looked at once


def make_retention() -> tuple[Any, Deliver]:
    from durable_agents.shell.intake.policies import PolicyCache
    from durable_agents.shell.runs.retention import RetentionConfig, RetentionController

    retention = RetentionController(_kube(), keyring(), "bench", RetentionConfig(), PolicyCache(None))  # type: ignore[arg-type]
    return retention, retention.observe


def make_policy_status() -> tuple[Any, Deliver]:
    from durable_agents.shell.intake.policies import PolicyCache
    from durable_agents.shell.runs.policy_status import PolicyStatusWriter

    policies = PolicyCache(None)  # type: ignore[arg-type]
    writer = PolicyStatusWriter(_kube(), asyncio.Event(), governs=policies.governing_key)
    return writer, writer.observe_run


SUBJECTS: dict[str, tuple[Callable[[], tuple[Any, Deliver]], Callable[[Any, list[Any]], None] | None]] = {
    "worker": (make_worker, settle_worker),
    "census": (make_census, None),
    "stuck": (make_stuck, settle_stuck),
    "notifier": (make_notifier, settle_notifier),
    "retention": (make_retention, None),
    "policy_status": (make_policy_status, None),
}


def measure(names: list[str], runs: int) -> dict[str, float]:
    """Bytes still allocated per run once ``names`` (fed together) have taken ``runs`` runs,
    after the list (``listed``) and after their own pass over them (``settled``)."""
    made = [(name, *SUBJECTS[name][0]()) for name in names]
    list(bodies(2))  # warm up: imports, interned strings, caches of the first body
    for _, _, deliver in made:
        for body in bodies(2):
            deliver(None, body)
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    keys = []
    for body in bodies(runs):
        meta = body["metadata"]
        keys.append((meta["namespace"], meta["name"]))
        for _, _, deliver in made:
            deliver(None, body)
        del body
    gc.collect()
    keys_bytes = sum(len(k[1]) + 49 for k in keys)  # the script's own list of keys, roughly
    listed = tracemalloc.get_traced_memory()[0] - start - keys_bytes
    for name, part, _ in made:
        settle = SUBJECTS[name][1]
        if settle is not None:
            settle(part, keys)
    gc.collect()
    settled = tracemalloc.get_traced_memory()[0] - start - keys_bytes
    tracemalloc.stop()
    return {"listed": round(listed / runs), "settled": round(settled / runs)}


def measure_owned(runs: int) -> dict[str, float]:
    """Bytes per run a run worker that owns every run keeps, on a real API server: ``runs`` runs
    parked by an operator process, then a worker in this process (its shards all its own) fed by a
    reflector until every run has its wake-up armed. ``peak``: the most allocated meanwhile (the
    cold start's backlog). Both include the worker's and the client's fixed costs, spread."""
    from bench.core import await_states, create_runs, environment
    from bench.resources import ASK
    from durable_agents_testkit.governance import permissive_default
    from durable_agents_testkit.scrape import free_port

    with environment() as env:
        namespace = env.namespace()
        permissive_default(env.kube.api, namespace)
        create_runs(env, namespace, {f"w{i:05d}": ASK for i in range(runs)})
        parking = env.operator(namespace, "parking", DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
        try:
            await_states(env, namespace, "waiting_input", runs, timeout=1800, interval=1)
        finally:
            parking.stop()
        return asyncio.run(_owned(env.kube.api, namespace, runs))


async def _owned(api: client.ApiClient, namespace: str, runs: int) -> dict[str, float]:
    from durable_agents.shell.ground.kube import Kube

    kube = Kube(api)
    try:
        # A first worker, not measured: its imports and schemas built on first use are not per run.
        await _settle(kube, namespace, runs)
        gc.collect()
        tracemalloc.start()
        start = tracemalloc.get_traced_memory()[0]
        try:
            current, peak = await _settle(kube, namespace, runs, tracemalloc.get_traced_memory)
        finally:
            tracemalloc.stop()
    finally:
        kube.executor.shutdown(wait=False, cancel_futures=True)
    return {"settled": round((current - start) / runs), "peak": round((peak - start) / runs)}


async def _settle(
    kube: Any, namespace: str, runs: int, measure: Callable[[], tuple[int, int]] = lambda: (0, 0)
) -> tuple[int, int]:
    """A worker (fed by its reflector) until every run has its wake-up armed; ``measure`` then."""
    from durable_agents.shell.intake.reflector import RunReflector
    from durable_agents.shell.runs.worker import RunWorker, WorkerConfig

    config = WorkerConfig(lease_namespace=namespace, shards=4, keyring=keyring())
    worker = RunWorker(kube, config)
    intake = RunReflector(kube, worker.observe, namespace=namespace)
    worker.start()
    intake.start()
    try:
        while len(worker.queue.scheduler) < runs or not worker.queue.idle:  # noqa: ASYNC110 (polled)
            await asyncio.sleep(0.5)
        gc.collect()
        return measure()
    finally:
        await intake.stop()
        await worker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--only", nargs="*", default=list(SUBJECTS), choices=list(SUBJECTS))
    parser.add_argument("--out", type=Path, help="write the figures as JSON here too")
    parser.add_argument(
        "--owned", type=int, default=0, help="also this many runs owned by a worker on a local API server"
    )
    args = parser.parse_args(argv)
    body_bytes = len(FIXTURE.read_text().encode())
    rows: dict[str, dict[str, float]] = {}
    for name in args.only:
        rows[name] = measure([name], args.runs)
    if len(args.only) > 1:
        rows["all together"] = measure(args.only, args.runs)
    print(f"{args.runs} parked runs; one run's JSON as listed: {body_bytes} bytes (indented)")
    print(f"{'subscriber':<16}{'listed B/run':>14}{'settled B/run':>15}")
    for name, row in rows.items():
        print(f"{name:<16}{row['listed']:>14,.0f}{row['settled']:>15,.0f}")
    if args.owned:
        owned = measure_owned(args.owned)
        rows["worker, owned"] = owned
        print(
            f"worker owning {args.owned} parked runs (real API server): {owned['settled']:,.0f} B/run kept,"
            f" {owned['peak']:,.0f} B/run at the peak of its cold start"
        )
    if args.out is not None:
        args.out.write_text(json.dumps({"runs": args.runs, "bytes_per_run": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
