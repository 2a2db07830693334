"""The run loop in the test's own event loop, against the real API server: the run worker
(shell/runs/worker.py) with its work queue and wake scheduler (shell/ground/workqueue.py,
scheduler.py) and the dispatcher (shell/ledger/dispatcher.py), built with their public
constructors and fed by reflectors as the operator's manager and ActionRecord handler feed them.

The e2e suites exercise the same parts through operator processes; here a test can look inside
them (the queue's keys in flight, the scheduler's wake-ups) and cut their intake. The queue alone:
tests/integration/test_workqueue_inprocess.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.ledger import TERMINAL_ACTION_STATES, action_record_name, idempotency_key
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.intake.reflector import RunReflector
from durable_agents.shell.ledger.actions import FirstClaims
from durable_agents.shell.ledger.dispatch_config import DispatcherConfig
from durable_agents.shell.ledger.dispatcher import Dispatcher
from durable_agents.shell.runs.worker import RunWorker, WorkerConfig
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually_async
from durable_agents_testkit.governance import permissive_default
from durable_agents_testkit.keys import session_keyring
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless

TERMINAL_RECORD = frozenset(s.value for s in TERMINAL_ACTION_STATES)
PAYMENTS = 6  # runs whose intents two dispatchers race for
EXPIRES_IN = 10  # seconds a parked run's question waits: room to park and cut the intake first


@dataclass
class InProcess:
    """One operator's run loop, in this event loop (with, for a race, more dispatchers)."""

    kube: Kube
    worker: RunWorker
    dispatchers: list[Dispatcher]
    run_intake: RunReflector
    record_intake: RunReflector

    @property
    def dispatcher(self) -> Dispatcher:
        """The dispatcher of the worker's own process."""
        return self.dispatchers[0]


@contextlib.asynccontextmanager
async def run_loop(
    kube: KubeEnv, namespace: str, *, dispatchers: int = 1, first_claim: bool = True
) -> AsyncIterator[InProcess]:
    """A worker and ``dispatchers`` dispatchers fed by an AgentRun and an ActionRecord reflector, as
    the manager and the ActionRecord handler feed them. ``first_claim``: the operator's default
    wiring, intents created under the first dispatcher's first claim; without it every intent is
    claimed by compare-and-swap, by whichever dispatcher wins."""
    api = Kube(kube.api)
    identity = f"in-process-{uuid.uuid4().hex[:6]}"
    keyring = session_keyring()  # the test kit stamps its runs with it, as the webhook would
    dispatching = DispatcherConfig(identity=identity, keyring=keyring)
    first_claims = FirstClaims(identity, dispatching.claim_ttl) if first_claim else None
    senders = [Dispatcher(api, replace(dispatching, first_claims=first_claims))]
    senders += [
        Dispatcher(api, replace(dispatching, identity=f"{identity}-rival{i}")) for i in range(1, dispatchers)
    ]
    worker = RunWorker(
        api,
        WorkerConfig(
            identity=identity,
            lease_duration=4,
            concurrency=4,
            lease_namespace=namespace,  # this test's region: its own shard Leases
            shards=2,
            keyring=keyring,
            first_claims=first_claims,
        ),
    )

    def observe_run(event_type: str | None, body: dict[str, Any]) -> None:
        worker.observe(event_type, body)
        for sender in senders:
            sender.observe_run(event_type, body)

    def observe_record(event_type: str | None, body: dict[str, Any]) -> None:
        # As controllers/durable_agents_controllers/actionrecord.py: the dispatchers take every
        # change; a record's outcome wakes its run.
        for sender in senders:
            sender.observe(event_type, body)
        if ((body.get("status") or {}).get("state")) in TERMINAL_RECORD:
            run = ((body.get("spec") or {}).get("runRef") or {}).get("name")
            if run:
                worker.enqueue((namespace, run))

    worker.start()
    for sender in senders:
        sender.start()
    runs_in = RunReflector(api, observe_run, namespace=namespace)
    records_in = RunReflector(api, observe_record, namespace=namespace, plural="actionrecords")
    runs_in.start()
    records_in.start()
    try:
        yield InProcess(api, worker, senders, runs_in, records_in)
    finally:
        await runs_in.stop()
        await records_in.stop()
        for sender in senders:
            await sender.stop()
        await worker.stop()
        api.executor.shutdown(wait=False, cancel_futures=True)  # the session's ApiClient stays open


