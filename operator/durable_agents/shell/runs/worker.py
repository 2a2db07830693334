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
the run is quarantined ``InternalError`` with a Warning Event (:mod:`durable_agents.shell.runs.failures`).

The queue gives each run to one task at a time (like client-go's workqueue); events that arrive
meanwhile mark the run dirty and it is processed once more afterwards.
"""

from __future__ import annotations

import asyncio
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
from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import Fencing, KubernetesEvidenceRef, Loaded, load_checkpoint
from durable_agents.core.engine import (
    ActionObservation,
    ChildObservation,
    Idle,
    ModelAnswer,
    NeedActions,
    NeedChildren,
    NeedEvidence,
    NeedModelTurn,
    NeedRead,
    NeedToolCall,
    ReadResult,
    RunSnapshot,
    Settings,
    decide,
    fence,
)
from durable_agents.core.engine.quarantine import INTERNAL_ERROR, internal_error
from durable_agents.core.planner import Planner
from durable_agents.core.regions import DEFAULT_REGION, owning_region, with_region_epoch
from durable_agents.core.sealing import Keyring
from durable_agents.shell.agent.model_turns import ModelTurns
from durable_agents.shell.agent.resolver import AgentResolver, model_calls_per_boundary
from durable_agents.shell.agent.tool_calls import call_read_tool
from durable_agents.shell.effects.plugins import load_effects, load_planners
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube, ObjectKey
from durable_agents.shell.ground.lifecycle import Background, forever
from durable_agents.shell.ground.memory import release_memory
from durable_agents.shell.ground.store import Conflict, Gone, RunStore
from durable_agents.shell.ground.workqueue import WorkQueue, cancel_all
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.ledger.actions import ActionStore, FirstClaims
from durable_agents.shell.observability import run_traces
from durable_agents.shell.observability.events import EventRecorder
from durable_agents.shell.observability.reporting import CommitReporter
from durable_agents.shell.ownership.leases import RunLeases
from durable_agents.shell.ownership.regions import RegionElector
from durable_agents.shell.ownership.rights import Right, RunOwnership
from durable_agents.shell.ownership.shards import ShardChange, ShardLeases
from durable_agents.shell.runs.batches import Batch, BatchWriter
from durable_agents.shell.runs.children import ChildRuns
from durable_agents.shell.runs.controls import Controls
from durable_agents.shell.runs.evidence import EvidenceReader
from durable_agents.shell.runs.failures import Failures, describe

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
    # With a dispatcher in this process: intents are created under its first claim (the shard we
    # hold fences the run, so the send needs no separate claim write). None: another process sends.
    first_claims: FirstClaims | None = field(default=None, repr=False)
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
    loaded = load_checkpoint(raw) if isinstance(raw, dict) else None
    return loaded.checkpoint.fencing if isinstance(loaded, Loaded) else None


def _recorded(snap: RunSnapshot) -> tuple[str, int] | None:
    """The (holder, epoch) a run last recorded: its checkpoint's, or (unreadable) its history's."""
    epoch = _checkpoint_epoch(snap.raw_checkpoint)
    if epoch is not None:
        return epoch.holder, epoch.lease_transitions
    last = max(
        (h for h in snap.status.history if h.epoch is not None), key=lambda h: h.epoch or 0, default=None
    )
    return (last.holder or "", last.epoch) if last is not None and last.epoch is not None else None


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
        self.shard_leases = ShardLeases(
            kube,
            self.identity,
            self.config.region,
            self.config.lease_namespace,
            shards=self.config.shards,
            duration_seconds=self.config.lease_duration,
            drain=self._drain,
            on_change=self._shard_changed,
        )
        self.ownership = RunOwnership(self.shard_leases, self.identity)
        # Region leader election: the holder runs failovers; its epoch is every commit's region epoch.
        self.region = RegionElector(
            kube,
            self.identity,
            self.config.region,
            self.config.lease_namespace,
            self.config.lease_duration,
            on_change=lambda _hold: self.shard_leases.poke(),
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
        # The newest state version this process committed or saw, per run: a watch event can
        # arrive after our own later commit, and deciding from it would only earn a 409.
        self.versions: dict[ObjectKey, int] = {}
        self.failures = Failures()  # exceptions per run and state version: retried, then quarantined
        self.batches = BatchWriter(self.store, self.reporter, self.failures, self.versions, self.policies)
        held = self.shard_leases.hold_for
        self.controls = Controls(kube, self.store, self.events, self.config.keyring, held)  # on-call controls

    # --- intake ---------------------------------------------------------------------------

    def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A watch event for an AgentRun (from the process's AgentRun reflector)."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.queue.forget(key)
            self.versions.pop(key, None)
            self.known.discard(key)
            self.failures.forget(key)
            self.ownership.forget(key)
            self.agents.forget(key)
            self.controls.forget(key)
            return
        self.known.add(key)
        self.queue.add(key, body)
        parent = (body.get("spec") or {}).get("parentRef")
        if parent and (body.get("status") or {}).get("state") in TERMINAL:
            self.enqueue((key[0], parent.get("name", "")))  # a child's outcome wakes its parent

    def observe_lease(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A watch event for a per-run Lease (an earlier release's): a run it kept waiting may go on."""
        released = self.ownership.observe_legacy(event_type, body)
        if released is not None:
            self.enqueue(released)

    def enqueue(self, key: ObjectKey) -> None:
        self.queue.add(key)

    # --- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        self.queue.start()
        tasks = [asyncio.create_task(self._trim_loop(), name="memory-trimmer")]
        if self.config.concurrency > 0:  # a webhook- or dispatcher-only process holds no shard
            tasks.append(asyncio.create_task(self.region.start(), name="region-elector-start"))
            tasks.append(asyncio.create_task(self._join(), name="shard-leases-join"))
        try:
            await forever()
        finally:
            await self.queue.stop()
            await cancel_all(tasks)
            if self.shard_leases.task is not None:
                await self.shard_leases.stop()  # its shards go to the other replicas at once
            await self.region.stop()  # released: another replica leads the region at once

    async def _trim_loop(self) -> None:
        """After a burst of work has drained, return the memory it freed to the OS."""
        trimmed_at = 0
        while True:
            await asyncio.sleep(5)
            if self.queue.idle and self.queue.processed - trimmed_at >= 100:
                trimmed_at = self.queue.processed
                release_memory()

    async def _join(self) -> None:
        """Join the region's replicas (member Lease, our share of the shards), retrying on errors."""
        delay = 0.5
        while True:
            try:
                await self.shard_leases.start()
                return
            except ApiException as err:
                log.warning(
                    "joining region %s failed (%s %s); again in %.1fs",
                    self.config.region,
                    err.status,
                    err.reason,
                    delay,
                )
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
        return self.policies.settings_for(run, self.base_settings)

    def planner_for(self, run: RunSnapshot) -> Planner:
        return self.agents.planner_for(run)

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
        snap, now = RunSnapshot.from_object(body), datetime.now(UTC)
        right = self.ownership.right(key, _recorded(snap))
        if right is None:  # the run is not (or no longer) ours: its shard's holder looks at it
            self.failures.forget(key)
            return
        epoch = right.epoch
        commit = internal_error(
            snap, now, epoch, where, f"{error} ({attempts} attempts)", keyring=self.config.keyring
        )
        if commit is not None:
            status = commit.wire_status()
            view = self.shard_leases.region_view
            if view is not None and view.live:  # a quarantine is recorded even without a leader
                status["ownership"] = with_region_epoch(
                    status.get("ownership"), self.config.region, view.epoch
                )
            written = await self.batches.write(
                key, body, status, [(snap.state, commit, None)], quarantine=True
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
        right = self.ownership.right(key, _recorded(snap))
        if await self.controls.look(key, body, snap, right is not None):
            self.enqueue(key)  # escalated, asked now or refused: decided again from what is stored
            return
        if right is None:
            return  # another replica's shard (or not yet ours): we are told when we take it
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
            return
        settings = self.settings_for(snap)
        await self.agents.prepare(snap, settings)  # a model run's prompt, credential and tools
        now = datetime.now(UTC)
        provisional = right.epoch
        planner = self.planner_for(snap)
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
            self.queue.wake_at(key, decision.wake_at)
            return
        if self.ownership.must_look(key, right):
            self.ownership.note_legacy(key, await self.legacy_leases.get(*key))
        legacy = self.ownership.legacy_until(key, snap.uid, now)
        if legacy is not None:  # an earlier release's worker holds the run: after its Lease
            self._recheck(key, legacy)
            return
        self.failures.at(key, "lease")
        if self._region_epoch(key, snap) is None:
            return
        if not await self.ownership.keep(right, self._margin):
            return  # the shard was taken from us (we were paused): its new holder goes on
        if self.ownership.needs_fence(key, right):
            # The shard's former holder may be a zombie with a commit in flight: fence the run.
            status = fence(snap, right.epoch, now=now, settings=settings)
            stamped = self._region_stamped(key, status) if status is not None else None
            if status is not None and stamped is None:
                return  # looked at again once the region has a leader
            if stamped is not None:
                try:
                    body = await self.store.commit_status(body, stamped)
                except Conflict:
                    self.enqueue(key)  # reload and decide again
                    return
            self.ownership.wrote(key, right)
        try:
            work = self._advance(key, right, body, actions, children)
            await run_traces.unit(self.identity, self.config.region, snap, right, work)  # its span
        except Lost:
            log.info("epoch of %s/%s moved on; this process stops touching it", *key)
            self.ownership.forget(key)
        except Gone:
            self.ownership.forget(key)

    # --- region ownership -----------------------------------------------------------------

    def region_of(self, snap: RunSnapshot) -> str:
        """The region that owns the run: its home region, or the one a stamped failover moved it to."""
        raw = snap.status.ownership.wire() if snap.status.ownership is not None else None
        return owning_region(snap.spec.region, raw, snap.status.run_id or snap.uid, self.config.keyring)

    def _region_epoch(self, key: ObjectKey, snap: RunSnapshot) -> int | None:
        """The region epoch this process commits the run under, or None (and a look again later)
        when the region has no live leader as last seen: a region without a leader stalls."""
        view = self.shard_leases.region_view
        if view is None or not view.live:
            self._recheck(key, datetime.now(UTC) + timedelta(seconds=self.shard_leases.interval))
            return None
        return view.epoch

    def _region_stamped(self, key: ObjectKey, status: dict[str, Any]) -> dict[str, Any] | None:
        """``status`` carrying this commit's region epoch (the fencing token one level up), or
        None when the region has no live leader as last seen (not committed: looked at again)."""
        view = self.shard_leases.region_view
        if view is None or not view.live:
            log.info("run %s/%s not committed: region %s has no live leader", *key, self.config.region)
            self._recheck(key, datetime.now(UTC) + timedelta(seconds=self.shard_leases.interval))
            return None
        ownership = with_region_epoch(status.get("ownership"), self.config.region, view.epoch)
        return {**status, "ownership": ownership}

    async def _policy_known(self, namespace: str, name: str) -> bool:
        if self.policies.get((namespace, name)) is not None:
            return True
        waited = await self.policies.fetch(namespace, name)
        for run in waited or ():
            self.enqueue(run)
        return waited is not None

    def _recheck(self, key: ObjectKey, at: datetime) -> None:
        jitter = timedelta(milliseconds=random.randint(50, 250))
        self.queue.wake_at(key, at + jitter)

    async def _advance(
        self,
        key: ObjectKey,
        right: Right,
        body: dict[str, Any],
        actions: dict[str, ActionObservation] | None,
        children: dict[str, ChildObservation] | None,
    ) -> None:
        """Decide transition after transition; write them at semantic boundaries only: intents or
        child runs to create (they exist only once their commit does), a wait or the end, or the
        unit's bound (:mod:`durable_agents.shell.runs.batches`). A crash before the write repeats the
        batch's reads and decisions, never an effect."""
        read: ReadResult | None = None
        model: ModelAnswer | None = None
        fresh: dict[str, KubernetesEvidenceRef | None] | None = None
        written = body  # the record as stored: its resourceVersion is the write's precondition
        batch: Batch = []
        model_calls = 0  # since the last write: a crash repeats them, so they are bounded
        # Each transition may first need a read or an observation: a few steps each, bounded.
        for _ in range(self.config.max_transitions_per_unit * 3):
            if len(batch) >= self.config.max_transitions_per_unit:
                break
            snap = RunSnapshot.from_object(body)
            epoch = _checkpoint_epoch(snap.raw_checkpoint)
            if self.ownership.lost(key, right, epoch):
                raise Lost(f"{key} now at epoch {epoch}")
            now, settings = datetime.now(UTC), self.settings_for(snap)
            self.failures.at(key, "decide", snap)
            decision = decide(
                snap,
                now=now,
                epoch=right.epoch,
                planner=self.planner_for(snap),
                settings=settings,
                read=read,
                actions=actions,
                fresh_evidence=fresh,
                children=children,
                model=model,
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
            if isinstance(decision, NeedModelTurn):
                # The bound is on calls a crash would repeat: commit before the call past it, so a
                # wait or an intent the last call led to shares that write instead of its own.
                if batch and model_calls >= model_calls_per_boundary(settings):
                    out = await self._write_batch(key, right, written, body, batch)
                    if out is None:
                        self.enqueue(key)
                        return
                    self.failures.at(key, "after commit", snap, batch[-1][1].event.value)
                    written, body, batch, model_calls = out, out, [], 0
                    continue
                model = await self.model_turns.answer(snap, decision)
                model_calls += 1
                continue
            if isinstance(decision, NeedToolCall):
                read = await call_read_tool(snap, decision)
                continue
            if isinstance(decision, Idle):
                if batch and await self._write_batch(key, right, written, body, batch) is None:
                    self.enqueue(key)  # 409: the computation is thrown away; decide again
                    return
                self.queue.wake_at(key, decision.wake_at)
                return
            read, actions, fresh, children, model = None, None, None, None, None
            batch.append((snap.state, decision, settings.policy))  # checked again right before the write
            body = {**body, "status": decision.wire_status()}  # the next decision starts here
            if not (decision.intents or decision.children):
                continue
            out = await self._write_batch(key, right, written, body, batch)
            if out is None:
                self.enqueue(key)
                return
            written, body, batch, model_calls = out, out, [], 0
            self.failures.at(key, "after commit", snap, decision.event.value)
            for intent in decision.intents:
                # Right after the intent commit: the record the dispatcher works from. If it
                # exists already, the API server says so and the ledger counts a suppressed duplicate.
                await self.actions.ensure(snap.namespace, intent, self.config.first_claims)
            for child in decision.children:
                await self.children.create(snap, child)
        if batch:
            await self._write_batch(key, right, written, body, batch)  # on 409, decided again anew
        self.enqueue(key)  # bounded work done; keep the hold and come back

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
