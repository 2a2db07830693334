"""Runs in a namespace the operator may not act in (it has not opted in, or opted out while they
lived): left alone, never failed, and listed by their ``NamespaceNotManaged`` condition.

Before a run is worked on, :class:`NamespaceGate` asks whether its namespace is managed
(:class:`~durable_agents.shell.ownership.namespaces.ManagedNamespaces`, one cached review per
namespace). A run where it is not gets the condition once (and a Warning Event naming the fix)
and is looked at again when the answer is due; nothing is requested as its ServiceAccount, so no
403 is earned. Once the namespace opts in, the condition is removed and the run goes on where it
was. An impersonated request refused mid-work (the namespace opted out since the last answer)
lands here too (:meth:`NamespaceGate.refused`): the run is not failed for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from durable_agents.core import managed_namespaces as core
from durable_agents.core.engine import RunSnapshot
from durable_agents.shell.ground.kube import Kube, ObjectKey
from durable_agents.shell.ground.store import Conflict, Gone, RunStore
from durable_agents.shell.observability.events import EventRecorder
from durable_agents.shell.ownership.namespaces import ManagedNamespaces

log = logging.getLogger("durable_agents.shell.runs.worker")


class NamespaceGate:
    def __init__(
        self,
        kube: Kube,
        store: RunStore,
        events: EventRecorder,
        wake_at: Callable[[ObjectKey, datetime | None], None],
        enqueue: Callable[[ObjectKey], None],
    ) -> None:
        self.namespaces = ManagedNamespaces(kube)
        self.store, self.events, self.wake_at, self.enqueue = store, events, wake_at, enqueue

    async def ready(self, key: ObjectKey, body: dict[str, Any], run: RunSnapshot) -> bool:
        """False (the run waits, marked once) while its namespace is not managed. A run that ended
        needs nothing as its ServiceAccount: it goes on (retention is the operator's own)."""
        if run.state.terminal:
            return True
        status = body.get("status") or {}
        if await self.namespaces.allowed(key[0]):
            conditions = core.cleared(status)
            if conditions is None:
                return True
            log.info("run %s/%s: its namespace is managed again; it goes on", *key)
            await self._write(body, conditions)
            return False  # decided again from the record written (its watch event brings it back)
        conditions = core.marked(status, key[0], datetime.now(UTC), _generation(body))
        if conditions is not None:
            log.warning("run %s/%s left alone: %s", *key, core.NOT_MANAGED)
            if await self._write(body, conditions):
                await self.events.record(
                    body, core.NOT_MANAGED, core.not_managed_message(key[0]), warning=True
                )
        self.wake_at(key, self.namespaces.due(key[0]))
        return False

    def refused(self, key: ObjectKey) -> None:
        """An impersonated request for the run was refused: its namespace is not managed (now)."""
        self.namespaces.refused(key[0])
        self.enqueue(key)  # looked at again: the gate marks it and it waits

    async def _write(self, body: dict[str, Any], conditions: list[dict[str, Any]]) -> bool:
        try:  # a replace with the resourceVersion read: the operator's rights are update, not patch
            await self.store.commit_status(body, {**(body.get("status") or {}), "conditions": conditions})
        except (Conflict, Gone):
            return False  # it moved on meanwhile (or went): the next look sees it
        return True


def _generation(body: dict[str, Any]) -> int:
    return int((body.get("metadata") or {}).get("generation") or 0)