@pytest.fixture
async def operator_loop(kube: KubeEnv, namespace: str) -> AsyncIterator[InProcess]:
    # Runs are governed by default: the namespace's default asks for no approval (as before).
    await asyncio.to_thread(permissive_default, kube.api, namespace)
    async with run_loop(kube, namespace) as loop:
        yield loop


async def state_of(runs: Runs, name: str, *states: str) -> dict[str, Any] | None:
    """The run once it is in one of ``states`` (read off this event loop: the loop runs the worker)."""
    run = await asyncio.to_thread(runs.get, name)
    return run if (run.get("status") or {}).get("state") in states else None


def payment(url: str) -> dict[str, Any]:
    return {
        "taskType": "payment",
        "objective": "pay once",
        "steps": [
            {
                "name": "pay",
                "effect": {
                    "effect": "http.post",
                    "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
                    "arguments": {"amount": 10},
                },
            },
            {"name": "done", "complete": {"result": "paid"}},
        ],
    }


async def test_a_run_advances_to_completed_with_its_effect_applied_once(
    kube: KubeEnv, namespace: str, operator_loop: InProcess
) -> None:
    runs = Runs(kube, namespace)
    with ReferenceSystemThread() as system:
        name = await asyncio.to_thread(runs.create, payment(system.url))
        done = await eventually_async(
            lambda: state_of(runs, name, "completed", "failed"), Within.RUN, f"run {name} to end"
        )
        assert done["status"]["state"] == "completed", done["status"]
        key = idempotency_key(done["metadata"]["uid"], 0, "pay")
        assert system.counts() == {key: 1}, "the effect was applied exactly once, under its key"
        assert system.duplicates() == []
    history = assert_history_is_gapless(done)
    assert {h["holder"] for h in history} == {operator_loop.worker.identity}, "committed by this worker only"
    record = kube.custom().get_namespaced_custom_object(
        GROUP, VERSION, namespace, "actionrecords", action_record_name(key)
    )
    assert record["status"]["state"] == "succeeded"
    assert operator_loop.dispatcher.queue.processed >= 1, "the record went through this dispatcher"


async def test_a_parked_run_is_woken_by_the_scheduler_at_its_expiry_with_its_intake_cut(
    kube: KubeEnv, namespace: str, operator_loop: InProcess
) -> None:
    """The run waits for an answer that never comes: it holds no task, only a wake-up in the
    scheduler. Once it is parked, no watch event reaches the worker any more (its reflector is
    stopped): only the scheduler can make it expire, and it does so at its expiry, not before."""
    runs = Runs(kube, namespace)
    question = {"name": "confirm", "ask": {"question": "anyone there?", "expiresIn": f"{EXPIRES_IN}s"}}
    spec = {"taskType": "parked", "objective": "ask", "steps": [question, {"name": "done", "complete": {}}]}
    name = await asyncio.to_thread(runs.create, spec)
    parked = await eventually_async(
        lambda: state_of(runs, name, "waiting_input"), Within.COMMIT, f"run {name} to park"
    )
    worker = operator_loop.worker

    async def scheduled() -> bool:
        return len(worker.queue.scheduler) == 1 and worker.queue.idle

    await eventually_async(scheduled, Within.COMMIT, "the parked run's wake-up, and an idle queue")
    await operator_loop.run_intake.stop()
    still = await asyncio.to_thread(runs.get, name)
    assert still["status"]["state"] == "waiting_input", "it ended before its intake was cut: who woke it?"
    asked = next(h for h in parked["status"]["history"] if h["event"] == "input_requested")
    due = datetime.fromisoformat(asked["at"]).timestamp() + EXPIRES_IN
    expired = await eventually_async(
        lambda: state_of(runs, name, "expired"), EXPIRES_IN + Within.COMMIT, f"run {name} to expire"
    )
    expiry = next(h for h in expired["status"]["history"] if h["event"] == "wait_expired")
    assert datetime.fromisoformat(expiry["at"]).timestamp() >= due, "woken before its expiry"
    assert expired["status"]["outcome"]["reason"] == "InputExpired"
    assert len(worker.queue.scheduler) == 0, "the wake-up was used"


