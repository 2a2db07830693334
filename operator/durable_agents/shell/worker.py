"""The run worker: bounded work under a lease, committed by compare-and-swap.

For one run, one unit of work is:

1. decide from the latest known record whether there is work at all (a parked run has none: it
   gets a wake-up at its expiry and costs nothing else);
2. acquire the run's Lease, or do nothing while another live holder has it; taking over an
   *expired* holder's Lease first stamps the new epoch into the run (a fencing write), so a
   zombie's commit prepared against the old resourceVersion is refused. Only a Lease the operator
   made for the run is ever taken over or deleted: a foreign one under its name leaves the run
   where it is, with a ``LeaseConflict`` condition and Event, until it is gone;
3. do bounded work: ask the engine for the next status, performing the read a step needs;
4. commit it in ONE status write with the read resourceVersion as precondition;
5. on 409, throw the computation away and reload;
6. when the run waits or ends, delete the Lease.

An exception anywhere in a unit of work is retried a bounded number of times with backoff, then
the run is quarantined ``InternalError`` with a Warning Event (:mod:`durable_agents.shell.failures`).

The queue gives each run to one task at a time (like client-go's workqueue); events that arrive
meanwhile mark the run dirty and it is processed once more afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents import __version__
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import Fencing, KubernetesEvidenceRef, Loaded, load_checkpoint
from durable_agents.core.engine import (
    ActionObservation,
    ChildObservation,
    Idle,
    NeedActions,
    NeedChildren,
    NeedEvidence,
    NeedRead,
    ReadResult,
    RunSnapshot,
    Settings,
    decide,
    fence,
)
from durable_agents.core.engine.quarantine import INTERNAL_ERROR, internal_error
from durable_agents.core.planner import Planner
from durable_agents.core.sealing import Keyring
from durable_agents.shell import metrics
from durable_agents.shell.actions import ActionStore
from durable_agents.shell.batches import Batch, BatchWriter
from durable_agents.shell.children import ChildRuns
from durable_agents.shell.events import EventRecorder
from durable_agents.shell.evidence import EvidenceReader
from durable_agents.shell.failures import Failures, describe
from durable_agents.shell.kube import GROUP, VERSION, Kube, ObjectKey
from durable_agents.shell.leases import (
    LEASE_CONFLICT,
    Hold,
    LeaseRecord,
    RunLeases,
    conflict_message,
    conflict_status,
    lease_name,
    run_of_lease,
)
from durable_agents.shell.memory import release_memory
from durable_agents.shell.plugins import load_effects, load_planners
from durable_agents.shell.policies import PolicyCache
from durable_agents.shell.reporting import CommitReporter
from durable_agents.shell.store import Conflict, Gone, RunStore
from durable_agents.shell.workqueue import WorkQueue, cancel_all

log = logging.getLogger(__name__)


def new_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class WorkerConfig:
    identity: str = field(default_factory=new_identity)
    lease_duration: int = 15
    concurrency: int = 8
    max_transitions_per_unit: int = 16
    # Renew when less than this fraction of the lease remains: twice per lease, fewer writes.
    renew_fraction: float = 1 / 2
    # Recorded in every checkpoint; a run committed by another version passes resume validation.
    operator_version: str = __version__
    all_events: bool = False  # a Kubernetes Event for every transition, not only the notable ones
    keyring: Keyring | None = field(default=None, repr=False)  # None: sealed checkpoints quarantine


class Lost(Exception):
    """Our lease epoch is no longer the run's: stop touching the run."""


TERMINAL = frozenset(s.value for s in RunState if s.terminal)


def _state_version(body: dict[str, Any]) -> int:
    return int((body.get("status") or {}).get("stateVersion") or 0)


def _checkpoint_epoch(raw: Any) -> Fencing | None:
    if not isinstance(raw, dict):
        return None
    loaded = load_checkpoint(raw)
    return loaded.checkpoint.fencing if isinstance(loaded, Loaded) else None


