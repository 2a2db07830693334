"""The stores: read AgentRuns and ActionRecords and commit their status by compare-and-swap.

A commit is ONE ``PUT .../status`` carrying the resourceVersion that was read as precondition.
A 409 means someone committed in between: the caller throws its computation away and reloads.
kopf's own patch path is never used for business state (it is a merge patch without a
precondition).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.engine.commits import noted_waiting
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.faults import FaultPoints, process_faults
from durable_agents.shell.ground.kube import Kube

log = logging.getLogger(__name__)


class Conflict(Exception):
    """The record changed since it was read; reload and decide again."""


class Gone(Exception):
    """The record no longer exists."""


class Outdated(Conflict):
    """Not written: what the write carries was decided from facts that changed before it (its
    precondition said why). Like a refused write: thrown away, decided again."""


Precondition = Callable[[], str | None]
"""Checked right before the write (after any wait for it): why it must not happen, or None."""
Recheck = Callable[[], Awaitable[str | None]]
"""Reads done again right before the write (after any wait for it): why it must not happen, or None."""


class StatusStore:
    """Reads records of one kind and commits their status by compare-and-swap."""

    kind: str
    plural: str

    def __init__(self, kube: Kube, faults: FaultPoints | None = None) -> None:
        self.kube = kube
        self.faults = faults or process_faults()

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            obj: dict[str, Any] = await self.kube.call(
                self.kube.get_namespaced_object, GROUP, VERSION, namespace, self.plural, name
            )
        except ApiException as err:
            if err.status == 404:
                raise Gone(f"{namespace}/{name}") from err
            raise
        return obj

    async def commit_status(
        self,
        current: dict[str, Any],
        status: dict[str, Any],
        precondition: Precondition | None = None,
        recheck: Recheck | None = None,
    ) -> dict[str, Any]:
        """Replace ``status`` iff the record is still at ``current``'s resourceVersion (and
        ``recheck``, then ``precondition``, hold at the last moment: :class:`Outdated` if not)."""
        meta = current["metadata"]
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": self.kind,
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "resourceVersion": meta["resourceVersion"],
            },
            "spec": current["spec"],
            "status": status,
        }
        if self.faults.delay:  # the test hook (inert otherwise): a test awaits this line
            log.info(
                "test hook: commit to %s/%s held %.1fs", meta["namespace"], meta["name"], self.faults.delay
            )
            await asyncio.sleep(self.faults.delay)
        self.faults.hold_at_commit(meta["namespace"], meta["name"])  # the test hook (inert otherwise)
        why = await recheck() if recheck is not None else None
        if why is not None:
            raise Outdated(f"{meta['namespace']}/{meta['name']}: {why}")
        label = f"{self.plural}/status"
        async with self.faults.serialized():
            # Checked with no await before the request is handed to the client: last moment here.
            why = precondition() if precondition is not None else None
            if why is not None:
                raise Outdated(f"{meta['namespace']}/{meta['name']}: {why}")
            self.faults.before()
            started = time.perf_counter()
            try:
                out: dict[str, Any] = await self.kube.call(
                    self.kube.replace_namespaced_status,
                    GROUP,
                    VERSION,
                    meta["namespace"],
                    self.plural,
                    meta["name"],
                    body,
                )
            except ApiException as err:
                metrics.API_WRITES.labels(label, "update").inc()
                if err.status == 409:
                    metrics.COMMIT_CONFLICTS.labels(self.plural).inc()
                    raise Conflict(f"{meta['namespace']}/{meta['name']}@{meta['resourceVersion']}") from err
                if err.status == 404:
                    raise Gone(f"{meta['namespace']}/{meta['name']}") from err
                raise
            metrics.API_WRITES.labels(label, "update").inc()
            metrics.COMMIT_LATENCY.labels(self.plural).observe(time.perf_counter() - started)
            self.faults.after()
        return out


class RunStore(StatusStore):
    """AgentRuns: one status write per transition."""

    kind = "AgentRun"
    plural = "agentruns"

    async def note_waiting(self, current: dict[str, Any], waiting_for: str) -> None:
        """Say what a run that cannot start yet waits for (``status.waitingFor``), without a
        transition: a pending run waiting for its AgentPolicy is visible in ``kubectl get``.
        Only while it has no checkpoint (the engine's commits own the status after that)."""
        status = current.get("status") or {}
        if status.get("checkpoint") is not None or status.get("waitingFor") == waiting_for:
            return
        generation = int((current.get("metadata") or {}).get("generation") or 0)
        noted = noted_waiting(status, waiting_for, generation, datetime.now(UTC))
        try:  # a replace with the resourceVersion read: the operator's rights are update, not patch
            await self.commit_status(current, noted)
        except (Conflict, Gone):
            return  # it moved on meanwhile (or went): the next unit of work sees it

    async def patch(self, current: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the run (not its status) iff it is still at ``current``'s resourceVersion:
        the operator's metadata writes (a rewrapped data key, its finalizer)."""
        meta = current["metadata"]
        body = {
            **body,
            "metadata": {**(body.get("metadata") or {}), "resourceVersion": meta["resourceVersion"]},
        }
        try:
            out: dict[str, Any] = await self.kube.call(
                self.kube.merge_patch_namespaced_object,
                GROUP,
                VERSION,
                meta["namespace"],
                self.plural,
                meta["name"],
                body,
            )
        except ApiException as err:
            if err.status == 409:
                raise Conflict(f"{meta['namespace']}/{meta['name']}@{meta['resourceVersion']}") from err
            if err.status == 404:
                raise Gone(f"{meta['namespace']}/{meta['name']}") from err
            raise
        finally:
            metrics.API_WRITES.labels(self.plural, "patch").inc()
        return out
