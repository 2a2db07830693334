"""A run that names an AgentPolicy waits until the policy is known: nothing runs without it.

The watch cache answers first; a policy it has not delivered (yet) is read once from the API
server. While it is missing the run says so once (a Warning Event, ``status.waitingFor`` while
it has no checkpoint) and is looked at again when the policy arrives (the cache remembers who
waits for it). A policy that reuses a version with other content is not used either: its runs
wait the same way (``PolicyVersionConflict``) until a new version arrives. A run whose policy was
force-deleted (:mod:`durable_agents.core.policy_integrity`) is quarantined ``PolicyDeleted``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import RunSnapshot
from durable_agents.core.policy_integrity import VERSION_CONFLICT
from durable_agents.core.policy_resolution import Blocked, Resolved, Ungoverned
from durable_agents.shell.ground.kube import ObjectKey
from durable_agents.shell.ground.store import RunStore
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.observability.events import EventRecorder

log = logging.getLogger("durable_agents.shell.runs.worker")


class PolicyWait:
    def __init__(
        self,
        policies: PolicyCache,
        events: EventRecorder,
        store: RunStore,
        enqueue: Callable[[ObjectKey], None],
        quarantine: Callable[[ObjectKey, str, str], Awaitable[None]],
    ) -> None:
        self.policies, self.events, self.store = policies, events, store
        self.enqueue = enqueue  # a run that waited for a policy read here is looked at again
        self.quarantine = quarantine  # (run, policy, reason): a run whose policy was force-deleted

    async def ready(self, key: ObjectKey, body: dict[str, Any], run: RunSnapshot) -> bool:
        """False (and the run waits, saying why once) while the policy that governs it is not
        known, or its scope's policies contradict each other (two defaults; a mandatory default
        and a run naming another). A run that ended needs none; a run no policy governs goes on
        (read-only work only: the engine refuses the rest with PolicyRequired)."""
        if run.state.terminal:
            return True
        found = self.policies.governing(run)
        if not isinstance(found, Resolved):  # judged on a full list, not on a watch still filling
            await self.policies.refresh_scope(run.namespace)
            found = self.policies.governing(run)
        if isinstance(found, Ungoverned):
            return True
        if isinstance(found, Blocked):
            if self.policies.wait_for((run.namespace, ""), key):
                log.warning("run %s/%s waits: %s", *key, found.message)
                await self.events.record(body, found.reason, f"{found.message}: nothing runs", warning=True)
                await self.store.note_waiting(body, f"agentpolicy:{found.reason}")
            return False
        if await self._known(*found.key):
            return True
        policy = found.key
        forced = self.policies.forced.get(policy)
        if forced is not None:
            if run.state in (RunState.QUARANTINED, RunState.CANCEL_REQUESTED):
                return True  # to be canceled or retried: neither sends anything, neither needs it
            await self.quarantine(key, found.name, forced)
            return False
        if self.policies.wait_for(policy, key):
            conflict = self.policies.conflicts.get(policy)
            reason, why = (
                (VERSION_CONFLICT, f"{conflict}: not used")
                if conflict is not None
                else ("PolicyNotFound", f"waiting for {found.describe()}: nothing runs without it")
            )
            log.warning("run %s/%s waits for its %s: %s", *key, found.describe(), why)
            await self.events.record(body, reason, why, warning=True)
            await self.store.note_waiting(body, f"{found.kind.lower()}:{found.name}")
        return False

    async def _known(self, namespace: str, name: str) -> bool:
        if self.policies.get((namespace, name)) is not None:
            return True
        waited = await self.policies.fetch(namespace, name)
        for run in waited or ():
            self.enqueue(run)
        return waited is not None