class RunWorker:
    def __init__(self, kube: Kube, config: WorkerConfig | None = None) -> None:
        self.kube = kube
        self.config = config or WorkerConfig()
        self.identity = self.config.identity
        self.store = RunStore(kube)
        self.actions = ActionStore(kube)
        self.events = EventRecorder(kube, self.identity)
        self.children = ChildRuns(kube, self.store, self.events, self.config.keyring)
        self.leases = RunLeases(kube, self.identity, self.config.lease_duration)
        self.reader = EvidenceReader(kube)
        self.reporter = CommitReporter(self.events, all_events=self.config.all_events)
        self.queue = WorkQueue("run-worker", self.process, concurrency=self.config.concurrency)
        self.planners: dict[str, Planner] = load_planners()
        effect_tiers = {name: effect.tier for name, effect in load_effects().items()}
        self.policies = PolicyCache(kube)
        self.base_settings = Settings(
            tiers=effect_tiers,
            available_effects=frozenset(effect_tiers),
            operator_version=self.config.operator_version,
            keyring=self.config.keyring,
        )
        self.holds: dict[ObjectKey, Hold] = {}
        # The newest state version this process committed or saw, per run: a watch event can
        # arrive after our own later commit, and deciding from it would only earn a 409.
        self.versions: dict[ObjectKey, int] = {}
        self.leases_seen: dict[ObjectKey, LeaseRecord] = {}
        # Runs kept from advancing by a foreign Lease under their Lease name (its uid, per run).
        self.lease_conflicts: dict[ObjectKey, str] = {}
        self.failures = Failures()  # exceptions per run and state version: retried, then quarantined
        self.batches = BatchWriter(self.store, self.reporter, self.failures, self.versions)
        self._tasks: list[asyncio.Task[None]] = []

    # --- intake ---------------------------------------------------------------------------

    def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A watch event for an AgentRun (from kopf)."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.queue.forget(key)
            self.versions.pop(key, None)
            self.lease_conflicts.pop(key, None)
            self.failures.forget(key)
            hold = self.holds.pop(key, None)
            if hold is not None:
                hold.lost = True
            return
        self.queue.add(key, body)
        parent = (body.get("spec") or {}).get("parentRef")
        if parent and (body.get("status") or {}).get("state") in TERMINAL:
            self.enqueue((key[0], parent.get("name", "")))  # a child's outcome wakes its parent

    def observe_policy(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A watch event for an AgentPolicy: runs that waited for it are looked at again."""
        for run in self.policies.observe(event_type, body):
            self.enqueue(run)

    def observe_lease(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A watch event for a run Lease: lets an idle run's orphaned Lease be reaped."""
        meta = body.get("metadata") or {}
        run = run_of_lease(meta)
        if not run or meta.get("name") != lease_name(run):
            return  # not under the run's Lease name: nothing the worker would take or reap
        key = (meta.get("namespace", ""), run)
        if event_type == "DELETED":
            self.leases_seen.pop(key, None)
            if key in self.lease_conflicts:
                self.enqueue(key)  # the foreign Lease is gone: the run may advance again
            return
        record = LeaseRecord.from_dict(body)
        self.leases_seen[key] = record
        if event_type is None and record.holder != self.identity:
            self.enqueue(key)  # found at start-up: its holder may be gone, look at the run again

    def enqueue(self, key: ObjectKey) -> None:
        self.queue.add(key)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self.queue.start()
        self._tasks.append(asyncio.create_task(self._renew_loop(), name="lease-renewer"))
        self._tasks.append(asyncio.create_task(self._trim_loop(), name="memory-trimmer"))

    async def _trim_loop(self) -> None:
        """After a burst of work has drained, return the memory it freed to the OS."""
        trimmed_at = 0
        while True:
            await asyncio.sleep(5)
            if self.queue.idle and self.queue.processed - trimmed_at >= 100:
                trimmed_at = self.queue.processed
                release_memory()

    async def stop(self) -> None:
        await self.queue.stop()
        await cancel_all(self._tasks)

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(max(0.2, self.config.lease_duration / 15))
            for key, hold in list(self.holds.items()):
                if hold.lost:
                    self.holds.pop(key, None)
                    continue
                if not hold.valid(self.config.lease_duration * self.config.renew_fraction):
                    try:
                        await self.leases.renew(hold)
                    except ApiException:
                        log.warning("renewing the lease of %s/%s failed", *key)

    # --- one unit of work -----------------------------------------------------------------

    @property
    def _margin(self) -> float:
        """Seconds of validity a hold must still have before a commit (else renew first)."""
        return min(1.0, self.config.lease_duration / 4)

    def settings_for(self, run: RunSnapshot) -> Settings:
        return self.policies.settings_for(run, self.base_settings)

    def planner_for(self, run: RunSnapshot) -> Planner:
        kind = run.spec.agent.planner.value if run.spec.agent else "scripted"
        return self.planners[kind]

    async def process(self, key: ObjectKey, body: dict[str, Any] | None) -> None:
        """One unit of work; an exception is retried with backoff, then quarantines the run."""
        try:
            await self._unit(key, body)
        except Exception as err:
            await self._failed(key, err)
        else:
            self.failures.succeeded(key)

    async def _failed(self, key: ObjectKey, err: Exception) -> None:
        verdict = self.failures.failed(key, err)
        metrics.INTERNAL_ERRORS.labels(verdict.where.stage).inc()
        retry_at = datetime.now(UTC) + timedelta(seconds=verdict.delay)
        self.failures.log(key, verdict, err)
        if verdict.quarantine:
            try:
                await self._quarantine(key, verdict.where.describe(), describe(err), verdict.attempts)
                return
            except Exception:  # the quarantine's write failed too: try again later, not in a loop
                log.exception("run %s/%s: quarantining it failed; again in %.0fs", *key, verdict.delay)
        self.queue.wake_at(key, retry_at)

    async def _quarantine(self, key: ObjectKey, where: str, error: str, attempts: int) -> None:
        """Quarantine the run ``InternalError`` (a commit like any other: compare-and-swap, under our
        Lease's epoch if we hold one), with a Warning Event; then leave it until a user acts."""
        try:
            body = await self.store.get(*key)
        except Gone:
            self.failures.forget(key)
            return
        snap, now, hold = RunSnapshot.from_object(body), datetime.now(UTC), self.holds.get(key)
        if hold is None or not hold.valid():
            record = await self.leases.get(*key)
            if record is not None and record.holder not in ("", self.identity) and not record.expired(now):
                # Another live worker holds the run: its view is not ours to quarantine. Look later.
                self.queue.wake_at(key, record.expires_at())
                return
            cp_epoch = _checkpoint_epoch(snap.raw_checkpoint)
            epoch = Fencing(
                holder=self.identity, lease_transitions=cp_epoch.lease_transitions if cp_epoch else 0
            )
        else:
            epoch = hold.epoch
        commit = internal_error(snap, now, epoch, where, f"{error} ({attempts} attempts)")
        if commit is not None:
            written = await self.batches.write(
                key, body, commit.wire_status(), [(snap.state, commit)], quarantine=True
            )
            if written is None:
                raise Conflict(f"{key}: the run moved while it was being quarantined")  # retried
            body = written
            assert commit.status.outcome is not None
            await self.events.record(body, INTERNAL_ERROR, commit.status.outcome.message, warning=True)
        elif snap.state is RunState.QUARANTINED:  # e.g. its retry failed: it stays, and says why
            message = f"the operator failed on this quarantined run at {where}: {error} ({attempts} attempts)"
            await self.events.record(body, INTERNAL_ERROR, message, warning=True)
        self.failures.forget(key)
        await self._release(key)

    async def _unit(self, key: ObjectKey, body: dict[str, Any] | None) -> None:
        self.failures.at(key, "load")
        if body is not None and _state_version(body) < self.versions.get(key, 0):
            body = None  # stale: read the current record instead
        if body is None:
            try:
                body = await self.store.get(*key)
            except Gone:
                self.queue.forget(key)
                return
        self.versions[key] = max(self.versions.get(key, 0), _state_version(body))
        snap = RunSnapshot.from_object(body)
        self.failures.at(key, "decide", snap)
        ref = snap.spec.policy_ref
        if (
            ref is not None
            and not snap.state.terminal
            and not await self._policy_known(snap.namespace, ref.name)
        ):
            if self.policies.wait_for((snap.namespace, ref.name), key):
                log.warning("run %s/%s waits for its AgentPolicy %r to be known", *key, ref.name)
                await self.events.record(
                    body,
                    "PolicyNotFound",
                    f"waiting for AgentPolicy {ref.name!r}: nothing runs without it",
                    warning=True,
                )
                await self.store.note_waiting(body, f"agentpolicy:{ref.name}")
            await self._release(key)
            return
        now = datetime.now(UTC)
        hold = self.holds.get(key)
        provisional = hold.epoch if hold else Fencing(holder=self.identity, lease_transitions=0)
        planner, settings = self.planner_for(snap), self.settings_for(snap)
        actions: dict[str, ActionObservation] | None = None
        children: dict[str, ChildObservation] | None = None
        decision = decide(snap, now=now, epoch=provisional, planner=planner, settings=settings)
        for _ in range(2):
            # Looking at the ledger and at child runs needs no Lease: only a commit does.
            if isinstance(decision, NeedActions):
                actions = await self.actions.observe(snap, decision)
            elif isinstance(decision, NeedChildren):
                children = await self.children.observe(snap, decision)
            else:
                break
            decision = decide(
                snap,
                now=now,
                epoch=provisional,
                planner=planner,
                settings=settings,
                actions=actions,
                children=children,
            )
        if isinstance(decision, Idle):
            if hold is not None:
                self.queue.wake_at(key, decision.wake_at)
                await self._release(key)
            else:
                await self._idle(key, snap, decision.wake_at, now)
            return
        if hold is not None and not hold.valid(self._margin) and not await self.leases.renew(hold):
            self.holds.pop(key, None)
            hold = None
        if hold is None:
            self.failures.at(key, "lease")
            acquired = await self._acquire(key, snap, body)
            if acquired is None:
                return
            hold, body = acquired
        try:
            await self._advance(key, hold, body, actions, children)
        except Lost:
            log.info("lease epoch of %s/%s moved on; dropping our hold", *key)
            hold.lost = True
            self.holds.pop(key, None)
        except Gone:
            await self._release(key)

    async def _policy_known(self, namespace: str, name: str) -> bool:
        if self.policies.get((namespace, name)) is not None:
            return True
        waited = await self.policies.fetch(namespace, name)
        for run in waited or ():
            self.enqueue(run)
        return waited is not None

    async def _acquire(
        self, key: ObjectKey, snap: RunSnapshot, body: dict[str, Any]
    ) -> tuple[Hold, dict[str, Any]] | None:
        now = datetime.now(UTC)
        cp_epoch = _checkpoint_epoch(snap.raw_checkpoint)
        # An unreadable checkpoint still has its history: never restart the epoch below it.
        history_epochs = [h.epoch for h in snap.status.history if h.epoch is not None]
        cp_transitions = cp_epoch.lease_transitions if cp_epoch else max(history_epochs, default=-1)
        # A run between units of work has no Lease (it is deleted on release): when the Lease watch
        # has not seen one, create it straight away. The create is itself a compare-and-swap (409
        # if one exists after all), so a lagging watch costs one more look, never safety.
        record = await self.leases.get(snap.namespace, snap.name) if key in self.leases_seen else None
        if record is None:
            hold = await self.leases.create(snap.namespace, snap.name, snap.uid, cp_transitions + 1)
            if hold is not None:
                self.holds[key] = hold
                self.lease_conflicts.pop(key, None)
                return hold, body
            record = await self.leases.get(snap.namespace, snap.name)
            if record is None:  # created and deleted again meanwhile: look again soon
                self._recheck(key, now + timedelta(seconds=1))
                return None
        why = record.foreign_because(snap.name, snap.uid)
        if why is not None:
            await self._lease_conflict(key, body, record, why, now)
            return None
        self.lease_conflicts.pop(key, None)
        return await self._take_existing(key, snap, body, record, cp_transitions, now)

    async def _lease_conflict(
        self, key: ObjectKey, body: dict[str, Any], record: LeaseRecord, why: str, now: datetime
    ) -> None:
        """A foreign Lease under the run's Lease name: never taken over or deleted. The run does
        not advance, says why (a condition, and an Event once per Lease), and looks again."""
        message = conflict_message(record, why)
        if self.lease_conflicts.get(key) != record.uid:
            self.lease_conflicts[key] = record.uid
            log.warning("run %s/%s does not advance: %s", *key, message)
            await self.events.record(body, LEASE_CONFLICT, message, warning=True)
        else:
            log.info("run %s/%s still waits: the foreign Lease %s is still there", *key, record.name)
        status = conflict_status(body, message, now)
        if status is not None:
            # The record moved (or went): the next look writes it again if it is still needed.
            with contextlib.suppress(Conflict, Gone):
                await self.store.commit_status(body, status)
        # A foreign Lease may carry no run label, so its deletion may never be watched: poll.
        self._recheck(key, now + timedelta(seconds=self.config.lease_duration))

    async def _take_existing(
        self,
        key: ObjectKey,
        snap: RunSnapshot,
        body: dict[str, Any],
        record: LeaseRecord,
        cp_transitions: int,
        now: datetime,
    ) -> tuple[Hold, dict[str, Any]] | None:
        """Take a Lease that exists: ours whose hold lapsed, or an expired or released one."""
        if record.holder == self.identity:
            # Our own Lease whose in-memory hold lapsed: the work queue runs one unit per run at a
            # time, so no step of ours is in flight; keep the epoch unless someone fenced past it.
            transitions = record.transitions if cp_transitions <= record.transitions else cp_transitions + 1
            hold = await self.leases.take_over(record, transitions)
            if hold is None:
                self._recheck(key, now + timedelta(seconds=1))
                return None
        elif not record.expired(now):
            self._recheck(key, record.expires_at())
            return None
        else:
            transitions = max(record.transitions, cp_transitions) + 1
            if not record.released:
                # The holder may be a zombie with a commit in flight: fence the run first.
                epoch = Fencing(holder=self.identity, lease_transitions=transitions)
                status = fence(snap, epoch, now=now, settings=self.settings_for(snap))
                if status is not None:
                    try:
                        body = await self.store.commit_status(body, status)
                    except Conflict:
                        self.enqueue(key)  # reload and decide again
                        return None
            hold = await self.leases.take_over(record, transitions)
            if hold is None:
                self._recheck(key, now + timedelta(seconds=1))
                return None
        self.holds[key] = hold
        return hold, body

    async def _idle(self, key: ObjectKey, snap: RunSnapshot, wake_at: datetime | None, now: datetime) -> None:
        """Park an idle run: a wake-up at its expiry, and no Lease left behind by a dead holder."""
        orphan = self.leases_seen.get(key)
        why = orphan.foreign_because(snap.name, snap.uid) if orphan is not None else None
        if orphan is not None and why is not None:
            log.info("leaving the foreign Lease %s of idle run %s/%s alone: %s", orphan.name, *key, why)
            orphan = None  # not made by the operator for this run: never reaped
        # A Lease is an orphan if a dead holder left it, or if it names us but we hold nothing.
        if orphan is not None and (orphan.holder != self.identity or key not in self.holds):
            if orphan.expired(now) or orphan.holder == self.identity:
                log.info("reaping the expired Lease of idle run %s/%s (holder %s)", *key, orphan.holder)
                await self.leases.delete(orphan)
            else:
                expiry = orphan.expires_at()
                wake_at = expiry if wake_at is None else min(wake_at, expiry)
        self.queue.wake_at(key, wake_at)

    def _recheck(self, key: ObjectKey, at: datetime) -> None:
        jitter = timedelta(milliseconds=random.randint(50, 250))
        self.queue.wake_at(key, at + jitter)

    async def _advance(
        self,
        key: ObjectKey,
        hold: Hold,
        body: dict[str, Any],
        actions: dict[str, ActionObservation] | None,
        children: dict[str, ChildObservation] | None,
    ) -> None:
        """Decide transition after transition; write them at semantic boundaries only: intents or
        child runs to create (they exist only once their commit does), a wait or the end, or the
        unit's bound (:mod:`durable_agents.shell.batches`). A crash before the write repeats the
        batch's reads and decisions, never an effect."""
        read: ReadResult | None = None
        fresh: dict[str, KubernetesEvidenceRef | None] | None = None
        written = body  # the record as stored: its resourceVersion is the write's precondition
        batch: Batch = []
        # Each transition may first need a read or an observation: a few steps each, bounded.
        for _ in range(self.config.max_transitions_per_unit * 3):
            if len(batch) >= self.config.max_transitions_per_unit:
                break
            snap = RunSnapshot.from_object(body)
            epoch = _checkpoint_epoch(snap.raw_checkpoint)
            if (
                epoch is not None
                and epoch != hold.epoch
                and epoch.lease_transitions >= hold.epoch.lease_transitions
            ):
                raise Lost(f"{key} now at epoch {epoch}")
            now = datetime.now(UTC)
            self.failures.at(key, "decide", snap)
            decision = decide(
                snap,
                now=now,
                epoch=hold.epoch,
                planner=self.planner_for(snap),
                settings=self.settings_for(snap),
                read=read,
                actions=actions,
                fresh_evidence=fresh,
                children=children,
            )
            if isinstance(decision, NeedRead):
                read = await self.reader.read(snap, decision, now)
                continue
            if isinstance(decision, NeedActions):
                actions = await self.actions.observe(snap, decision)
                continue
            if isinstance(decision, NeedChildren):
                children = await self.children.observe(snap, decision)
                continue
            if isinstance(decision, NeedEvidence):
                fresh = {ref.id: await self.reader.reread(snap, ref, now) for ref in decision.refs}
                continue
            if isinstance(decision, Idle):
                if batch and await self._write_batch(key, hold, written, body, batch) is None:
                    self.enqueue(key)  # 409: the computation is thrown away; decide again
                    return
                self.queue.wake_at(key, decision.wake_at)
                await self._release(key)
                return
            read, actions, fresh, children = None, None, None, None
            batch.append((snap.state, decision))
            body = {**body, "status": decision.wire_status()}  # the next decision starts here
            if not (decision.intents or decision.children):
                continue
            out = await self._write_batch(key, hold, written, body, batch)
            if out is None:
                self.enqueue(key)
                return
            written, body, batch = out, out, []
            self.failures.at(key, "after commit", snap, decision.event.value)
            for intent in decision.intents:
                # Right after the intent commit: the record the dispatcher works from. If it
                # exists already, the API server says so and the ledger counts a suppressed duplicate.
                await self.actions.ensure(snap.namespace, intent)
            for child in decision.children:
                await self.children.create(snap, child)
        if batch:
            await self._write_batch(key, hold, written, body, batch)  # on 409, decided again anew
        self.enqueue(key)  # bounded work done; keep the hold and come back

    async def _write_batch(
        self, key: ObjectKey, hold: Hold, written: dict[str, Any], body: dict[str, Any], batch: Batch
    ) -> dict[str, Any] | None:
        if not hold.valid(self._margin) and not await self.leases.renew(hold):
            raise Lost(f"{key}: lease lost before commit")
        return await self.batches.write(key, written, body["status"], batch)

    async def _release(self, key: ObjectKey) -> None:
        hold = self.holds.pop(key, None)
        if hold is not None and not hold.lost:
            await self.leases.release(hold)
            self.leases_seen.pop(key, None)  # gone: not an orphan to reap when its watch event lags


__all__ = ["GROUP", "VERSION", "RunWorker", "WorkerConfig"]