async def test_two_dispatchers_racing_for_the_same_intents_send_each_once(
    kube: KubeEnv, namespace: str
) -> None:
    """Two dispatchers (two processes' worth) get every record event at the same moment, and no
    intent is under a first claim: both try to claim each intent, by compare-and-swap. Each is sent
    by the one that won, once."""
    runs = Runs(kube, namespace)
    await asyncio.to_thread(permissive_default, kube.api, namespace)  # governed, no approvals
    async with run_loop(kube, namespace, dispatchers=2, first_claim=False) as loop:
        with ReferenceSystemThread() as system:
            names = [await asyncio.to_thread(runs.create, payment(system.url)) for _ in range(PAYMENTS)]

            async def ended() -> list[dict[str, Any]] | None:
                found = [await state_of(runs, name, "completed", "failed") for name in names]
                return [run for run in found if run is not None] if all(found) else None

            done = await eventually_async(ended, Within.RUN, f"{PAYMENTS} runs to end")
            assert [run["status"]["state"] for run in done] == ["completed"] * PAYMENTS
            keys = {idempotency_key(run["metadata"]["uid"], 0, "pay") for run in done}
            assert system.counts() == dict.fromkeys(keys, 1), "each intent sent once, by one dispatcher"
            assert system.duplicates() == []
        assert all(sender.queue.processed >= PAYMENTS for sender in loop.dispatchers), "both saw every record"
    records = kube.custom().list_namespaced_custom_object(GROUP, VERSION, namespace, "actionrecords")["items"]
    assert sorted(r["spec"]["idempotencyKey"] for r in records) == sorted(keys)
    assert {r["status"]["state"] for r in records} == {"succeeded"}
    claimers = {r["status"].get("claimedBy") for r in records}
    assert claimers <= {sender.config.identity for sender in loop.dispatchers}, claimers


async def test_a_parked_runs_own_write_is_not_decided_again_and_an_answer_still_moves_it(
    kube: KubeEnv, namespace: str, operator_loop: InProcess
) -> None:
    """The worker parks the run (a status write) and decides it waits; the watch then brings that
    write back. The queue skips it: the worker already decided from exactly that record
    (WorkQueue.decided, shell/ground/workqueue.py). The person's answer is another write: decided."""
    runs = Runs(kube, namespace)
    worker = operator_loop.worker
    skipped = metrics.OWN_WRITES_SKIPPED.labels(worker.queue.name)
    before = skipped._value.get()
    question = {"name": "confirm", "ask": {"question": "go on?", "expiresIn": "10m"}}
    spec = {"taskType": "parked", "objective": "ask", "steps": [question, {"name": "done", "complete": {}}]}
    name = await asyncio.to_thread(runs.create, spec)
    parked = await eventually_async(
        lambda: state_of(runs, name, "waiting_input"), Within.COMMIT, f"run {name} to park"
    )

    async def echo_skipped() -> bool:
        return skipped._value.get() >= before + 1 and worker.queue.idle

    await eventually_async(echo_skipped, Within.COMMIT, "the parking write's echo skipped, the queue idle")
    assert worker.queue.decided_pending == 0, "the entry was taken by its echo"
    processed = worker.queue.processed
    await asyncio.to_thread(runs.patch_spec, name, {"answers": {"confirm": "yes"}})
    done = await eventually_async(
        lambda: state_of(runs, name, "completed"), Within.COMMIT, f"run {name} to end"
    )
    assert worker.queue.processed > processed, "the answer was decided by a unit of work"
    assert done["status"]["stateVersion"] > parked["status"]["stateVersion"]
