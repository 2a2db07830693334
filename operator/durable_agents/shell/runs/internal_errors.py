"""A unit of work that raised: retried with backoff, then the run quarantined ``InternalError``.

:mod:`durable_agents.shell.runs.failures` counts the failures and says which it is; this module
acts on the verdict: it wakes the run again after the backoff, or commits the quarantine (a
commit like any other: compare-and-swap, under the shard's epoch and the region's, with a
Warning Event) and leaves the run until a person acts.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import RunSnapshot
from durable_agents.core.engine.fencing import recorded_epoch
from durable_agents.core.engine.quarantine import INTERNAL_ERROR, internal_error, policy_deleted
from durable_agents.core.policy_integrity import POLICY_DELETED, deleted_message
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import ObjectKey
from durable_agents.shell.ground.store import Conflict, Gone, RunStore
from durable_agents.shell.ground.workqueue import WorkQueue
from durable_agents.shell.observability.events import EventRecorder
from durable_agents.shell.ownership.rights import RunOwnership
from durable_agents.shell.runs.batches import BatchWriter
from durable_agents.shell.runs.failures import Failures, describe
from durable_agents.shell.runs.region_epochs import RegionEpochs

log = logging.getLogger("durable_agents.shell.runs.worker")


class InternalErrors:
    def __init__(
        self,
        failures: Failures,
        queue: WorkQueue,
        store: RunStore,
        ownership: RunOwnership,
        regions: RegionEpochs,
        batches: BatchWriter,
        events: EventRecorder,
        keyring: Keyring | None,
    ) -> None:
        self.failures, self.queue, self.store, self.ownership = failures, queue, store, ownership
        self.regions, self.batches, self.events, self.keyring = regions, batches, events, keyring

    async def failed(self, key: ObjectKey, err: Exception) -> None:
        """The unit of work for ``key`` raised ``err``: look at the run again later, or quarantine it."""
        verdict = self.failures.failed(key, err)
        metrics.INTERNAL_ERRORS.labels(verdict.where.stage).inc()
        retry_at = datetime.now(UTC) + timedelta(seconds=verdict.delay)
        self.failures.log(key, verdict, err)
        if verdict.quarantine:
            try:
                await self.quarantine(key, verdict.where.describe(), describe(err), verdict.attempts)
                return
            except Exception:  # the quarantine's write failed too: try again later, not in a loop
                log.exception("run %s/%s: quarantining it failed; again in %.0fs", *key, verdict.delay)
        self.queue.wake_at(key, retry_at)

    async def quarantine(self, key: ObjectKey, where: str, error: str, attempts: int) -> None:
        """Quarantine the run ``InternalError`` (under our shard's epoch, if the run is ours), with
        a Warning Event; then leave it until a user acts."""
        try:
            body = await self.store.get(*key)
        except Gone:
            self.failures.forget(key)
            return
        snap, now = RunSnapshot.from_object(body), datetime.now(UTC)
        right = self.ownership.right(key, recorded_epoch(snap))
        if right is None:  # the run is not (or no longer) ours: its shard's holder looks at it
            self.failures.forget(key)
            return
        message = f"{error} ({attempts} attempts)"
        commit = internal_error(snap, now, right.epoch, where, message, keyring=self.keyring)
        if commit is not None:
            status = commit.wire_status()
            status = self.regions.stamped(status) or status  # recorded even without a region leader
            written = await self.batches.write(
                key, body, status, [(snap.state, commit, None)], quarantine=True
            )
            if written is None:
                raise Conflict(f"{key}: the run moved while it was being quarantined")  # retried
            assert commit.status.outcome is not None
            await self.events.record(written, INTERNAL_ERROR, commit.status.outcome.message, warning=True)
        elif snap.state is RunState.QUARANTINED:  # e.g. its retry failed: it stays, and says why
            message = f"the operator failed on this quarantined run at {where}: {error} ({attempts} attempts)"
            await self.events.record(body, INTERNAL_ERROR, message, warning=True)
        self.failures.forget(key)

    async def policy_deleted(self, key: ObjectKey, policy: str, reason: str) -> None:
        """Quarantine the run ``PolicyDeleted``: its AgentPolicy was force-deleted (``reason``:
        the on-call's), with a Warning Event; nothing runs without a policy."""
        try:
            body = await self.store.get(*key)
        except Gone:
            return
        snap, now = RunSnapshot.from_object(body), datetime.now(UTC)
        right = self.ownership.right(key, recorded_epoch(snap))
        if right is None:
            return
        message = deleted_message(policy, reason)
        commit = policy_deleted(snap, now, right.epoch, message, keyring=self.keyring)
        if commit is None:
            return
        status = commit.wire_status()
        status = self.regions.stamped(status) or status
        written = await self.batches.write(key, body, status, [(snap.state, commit, None)], quarantine=True)
        if written is None:
            self.queue.wake_at(key, now)  # the run moved: decided again from what is stored
            return
        log.warning("run %s/%s quarantined: %s", *key, message)
        await self.events.record(written, POLICY_DELETED, message, warning=True)
