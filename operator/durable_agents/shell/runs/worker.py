"""The run worker: bounded work under a lease, committed by compare-and-swap.

For one run, one unit of work is:

1. decide from the latest known record whether there is work at all (a parked run has none: it
   gets a wake-up at its expiry and costs nothing else);
2. check that this process holds the shard Lease covering the run
   (:mod:`durable_agents.shell.ownership.rights`), or do nothing; the first time a run is touched
   under a hold taken over from another holder, its checkpoint is stamped with the new epoch (a
   fencing write), so a zombie's commit prepared against the old resourceVersion is refused. A
   live per-run Lease of an earlier release is respected until it expires;
3. do bounded work: ask the engine for the next status, performing what a step needs observed
   (:mod:`durable_agents.shell.runs.observing`) and the model's turns;
4. commit it in ONE status write with the read resourceVersion as precondition
   (:mod:`durable_agents.shell.runs.batches`);
5. on 409, throw the computation away and reload.

An exception in a unit of work is retried a bounded number of times with backoff, then the run is
quarantined ``InternalError`` with a Warning Event (:mod:`durable_agents.shell.runs.internal_errors`).

One task at a time per run (like client-go's workqueue): events meanwhile mark it dirty, done again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents import __version__
from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import (
    NOTHING_OBSERVED,
    Commit,
    Idle,
    NeedModelTurn,
    Observations,
    RunSnapshot,
    Settings,
    decide,
    fence,
)
from durable_agents.core.engine.commits import committed_read
from durable_agents.core.engine.fencing import recorded_epoch, snapshot_epoch
from durable_agents.core.planner import Planner
from durable_agents.core.regions import DEFAULT_REGION
from durable_agents.core.sealing import Keyring
from durable_agents.shell.agent.model_turns import ModelTurns
from durable_agents.shell.agent.resolver import AgentResolver, model_calls_per_boundary
from durable_agents.shell.effects.plugins import load_effects, load_planners
from durable_agents.shell.ground.kube import ImpersonationRefused, Kube, ObjectKey
from durable_agents.shell.ground.lifecycle import Background, forever
from durable_agents.shell.ground.loop_watch import LoopWatch
from durable_agents.shell.ground.memory import keep_memory
from durable_agents.shell.ground.store import Conflict, Gone, RunStore
from durable_agents.shell.ground.workqueue import WorkQueue, cancel_all
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.ledger.actions import ActionStore, FirstClaims
from durable_agents.shell.observability import run_traces
from durable_agents.shell.observability.events import EventRecorder
from durable_agents.shell.observability.reporting import CommitReporter
from durable_agents.shell.ownership.leases import RunLeases
from durable_agents.shell.ownership.regions import RegionElector
from durable_agents.shell.ownership.rights import FENCED, FENCING, Lost, Right, RunOwnership
from durable_agents.shell.ownership.shards import ShardChange, ShardLeases
from durable_agents.shell.runs.batches import Batch, BatchWriter
from durable_agents.shell.runs.children import ChildRuns
from durable_agents.shell.runs.controls import Controls
from durable_agents.shell.runs.definitions import Definitions
from durable_agents.shell.runs.evidence import EvidenceReader
from durable_agents.shell.runs.failures import Failures
from durable_agents.shell.runs.internal_errors import InternalErrors
from durable_agents.shell.runs.observing import Observers, sampled_calls
from durable_agents.shell.runs.policy_wait import PolicyWait
from durable_agents.shell.runs.region_epochs import RegionEpochs
from durable_agents.shell.runs.unmanaged import NamespaceGate

log = logging.getLogger(__name__)


def new_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class WorkerConfig:
    identity: str = field(default_factory=new_identity)
    lease_duration: int = 15
    concurrency: int = 8
    max_transitions_per_unit: int = 16
    region: str = DEFAULT_REGION  # only runs of this home region are advanced here
    lease_namespace: str = "default"  # where the region's shard and member Leases live
    shards: int = 16  # shard Leases of the region: runs are spread over the live replicas by them
    # A dispatcher here: intents created under its first claim (our shard fences the run). None: elsewhere.
    first_claims: FirstClaims | None = field(default=None, repr=False)
    # Recorded in every checkpoint; a run committed by another version passes resume validation.
    operator_version: str = __version__
    all_events: bool = False  # a Kubernetes Event for every transition, not only the notable ones
    keyring: Keyring | None = field(default=None, repr=False)  # None: sealed checkpoints quarantine


TERMINAL = frozenset(s.value for s in RunState if s.terminal)


def _state_version(body: dict[str, Any]) -> int:
    return int((body.get("status") or {}).get("stateVersion") or 0)


class RunWorker(Background):
    def __init__(
        self, kube: Kube, config: WorkerConfig | None = None, policies: PolicyCache | None = None
    ) -> None:
        self.kube = kube
        self.config = config or WorkerConfig()
        self.identity = self.config.identity
        self.store = RunStore(kube)
        self.actions = ActionStore(kube, self.config.keyring)  # stamps its writes, verifies its reads
        self.events = EventRecorder(kube, self.identity)
        self.children = ChildRuns(kube, self.store, self.events, self.config.keyring)
        # Lease writes on connections and threads of their own: a renewal never queues behind run work.
        self.lease_kube = kube.dedicated("leases")
        self.shard_leases = ShardLeases(
            self.lease_kube,
            self.identity,
            self.config.region,
            self.config.lease_namespace,
            shards=self.config.shards,
            duration_seconds=self.config.lease_duration,
            drain=self._drain,
            on_change=self._shard_changed,
            leading=lambda: self.region.leading(),  # the leader is kept live by the region Lease
        )
        self.ownership = RunOwnership(self.shard_leases, self.identity)
        # Region leader election: the holder runs failovers; its epoch is every commit's region epoch.
        self.region = RegionElector(
            self.lease_kube,
            self.identity,
            self.config.region,
            self.config.lease_namespace,
            self.config.lease_duration,
            on_change=lambda _hold: self.shard_leases.poke(),
            on_renewed=self.shard_leases.alive,
        )
        self.legacy_leases = RunLeases(kube, self.identity)  # read only: earlier releases' per-run Leases
        self.reader = EvidenceReader(kube)
        self.reporter = CommitReporter(self.events, all_events=self.config.all_events)
        self.queue = WorkQueue("run-worker", self.process, concurrency=self.config.concurrency)
        self.agents = AgentResolver(kube, self.config.keyring, load_planners())
        self.model_turns = ModelTurns(self.agents.endpoint)
        effect_tiers = {name: effect.tier for name, effect in load_effects().items()}
        self.policies = policies if policies is not None else PolicyCache(kube)  # the manager's
        self.base_settings = Settings(
            tiers=effect_tiers,
            available_effects=frozenset(effect_tiers),
            operator_version=self.config.operator_version,
            keyring=self.config.keyring,
            untimed_stamps_before=datetime.now(UTC),  # runs that waited across the upgrade
        )
        self.known: set[ObjectKey] = set()  # every run seen: those of a shard we take are enqueued
        # Newest state version committed or seen per run: an older watch event would earn a 409.
        self.versions: dict[ObjectKey, int] = {}
        self.failures = Failures()  # exceptions per run and state version: retried, then quarantined
        self.batches = BatchWriter(self.store, self.reporter, self.failures, self.versions, self.policies)
        held = self.shard_leases.hold_for
        self.controls = Controls(kube, self.store, self.events, self.config.keyring, held)  # on-call controls
        self.observers = Observers(self.reader, self.actions, self.children, self.model_turns)
        self.region_epochs = RegionEpochs(self.shard_leases, self.config.region, self.config.keyring)
        parts = (self.failures, self.queue, self.store, self.ownership, self.region_epochs, self.batches)
        self.internal_errors = InternalErrors(*parts, self.events, self.config.keyring)
        wait = (self.policies, self.events, self.store, self.enqueue, self.internal_errors.policy_deleted)
        self.policy_wait = PolicyWait(*wait)  # a run waits for its policy (quarantined if force-deleted)
        self.namespaces = NamespaceGate(kube, self.store, self.events, self.queue.wake_at, self.enqueue)
        self.definitions = Definitions(kube, self.agents, self.events, self.store, self.queue.wake_at)

    # --- intake ---------------------------------------------------------------------------

    def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A watch event for an AgentRun (from the process's AgentRun reflector)."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.versions.pop(key, None)
            self.known.discard(key)
            for part in (self.queue, self.failures, self.ownership, self.agents, self.definitions):
                part.forget(key)
            self.controls.forget(key)
            return
        self.known.add(key)
        self.queue.add(key, body)
        parent = (body.get("spec") or {}).get("parentRef")
        if parent and (body.get("status") or {}).get("state") in TERMINAL:
            self.enqueue((key[0], parent.get("name", "")))  # a child's outcome wakes its parent

    def enqueue(self, key: ObjectKey) -> None:
        self.queue.add(key)

    # --- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        self.queue.start()
        tasks = [asyncio.create_task(keep_memory(self.queue), name="memory-keeper")]
        tasks.append(asyncio.create_task(LoopWatch().run(), name="loop-watch"))
        if self.config.concurrency > 0:  # a webhook- or dispatcher-only process holds no shard
            tasks.append(asyncio.create_task(self.region.start(), name="region-elector-start"))
            tasks.append(asyncio.create_task(self._join(), name="shard-leases-join"))
        try:
            await forever()
        finally:
            await self.queue.stop()
            await self.reporter.flush()  # the Events of the last commits, not lost on a stop
            await cancel_all(tasks)
            if self.shard_leases.task is not None:
                await self.shard_leases.stop()  # its shards go to the other replicas at once
            await self.region.stop()  # released: another replica leads the region at once
            self.lease_kube.close()

    async def _join(self) -> None:
        """Join the region's replicas (member Lease, our share of the shards), retrying on errors."""
        delay = 0.5
        while True:
            try:
                await self.shard_leases.start()
                return
            except ApiException as err:
                region, status, reason = self.config.region, err.status, err.reason
                log.warning("joining region %s failed (%s %s); again in %.1fs", region, status, reason, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.lease_duration / 2)

    def _shard_changed(self, change: ShardChange) -> None:
        self.ownership.changed(change)
        if change.reason in ("acquired", "expired_takeover"):
            for key in [k for k in self.known if self.ownership.shard(k) == change.shard]:
                self.enqueue(key)

    async def _drain(self, shard: int) -> None:
        """A shard being handed over: wait for its units in flight (none start: it is draining)."""
        await self.queue.wait_until(lambda: all(self.ownership.shard(k) != shard for k in self.queue.active))

    # --- one unit of work -----------------------------------------------------------------

    @property
    def _margin(self) -> float:
        """Seconds of validity a hold must still have before a commit (else renew first)."""
        return min(1.0, self.config.lease_duration / 4)

    def settings_for(self, run: RunSnapshot) -> Settings:
        return self.definitions.settings(run, self.policies.settings_for(run, self.base_settings))

    def planner_for(self, run: RunSnapshot) -> Planner:
        return self.agents.planner_for(run)

    async def process(self, key: ObjectKey, body: dict[str, Any] | None) -> None:
        """One unit of work; an exception is retried with backoff, then quarantines the run."""
        try:
            await self._unit(key, body)
        except ImpersonationRefused:  # its namespace opted out meanwhile: left alone, not failed
            self.namespaces.refused(key)
        except Exception as err:
            await self.internal_errors.failed(key, err)
        else:
            self.failures.succeeded(key)

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
        if self.region_of(snap) != self.config.region:
            return  # another region's run: only the deployment owning its region advances it
        right = self.ownership.right(key, recorded_epoch(snap))
        if await self.controls.look(key, body, snap, right is not None):
            self.enqueue(key)  # escalated, asked now or refused: decided again from what is stored
            return
        if right is None:
            return  # another replica's shard (or not yet ours): we are told when we take it
        self.failures.at(key, "decide", snap)
        if not await self.namespaces.ready(key, body, snap):  # else NamespaceNotManaged, left alone
            return
        if not await self.policy_wait.ready(key, body, snap):
            return
        if not await self.definitions.ready(key, body, snap):  # its Agent, ModelConfig are missing
            return
        snap = self.definitions.snapshot(snap)
        settings = self.settings_for(snap)
        await self.agents.prepare(snap, settings)  # a model run's prompt, credential and tools
        now = datetime.now(UTC)
        provisional = right.epoch
        planner = self.planner_for(snap)
        observed = NOTHING_OBSERVED
        decision = decide(snap, now=now, epoch=provisional, planner=planner, settings=settings)
        for _ in range(2):
            # Looking at the ledger and at child runs needs no Lease: only a commit does.
            seen = await self.observers.records(snap, decision, observed)
            if seen is None:
                break
            observed = seen
            decision = decide(
                snap, now=now, epoch=provisional, planner=planner, settings=settings, observed=observed
            )
        if isinstance(decision, Idle):
            self.queue.wake_at(key, decision.wake_at)
            return
        if self.ownership.must_look(key, right):
            self.ownership.note_legacy(key, await self.legacy_leases.get(*key))
        legacy = self.ownership.legacy_until(key, snap.uid, now)
        if legacy is not None:  # an earlier release's worker holds the run: after its Lease
            self._recheck(key, legacy)
            return
        self.failures.at(key, "lease")
        if self._region_epoch(key) is None:
            return
        if not await self.ownership.keep(right, self._margin):
            return  # the shard was taken from us (we were paused): its new holder goes on
        fenced = await self._fenced(key, right, snap, body, settings, now)
        if fenced is None:
            return
        try:
            work = self._advance(key, right, fenced, observed)
            await run_traces.unit(self.identity, self.config.region, snap, right, work)  # its span
        except Lost:
            log.info("epoch of %s/%s moved on; this process stops touching it", *key)
            self.ownership.forget(key)
        except Gone:
            self.ownership.forget(key)

    async def _fenced(
        self,
        key: ObjectKey,
        right: Right,
        snap: RunSnapshot,
        body: dict[str, Any],
        settings: Settings,
        now: datetime,
    ) -> dict[str, Any] | None:
        """The record to advance from: first fenced with our epoch when the shard's former holder
        may be a zombie with a commit in flight. None: not now (a 409, or no region leader)."""
        if not self.ownership.needs_fence(key, right):
            return body
        status = fence(snap, right.epoch, now=now, settings=settings)
        stamped = self._region_stamped(key, status) if status is not None else None
        if status is not None and stamped is None:
            return None  # looked at again once the region has a leader
        if stamped is not None:
            log.info("%s/%s %s %s/%d", *key, FENCING, right.epoch.holder, right.epoch.lease_transitions)
            try:
                body = await self.store.commit_status(body, stamped)
            except Conflict:
                self.enqueue(key)  # reload and decide again
                return None
            log.info("%s/%s %s %s/%d", *key, FENCED, right.epoch.holder, right.epoch.lease_transitions)
        self.ownership.wrote(key, right)
        return body

    # --- region ownership -----------------------------------------------------------------

    def region_of(self, snap: RunSnapshot) -> str:
        """The region that owns the run: its home region, or the one a stamped failover moved it to."""
        return self.region_epochs.owner(snap)

    def _region_epoch(self, key: ObjectKey) -> int | None:
        """The region epoch this process commits the run under, or None (and a look again later)
        when the region has no live leader as last seen: a region without a leader stalls."""
        epoch = self.region_epochs.live_epoch()
        if epoch is None:
            self._recheck(key)
        return epoch

    def _region_stamped(self, key: ObjectKey, status: dict[str, Any]) -> dict[str, Any] | None:
        """``status`` carrying this commit's region epoch (the fencing token one level up), or
        None when the region has no live leader as last seen (not committed: looked at again)."""
        stamped = self.region_epochs.stamped(status)
        if stamped is None:
            log.info("run %s/%s not committed: region %s has no live leader", *key, self.config.region)
            self._recheck(key)
        return stamped

    def _recheck(self, key: ObjectKey, at: datetime | None = None) -> None:
        """Look at the run again at ``at`` (default: the shard Leases' next poll), jittered."""
        at = at or datetime.now(UTC) + timedelta(seconds=self.shard_leases.interval)
        self.queue.wake_at(key, at + timedelta(milliseconds=random.randint(50, 250)))

    async def _advance(
        self, key: ObjectKey, right: Right, body: dict[str, Any], observed: Observations
    ) -> None:
        """Decide transition after transition; write them at semantic boundaries only: intents or
        child runs to create (they exist only once their commit does), a wait or the end, or the
        unit's bound (:mod:`durable_agents.shell.runs.batches`). A crash before the write repeats the
        batch's reads and decisions, never an effect."""
        written = body  # the record as stored: its resourceVersion is the write's precondition
        read, base = body, RunSnapshot.from_object(body)  # a record is validated once (model turns)
        batch: Batch = []
        model_calls = 0  # since the last write: a crash repeats them, so they are bounded
        # Each transition may first need a read or an observation: a few steps each, bounded.
        for _ in range(self.config.max_transitions_per_unit * 3):
            if len(batch) >= self.config.max_transitions_per_unit:
                break
            if body is not read:  # the same record between model turns; the same spec after a commit
                read, base = body, RunSnapshot.from_object(body, prior=base)
            snap = self.definitions.snapshot(base)
            epoch = snapshot_epoch(snap)
            if self.ownership.lost(key, right, epoch):
                raise Lost(f"{key} now at epoch {epoch}")
            now, settings = datetime.now(UTC), self.settings_for(snap)
            self.failures.at(key, "decide", snap)
            planner = self.planner_for(snap)
            decision = decide(
                snap, now=now, epoch=right.epoch, planner=planner, settings=settings, observed=observed
            )
            seen = await self.observers.observe(snap, decision, now, observed, settings)
            if seen is not None:
                observed, model_calls = seen, model_calls + sampled_calls(observed, seen)  # MCP samples
                continue
            if isinstance(decision, NeedModelTurn):
                # Bound on calls a crash would repeat: commit before the one past it (shared write).
                if batch and model_calls >= model_calls_per_boundary(settings):
                    out = await self._write_batch(key, right, written, body, batch)
                    if out is None:
                        self.enqueue(key)
                        return
                    self.failures.at(key, "after commit", snap, batch[-1][1].event.value)
                    written, body, batch, model_calls = out, out, [], 0
                    continue
                observed = replace(observed, model=await self.model_turns.answer(snap, decision))
                model_calls += 1
                continue
            if isinstance(decision, Idle):
                out = await self._write_batch(key, right, written, body, batch) if batch else written
                if out is None:
                    self.enqueue(key)  # 409: the computation is thrown away; decide again
                    return
                self.queue.decided(key, out)  # its echo through the watch is not decided again
                self.queue.wake_at(key, decision.wake_at)
                return
            assert isinstance(decision, Commit)  # every other answer was observed above
            observed = NOTHING_OBSERVED
            batch.append((snap.state, decision, settings.policy))  # checked again right before the write
            read = body = {**body, "status": decision.wire_status()}  # the next decision starts here,
            base = committed_read(body, decision, prior=base)  # from the checkpoint it stamped
            if not (decision.intents or decision.children):
                continue
            out = await self._write_batch(key, right, written, body, batch)
            if out is None:
                self.enqueue(key)
                return
            written, body, batch, model_calls = out, out, [], 0
            self.failures.at(key, "after commit", snap, decision.event.value)
            await self._create(snap, decision)
        if batch:
            await self._write_batch(key, right, written, body, batch)  # on 409, decided again anew
        self.enqueue(key)  # bounded work done; keep the hold and come back

    async def _create(self, snap: RunSnapshot, commit: Commit) -> None:
        """Right after a commit with intents or child runs: the records they stand for."""
        for intent in commit.intents:
            # The dispatcher's record; one that exists already is a suppressed duplicate (counted).
            await self.actions.ensure(snap.namespace, intent, self.config.first_claims)
        for child in commit.children:
            await self.children.create(snap, child)

    async def _write_batch(
        self, key: ObjectKey, right: Right, written: dict[str, Any], body: dict[str, Any], batch: Batch
    ) -> dict[str, Any] | None:
        if not await self.ownership.keep(right, self._margin):
            raise Lost(f"{key}: shard {right.hold.shard} lost before commit")
        stamped = self._region_stamped(key, body["status"])
        if stamped is None:
            return None  # not committed; the caller's next look waits for the region's leader
        out = await self.batches.write(key, written, stamped, batch)
        if out is not None:
            self.ownership.wrote(key, right)
        return out


__all__ = ["GROUP", "VERSION", "RunWorker", "WorkerConfig"]
