"""A replica keeps its region and its shards while its run work's connections are all busy.

Parking 100,000 runs on one replica once delayed its region Lease's renewal past the Lease: the
renewal waited in the same thread pool as run work and a burst of Event posts. The run worker's
Leases now go through connections and threads of their own (``Kube.dedicated``). Here the worker
(built as the operator builds it, on a real API server) holds its region and shards; then its run
pool is filled with real, slow API requests (watches that the server ends after a few seconds),
queued longer than the Lease lasts; through that window the region and both shards stay held, at
the same epoch, and the Leases keep being renewed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from kubernetes import client

from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.runs.worker import RunWorker, WorkerConfig
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually_async
from durable_agents_testkit.keys import session_keyring

LEASE = 4  # seconds: renewed every 2 s, 2 s of margin for a loaded machine
WATCH_SECONDS = 3  # how long one slow request holds a thread of the run pool
WINDOW = 2 * LEASE  # seconds watched while the pool is full (its queue: 4 x 3 s deep)


def slow_request(core: client.CoreV1Api, namespace: str) -> None:
    """A watch that sees nothing until the API server ends it: a thread busy for WATCH_SECONDS."""
    response: Any = core.list_namespaced_config_map(
        namespace,
        watch=True,
        timeout_seconds=WATCH_SECONDS,
        label_selector="durable-agents.test/none=none",
        _preload_content=False,
    )
    try:
        response.read()
    finally:
        response.release_conn()


async def test_a_replica_keeps_its_region_and_shards_while_its_run_pool_is_full(
    kube: KubeEnv, namespace: str
) -> None:
    api = Kube(kube.api)
    worker = RunWorker(
        api,
        WorkerConfig(
            identity=f"loaded-{uuid.uuid4().hex[:6]}",
            lease_duration=LEASE,
            concurrency=1,
            lease_namespace=namespace,
            shards=2,
            keyring=session_keyring(),
        ),
    )
    worker.start()
    busy: list[asyncio.Future[Any]] = []
    try:

        async def holds_all() -> bool:
            return worker.region.leading() is not None and len(worker.shard_leases.held()) == 2

        await eventually_async(holds_all, Within.TAKEOVER, "the replica holds its region and both shards")
        epoch = worker.region.leading().epoch  # type: ignore[union-attr]
        writes_before = worker.region.lock.writes.total()

        # Every thread of the run pool busy, and a queue longer than the Lease lasts behind them.
        threads = api.executor._max_workers
        busy = [
            asyncio.ensure_future(api.call(slow_request, api.core, namespace)) for _ in range(4 * threads)
        ]
        began = time.monotonic()
        lapses: list[str] = []
        while time.monotonic() - began < WINDOW:
            hold = worker.region.leading()
            if hold is None or hold.epoch != epoch:
                lapses.append(f"{time.monotonic() - began:.1f}s: region {hold}")
            if len(worker.shard_leases.held()) != 2:
                lapses.append(f"{time.monotonic() - began:.1f}s: shards {sorted(worker.shard_leases.held())}")
            await asyncio.sleep(0.1)
        # The pool stayed full through the window (else this proved nothing).
        finished = sum(f.done() for f in busy)
        assert finished <= len(busy) - threads, f"the run pool emptied early: {finished} of {len(busy)} done"
        assert not lapses, f"ownership lapsed while the run pool was full: {lapses[:5]}"
        renewals = worker.region.lock.writes.total() - writes_before
        assert renewals >= WINDOW / LEASE, f"the region Lease was renewed {renewals} times in {WINDOW} s"
    finally:
        for request in busy:
            request.cancel()
        await worker.stop()
        api.executor.shutdown(wait=False, cancel_futures=True)  # the session's ApiClient stays open
