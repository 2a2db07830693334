"""The run worker: bounded work under a lease, committed by compare-and-swap.

For one run, one unit of work is (architecture §5):

1. decide from the latest known record whether there is work at all (a parked run has none: it
   gets a wake-up at its expiry and costs nothing else);
2. acquire the run's Lease, or do nothing while another live holder has it; taking over an
   *expired* holder's Lease first stamps the new epoch into the run (a fencing write), so a
   zombie's commit prepared against the old resourceVersion is refused;
3. do bounded work: ask the engine for the next status, performing the read a step needs;
4. commit it in ONE status write with the read resourceVersion as precondition;
5. on 409, throw the computation away and reload;
6. when the run waits or ends, delete the Lease.

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
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents import __version__
from durable_agents.api.v1alpha1 import ActionRecordStatus, ActionState, AgentPolicySpec
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import Fencing, KubernetesEvidenceRef, Loaded, load_checkpoint
from durable_agents.core.engine import (
    ActionObservation,
    ChildObservation,
    Commit,
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
from durable_agents.core.ledger import check_action_transition
from durable_agents.core.planner import Planner, load_planners
from durable_agents.core.sealing import Keyring
from durable_agents.core.statemachine import RunEvent
from durable_agents.shell import metrics
from durable_agents.shell.actions import ActionStore
from durable_agents.shell.children import ChildRuns
from durable_agents.shell.effects import load_effects
from durable_agents.shell.events import NOTABLE, EventRecorder, reason_of
from durable_agents.shell.evidence import EvidenceReader
from durable_agents.shell.keyring import load_keyring
from durable_agents.shell.kube import GROUP, VERSION, Kube
from durable_agents.shell.leases import RUN_LABEL, Hold, LeaseRecord, RunLeases
from durable_agents.shell.memory import release_memory
from durable_agents.shell.scheduler import Key
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

    @classmethod
    def from_env(cls) -> WorkerConfig:
        env = os.environ
        return cls(
            identity=env.get("DURABLE_AGENTS_IDENTITY") or new_identity(),
            lease_duration=int(env.get("DURABLE_AGENTS_LEASE_DURATION", "15")),
            concurrency=int(env.get("DURABLE_AGENTS_WORKERS", "8")),
            operator_version=env.get("DURABLE_AGENTS_OPERATOR_VERSION") or __version__,
            all_events=env.get("DURABLE_AGENTS_EVENTS", "notable") == "all",
            keyring=load_keyring(env),
        )


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
        self.children = ChildRuns(kube, self.store)
        self.leases = RunLeases(kube, self.identity, self.config.lease_duration)
        self.reader = EvidenceReader(kube)
        self.events = EventRecorder(kube, self.identity)
        self.queue = WorkQueue("run-worker", self.process, concurrency=self.config.concurrency)
        self.planners: dict[str, Planner] = load_planners()
        self.effect_tiers = {name: effect.tier for name, effect in load_effects().items()}
        self.policies: dict[Key, AgentPolicySpec] = {}
        # Runs whose policy this process has not seen yet: decided only once it arrives, never
        # without it (a missing policy must not mean "no approval required").
        self.awaiting_policy: dict[Key, set[Key]] = {}
        self.holds: dict[Key, Hold] = {}
        # The newest state version this process committed or saw, per run: a watch event can
        # arrive after our own later commit, and deciding from it would only earn a 409.
        self.versions: dict[Key, int] = {}
        self.leases_seen: dict[Key, LeaseRecord] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()

    # --- intake ---------------------------------------------------------------------------

    def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A watch event for an AgentRun (from kopf)."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.queue.forget(key)
            self.versions.pop(key, None)
            hold = self.holds.pop(key, None)
            if hold is not None:
                hold.lost = True
            return
        self.queue.add(key, body)
        parent = (body.get("spec") or {}).get("parentRef")
        if parent and (body.get("status") or {}).get("state") in TERMINAL:
            self.enqueue((key[0], parent.get("name", "")))  # a child's outcome wakes its parent

    def observe_policy(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.policies.pop(key, None)
            return
        try:
            self.policies[key] = AgentPolicySpec.model_validate(body.get("spec") or {})
        except ValueError:
            log.warning("ignoring invalid AgentPolicy %s/%s", *key)
            return
        waiting = self.awaiting_policy.pop(key, set())
        log.info(
            "AgentPolicy %s/%s version %s known (%d run(s) waited for it)",
            *key,
            self.policies[key].version,
            len(waiting),
        )
        for run in waiting:
            self.enqueue(run)

    def observe_lease(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A watch event for a run Lease: lets an idle run's orphaned Lease be reaped."""
        meta = body.get("metadata") or {}
        run = (meta.get("labels") or {}).get(RUN_LABEL)
        if not run:
            return
        key = (meta.get("namespace", ""), run)
        if event_type == "DELETED":
            self.leases_seen.pop(key, None)
            return
        record = LeaseRecord.from_dict(body)
        self.leases_seen[key] = record
        if event_type is None and record.holder != self.identity:
            self.enqueue(key)  # found at start-up: its holder may be gone, look at the run again

    async def _fetch_policy(self, namespace: str, name: str) -> bool:
        """Read a policy the watch has not delivered (yet): True if it exists and is now known."""
        try:
            body = await self.kube.call(
                self.kube.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                "agentpolicies",
                name,
            )
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        self.observe_policy("ADDED", body)
        return (namespace, name) in self.policies

    def enqueue(self, key: Key) -> None:
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
        ref = run.spec.policy_ref
        base = Settings(
            tiers=self.effect_tiers,
            available_effects=frozenset(self.effect_tiers),
            operator_version=self.config.operator_version,
            keyring=self.config.keyring,
        )
        if ref is None:
            return base
        policy = self.policies.get((run.namespace, ref.name))
        if policy is None:
            return replace(base, policy_name=ref.name)
        return replace(
            base,
            wait_expiries=policy.wait_expiries,
            policy_name=ref.name,
            policy_version=policy.version,
            tiers={**self.effect_tiers, **policy.tiers},
            policy=policy,
        )

    def planner_for(self, run: RunSnapshot) -> Planner:
        kind = run.spec.agent.planner.value if run.spec.agent else "scripted"
        return self.planners[kind]

    async def process(self, key: Key, body: dict[str, Any] | None) -> None:
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
        ref = snap.spec.policy_ref
        if (
            ref is not None
            and (snap.namespace, ref.name) not in self.policies
            and not snap.state.terminal
            and not await self._fetch_policy(snap.namespace, ref.name)
        ):
            waiting = self.awaiting_policy.setdefault((snap.namespace, ref.name), set())
            if key not in waiting:
                log.warning("run %s/%s waits for its AgentPolicy %r to be known", *key, ref.name)
                await self.events.record(
                    body,
                    "PolicyNotFound",
                    f"waiting for AgentPolicy {ref.name!r}: nothing runs without it",
                    warning=True,
                )
            waiting.add(key)
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
                actions = await self._observe_actions(snap, decision)
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
                await self._idle(key, decision.wake_at, now)
            return
        if hold is not None and not hold.valid(self._margin) and not await self.leases.renew(hold):
            self.holds.pop(key, None)
            hold = None
        if hold is None:
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

    async def _acquire(
        self, key: Key, snap: RunSnapshot, body: dict[str, Any]
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
                return hold, body
            record = await self.leases.get(snap.namespace, snap.name)
            if record is None:  # created and deleted again meanwhile: look again soon
                self._recheck(key, now + timedelta(seconds=1))
                return None
        return await self._take_existing(key, snap, body, record, cp_transitions, now)

    async def _take_existing(
        self,
        key: Key,
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

    async def _idle(self, key: Key, wake_at: datetime | None, now: datetime) -> None:
        """Park an idle run: a wake-up at its expiry, and no Lease left behind by a dead holder."""
        orphan = self.leases_seen.get(key)
        # A Lease is an orphan if a dead holder left it, or if it names us but we hold nothing.
        if orphan is not None and (orphan.holder != self.identity or key not in self.holds):
            if orphan.expired(now) or orphan.holder == self.identity:
                log.info("reaping the expired Lease of idle run %s/%s (holder %s)", *key, orphan.holder)
                await self.leases.delete(orphan)
            else:
                expiry = orphan.expires_at()
                wake_at = expiry if wake_at is None else min(wake_at, expiry)
        self.queue.wake_at(key, wake_at)

    def _recheck(self, key: Key, at: datetime) -> None:
        jitter = timedelta(milliseconds=random.randint(50, 250))
        self.queue.wake_at(key, at + jitter)

    async def _advance(
        self,
        key: Key,
        hold: Hold,
        body: dict[str, Any],
        actions: dict[str, ActionObservation] | None,
        children: dict[str, ChildObservation] | None,
    ) -> None:
        read: ReadResult | None = None
        fresh: dict[str, KubernetesEvidenceRef | None] | None = None
        for _ in range(self.config.max_transitions_per_unit):
            snap = RunSnapshot.from_object(body)
            epoch = _checkpoint_epoch(snap.raw_checkpoint)
            if (
                epoch is not None
                and epoch != hold.epoch
                and epoch.lease_transitions >= hold.epoch.lease_transitions
            ):
                raise Lost(f"{key} now at epoch {epoch}")
            now = datetime.now(UTC)
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
                actions = await self._observe_actions(snap, decision)
                continue
            if isinstance(decision, NeedChildren):
                children = await self.children.observe(snap, decision)
                continue
            if isinstance(decision, NeedEvidence):
                fresh = {ref.id: await self.reader.reread(snap, ref, now) for ref in decision.refs}
                continue
            if isinstance(decision, Idle):
                self.queue.wake_at(key, decision.wake_at)
                await self._release(key)
                return
            if not hold.valid(self._margin) and not await self.leases.renew(hold):
                raise Lost(f"{key}: lease lost before commit")
            try:
                body = await self.store.commit_status(body, decision.wire_status())
            except Conflict:
                log.info("commit to %s/%s refused (409: the record moved); reloading", *key)
                body = await self.store.get(*key)  # discard the computation, reload
                read, actions, fresh, children = None, None, None, None
                continue
            read, actions, fresh, children = None, None, None, None
            self.versions[key] = decision.status.state_version
            self._after_commit(body, snap.state, decision)
            for intent in decision.intents:
                # Right after the intent commit: the record the dispatcher works from. If it
                # exists already, the API server says so and the ledger counts a suppressed duplicate.
                await self.actions.ensure(snap.namespace, intent)
            for child in decision.children:
                await self.children.create(snap, child)
        self.enqueue(key)  # bounded work done; keep the hold and come back

    async def _observe_actions(self, run: RunSnapshot, need: NeedActions) -> dict[str, ActionObservation]:
        """The ledger's word on each pending action; an intent whose record is missing is created."""
        seen: dict[str, ActionObservation] = {}
        for name, spec in need.records.items():
            try:
                record = await self.actions.get(run.namespace, name)
            except Gone:
                if spec is None:
                    log.warning(
                        "run %s/%s waits on a missing action record %s", run.namespace, run.name, name
                    )
                    continue
                record = await self.actions.ensure(run.namespace, spec)
            status = ActionRecordStatus.model_validate(record.get("status") or {})
            if need.cancel and status.state is ActionState.INTENT:
                record, status = await self._cancel_intent(record, status)
            seen[name] = ActionObservation(status.state, status.outcome, status.reason, status.message)
        return seen

    async def _cancel_intent(
        self, record: dict[str, Any], status: ActionRecordStatus
    ) -> tuple[dict[str, Any], ActionRecordStatus]:
        """An undispatched intent is canceled by compare-and-swap; if a dispatcher claimed it first,
        it is dispatched and will be reconciled, never assumed undone."""
        meta = record["metadata"]
        check_action_transition(status.state, ActionState.CANCELED)  # the ledger's one table
        canceled = status.model_copy(
            update={
                "state": ActionState.CANCELED,
                "reason": "RunCanceled",
                "message": "canceled before dispatch",
                "finished_at": datetime.now(UTC),
            }
        )
        try:
            record = await self.actions.commit_status(record, canceled.wire())
        except Conflict:
            record = await self.actions.get(meta["namespace"], meta["name"])
        status = ActionRecordStatus.model_validate(record.get("status") or {})
        log.info("action %s/%s: %s before dispatch", meta["namespace"], meta["name"], status.state.value)
        return record, status

    def _after_commit(self, body: dict[str, Any], before: RunState, commit: Commit) -> None:
        metrics.TRANSITIONS.labels(commit.event.value).inc()
        status = commit.status
        if status.state.terminal:
            reason = status.outcome.reason if status.outcome else status.state.value
            metrics.TERMINAL_OUTCOMES.labels(status.state.value, reason).inc()
        if status.state is RunState.QUARANTINED and status.outcome:
            metrics.QUARANTINES.labels(status.outcome.reason).inc()
        if commit.migrated_from is not None:
            metrics.CHECKPOINT_MIGRATIONS.labels(str(commit.migrated_from)).inc()
        if (
            commit.event is RunEvent.CANCEL_REQUESTED
            and status.cancellation
            and status.cancellation.requested_at
        ):
            waited = (datetime.now(UTC) - status.cancellation.requested_at).total_seconds()
            metrics.CANCELLATION_LATENCY.observe(max(0.0, waited))
        policy = ""
        parent_ref = (body.get("spec") or {}).get("parentRef")
        parent = f" parent={parent_ref.get('uid')}" if parent_ref else ""
        cp = commit.checkpoint or {}
        if isinstance(cp.get("policy"), dict):
            policy = f" policy={cp['policy'].get('name')}@{cp['policy'].get('version', '')}"
        message = (
            f"task={body['metadata']['uid']} stateVersion={status.state_version} "
            f"{before.value} -> {status.state.value} attempt={(cp.get('retry') or {}).get('attempts', 0)}"
            f"{policy}{parent}" + (f": {commit.detail}" if commit.detail else "")
        )
        log.info(
            "%s/%s %s: %s",
            body["metadata"]["namespace"],
            body["metadata"]["name"],
            commit.event.value,
            message,
        )
        if not self.config.all_events and commit.event.value not in NOTABLE:
            return
        warning = status.state in (RunState.FAILED, RunState.QUARANTINED, RunState.EXPIRED)
        task = asyncio.create_task(
            self.events.record(body, reason_of(commit.event.value), message, warning=warning)
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, key: Key) -> None:
        hold = self.holds.pop(key, None)
        if hold is not None and not hold.lost:
            await self.leases.release(hold)
            self.leases_seen.pop(key, None)  # gone: not an orphan to reap when its watch event lags


__all__ = ["GROUP", "VERSION", "RunWorker", "WorkerConfig"]
