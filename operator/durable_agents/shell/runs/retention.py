"""The retention controller: finished runs deleted on time, deleted runs settled and recorded first.

The rules are the core's (:mod:`durable_agents.core.retention`); this module does the I/O:

- a subscriber of the process's one AgentRun list-then-watch
  (:class:`~durable_agents.shell.intake.reflector.RunReflector`, the manager's) whose delivery
  only filters and enqueues (the hot path stays cheap): a parked run without the
  finalizer (waiting, quarantined or finished: no worker commits then, so the patch never makes a
  worker's commit conflict), a run being deleted, a finished top-level run;
- a few worker coroutines (``workers``; never two on one run): the finalizer is added from the
  event's metadata alone (its resourceVersion the precondition); everything else from a fresh read:
  for a deleted live run stamps a task-scope cancellation (the engine cancels it and reconciles
  its in-flight actions); for a deleted run that is settled writes the AgentRunRecord, deletes the
  run's ActionRecords (they carry no ownerReference) and removes the finalizer; for a finished
  run whose TTL has passed deletes its children and then the run (which comes back here, being
  deleted, for its record). A run not due yet is looked at again when it is; a blocked one (an
  unsettled action, a running child) every ``retry`` seconds. A finished run whose policy sets
  no TTL (or that has none) is not read at all: nothing is to be done for it.

Writes are paced (``writes_per_second``), each carries the read resourceVersion (a 409 looks
again), and a record is created once by name, so two operator processes doing this agree.
Children go by owner reference (the garbage collector) and are also deleted explicitly, so a
cluster without a running garbage collector loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION, Retention
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.core.engine.children import PARENT_LABEL
from durable_agents.core.engine.loading import forged_object
from durable_agents.core.retention import (
    DELETION_REQUEST_ID,
    FINALIZER,
    Next,
    blockers,
    build_record,
    deletion_cancellation,
    due_at,
    is_child,
    is_terminal,
    label_value,
    needs_finalizer,
    next_step,
    owned_by,
    records_of,
    ttl_of,
)
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.faults import FaultPoints
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ground.lifecycle import Background, forever
from durable_agents.shell.ground.store import Conflict, Gone, RunStore
from durable_agents.shell.ground.workqueue import cancel_all
from durable_agents.shell.intake.policies import PolicyCache

log = logging.getLogger(__name__)

Key = tuple[str, str]
RECHECK = 3600.0  # a run due later is looked at again at least hourly (its policy may change)


@dataclass(frozen=True)
class RetentionConfig:
    retry: float = 5.0  # seconds before a blocked run (unsettled action, running child) is looked at again
    writes_per_second: float = 50.0
    workers: int = 4
    policy_cache: float = 10.0  # seconds a policy read found missing is believed missing


class RetentionController(Background):
    """Subscribe :meth:`observe` to the process's AgentRun reflector before it starts."""

    def __init__(
        self, kube: Kube, keyring: Keyring, identity: str, config: RetentionConfig, policies: PolicyCache
    ) -> None:
        self.store = RunStore(kube, FaultPoints([]))
        self.kube = kube
        self.keyring = keyring
        self.identity = identity
        self.config = config
        self.policies = policies  # the process's one cache (the manager's)
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._slim: dict[Key, dict[str, Any]] = {}
        # A finished run's event, and nothing more to look at: the key of the policy governing it
        # (None: none). Its run is read only if that policy keeps finished runs for a time.
        self._finished: dict[Key, tuple[str, str] | None] = {}
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._later: list[tuple[float, Key]] = []
        self._scheduled: dict[Key, float] = {}
        self._wake = asyncio.Event()
        self._next_write = 0.0

    async def run(self) -> None:
        tasks = [
            *(asyncio.create_task(self._work(), name=f"retention-{i}") for i in range(self.config.workers)),
            asyncio.create_task(self._timer(), name="retention-timer"),
        ]
        try:
            await forever()
        finally:
            await cancel_all(tasks)

    # -- events: filter and enqueue, nothing else ---------------------------------------------

    def observe(self, event_type: str | None, run: dict[str, Any]) -> None:
        meta = run.get("metadata") or {}
        if event_type == "DELETED":
            self._slim.pop((meta.get("namespace"), meta.get("name")), None)  # type: ignore[arg-type]
            self._finished.pop((meta.get("namespace"), meta.get("name")), None)  # type: ignore[arg-type]
            return
        finalizers = meta.get("finalizers") or []
        deleting = meta.get("deletionTimestamp") is not None
        # Without the finalizer, being deleted with it, or finished (due some day): worth a look.
        wanted = needs_finalizer(run)
        finishing = deleting and FINALIZER in finalizers
        key = (meta["namespace"], meta["name"])
        if wanted:
            # Only the finalizer is missing: the patch needs the metadata alone (its resourceVersion
            # is the precondition), so no read first, and no whole body kept while it waits.
            self._slim[key] = {"metadata": {k: meta.get(k) for k in ("name", "namespace", "resourceVersion")}}
            self._slim[key]["metadata"]["finalizers"] = list(finalizers)
        else:
            self._slim.pop(key, None)
        finished = not deleting and is_terminal(run) and not is_child(run)
        if finished and not (wanted or finishing):
            self._finished[key] = self.policies.governing_key(run)
        else:
            self._finished.pop(key, None)
        if wanted or finishing or finished:
            self.enqueue(key)

    def enqueue(self, key: Key) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def later(self, key: Key, delay: float) -> None:
        """Look at ``key`` again in ``delay`` seconds (or sooner, if it was due sooner already)."""
        when = time.monotonic() + max(delay, 0.0)
        if self._scheduled.get(key, when + 1) <= when:
            return
        self._scheduled[key] = when
        heapq.heappush(self._later, (when, key))
        self._wake.set()

    async def _timer(self) -> None:
        while True:
            now = time.monotonic()
            while self._later and self._later[0][0] <= now:
                when, key = heapq.heappop(self._later)
                if self._scheduled.get(key) == when:
                    del self._scheduled[key]
                    self.enqueue(key)
            self._wake.clear()
            timeout = self._later[0][0] - now if self._later else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            if key in self._active:  # another worker has it: after that one, from its result
                self.later(key, 0.5)
                continue
            self._active.add(key)
            try:
                await self.handle(key)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the API server restarting, a refused write: look again later
                log.warning("retention: %s/%s: %s: %s", *key, type(err).__name__, err)
                self.later(key, self.config.retry)
            finally:
                self._active.discard(key)

    # -- one run ---------------------------------------------------------------------------------

    async def handle(self, key: Key) -> None:
        slim = self._slim.pop(key, None)
        if slim is not None:  # a conflict (409) brings it back, read afresh
            await self._add_finalizer(slim)
            return
        if key in self._finished and not await self._keeps_for_a_time(self._finished.pop(key)):
            return  # finished under no TTL: nothing to do, and no read of the run for it
        run = await self._get("agentruns", *key)
        if run is None:
            return
        if is_terminal(run):
            forged = forged_object(run, self.keyring)
            if forged is not None:  # never recorded or deleted as an end the operator did not write
                log.warning("retention: %s is not believed finished: %s", _key(run), forged)
                self.later(key, self.config.retry)  # its worker quarantines it; then it is a live run
                return
        step = next_step(run, ())
        if step is Next.ADD_FINALIZER:
            await self._add_finalizer(run)
        elif step is Next.CANCEL:
            await self._cancel(run)
        elif step in (Next.WAIT, Next.FINALIZE):
            await self._finalize(run)
        elif (
            is_terminal(run)
            and not is_child(run)
            and (run.get("metadata") or {}).get("deletionTimestamp") is None
        ):
            await self._expire(run)

    async def _add_finalizer(self, run: dict[str, Any]) -> None:
        meta = run["metadata"]
        body = {
            "metadata": {
                "resourceVersion": meta["resourceVersion"],
                "finalizers": [*(meta.get("finalizers") or []), FINALIZER],
            }
        }
        await self._patch(run, body)  # a finished run's next event (this patch's) brings it back

    async def _cancel(self, run: dict[str, Any]) -> None:
        """A deleted live run: the engine cancels it (task scope) and reconciles in-flight actions."""
        entry = deletion_cancellation(run, self.keyring, self.identity, datetime.now(UTC))
        body = {
            "metadata": {"resourceVersion": run["metadata"]["resourceVersion"]},
            "spec": {"cancellations": {DELETION_REQUEST_ID: entry}},
        }
        if await self._patch(run, body):
            log.info("retention: %s deleted while %s: canceling it first", _key(run), _state(run))

    async def _tree(self, run: dict[str, Any]) -> tuple[list[Mapping[str, Any]], list[dict[str, Any]]]:
        """The run's ActionRecords, and its children (each with its own ActionRecords appended)."""
        meta = run["metadata"]
        records = records_of(
            run, await self._list("actionrecords", meta["namespace"], RUN_LABEL, label_value(meta["name"]))
        )
        labelled = await self._list("agentruns", meta["namespace"], PARENT_LABEL, label_value(meta["name"]))
        children = [child for child in labelled if owned_by(child, run)]
        return records, children

    async def _blocked(
        self, run: dict[str, Any], records: list[Mapping[str, Any]], children: list[dict[str, Any]]
    ) -> list[str]:
        now = datetime.now(UTC)
        blocked = blockers(records, children, self.keyring, now)
        for child in children:
            cmeta = child["metadata"]
            theirs = records_of(
                child,
                await self._list("actionrecords", cmeta["namespace"], RUN_LABEL, label_value(cmeta["name"])),
            )
            blocked += [f"{cmeta['name']}: {why}" for why in blockers(theirs, (), self.keyring, now)]
        return blocked

    async def _finalize(self, run: dict[str, Any]) -> None:
        """A deleted run: once settled, its record, then its ActionRecords, then the finalizer."""
        meta = run["metadata"]
        records, children = await self._tree(run)
        blocked = (
            await self._blocked(run, records, children)
            if is_terminal(run)
            else blockers(records, children, self.keyring)
        )
        if next_step(run, blocked) is not Next.FINALIZE:
            log.info(
                "retention: %s is being deleted; waiting: %s", _key(run), "; ".join(blocked) or _state(run)
            )
            self.later((meta["namespace"], meta["name"]), self.config.retry)
            return
        retention = await self._retention(run)
        if retention.keep_record:
            ttl = ttl_of(retention)
            due = due_at(run, ttl)
            deleted_at = datetime.fromisoformat(str(meta["deletionTimestamp"]).replace("Z", "+00:00"))
            # deletionTimestamp has whole seconds: a deletion in the second the run fell due counts.
            why: Literal["retention", "deleted"] = (
                "retention" if due is not None and due <= deleted_at + timedelta(seconds=1) else "deleted"
            )
            await self._write_record(build_record(run, records, why=why, now=datetime.now(UTC)))
        for record in records:
            await self._delete("actionrecords", meta["namespace"], record["metadata"]["name"], None)
        for child in children:  # the garbage collector does too; explicit, in case none runs
            await self._delete(
                "agentruns", meta["namespace"], child["metadata"]["name"], child["metadata"]["uid"]
            )
        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        body = {"metadata": {"resourceVersion": meta["resourceVersion"], "finalizers": finalizers or None}}
        if await self._patch(run, body):
            log.info("retention: %s settled and recorded; let go (%d actions)", _key(run), len(records))

    async def _expire(self, run: dict[str, Any]) -> None:
        """A finished top-level run: delete it (and its children) once its TTL has passed."""
        meta = run["metadata"]
        due = due_at(run, ttl_of(await self._retention(run)))
        if due is None:
            return
        wait = (due - datetime.now(UTC)).total_seconds()
        if wait > 0:
            self.later((meta["namespace"], meta["name"]), min(wait, RECHECK))
            return
        records, children = await self._tree(run)
        blocked = await self._blocked(run, records, children)
        if blocked:
            log.info("retention: %s is due but kept: %s", _key(run), "; ".join(blocked))
            self.later((meta["namespace"], meta["name"]), self.config.retry)
            return
        if FINALIZER not in (meta.get("finalizers") or []):
            await self._add_finalizer(run)  # the record is written on the way out
            return
        for child in children:
            await self._delete(
                "agentruns", meta["namespace"], child["metadata"]["name"], child["metadata"]["uid"]
            )
        await self._delete("agentruns", meta["namespace"], meta["name"], meta["uid"])
        log.info(
            "retention: %s finished at %s; deleted after its retention",
            _key(run),
            run["status"].get("stateSince"),
        )

    # -- reads and writes ------------------------------------------------------------------------

    async def _keeps_for_a_time(self, governing: tuple[str, str] | None) -> bool:
        """Whether the policy ``governing`` a finished run deletes it some time after (a TTL)."""
        if governing is None:
            return False
        policy = await self.policies.read(*governing, absent_for=self.config.policy_cache)
        return policy is not None and ttl_of(policy.retention) is not None

    async def _retention(self, run: dict[str, Any]) -> Retention:
        key = self.policies.governing_key(run)  # named, or its namespace's or the cluster's default
        if key is None:
            return Retention()
        policy = await self.policies.read(*key, absent_for=self.config.policy_cache)
        return policy.retention if policy is not None else Retention()

    async def _get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = await self.kube.call(
                self.kube.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return out

    async def _list(self, plural: str, namespace: str, label: str, value: str) -> list[dict[str, Any]]:
        out = await self.kube.call(
            self.kube.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            plural,
            label_selector=f"{label}={value}",
        )
        return list(out.get("items") or [])

    async def _patch(self, run: dict[str, Any], body: dict[str, Any]) -> bool:
        """Merge-patch the run with its resourceVersion as precondition; False on a conflict (the
        run changed: its next event brings it back) or when it is gone."""
        await self._pace()
        try:
            await self.store.patch(run, body)
        except Gone:
            return False
        except Conflict:
            self.enqueue((run["metadata"]["namespace"], run["metadata"]["name"]))
            return False
        return True

    async def _delete(self, plural: str, namespace: str, name: str, uid: str | None) -> None:
        await self._pace()
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            await self.kube.call(
                self.kube.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                body=body,
                propagation_policy="Background",
            )
        except ApiException as err:
            if err.status not in (404, 409):
                raise
        finally:
            metrics.API_WRITES.labels(plural, "delete").inc()

    async def _write_record(self, body: dict[str, Any]) -> None:
        """Create the record; one that exists already (a retry after a crash) is the same run's."""
        meta = body["metadata"]
        await self._pace()
        try:
            await self.kube.call(
                self.kube.custom.create_namespaced_custom_object,
                GROUP,
                VERSION,
                meta["namespace"],
                "agentrunrecords",
                body,
            )
        except ApiException as err:
            if err.status != 409:
                raise
        finally:
            metrics.API_WRITES.labels("agentrunrecords", "create").inc()

    async def _pace(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._next_write > now:
            await asyncio.sleep(self._next_write - now)
        self._next_write = max(now, self._next_write) + 1.0 / self.config.writes_per_second


def _key(run: dict[str, Any]) -> str:
    meta = run.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _state(run: dict[str, Any]) -> str:
    return str((run.get("status") or {}).get("state") or "pending")
