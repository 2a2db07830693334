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
        """False (and the run waits, saying why once) while the AgentPolicy it names is not known.
        A run that ended needs none."""
        ref = run.spec.policy_ref
        if ref is None or run.state.terminal or await self._known(run.namespace, ref.name):
            return True
        policy = (run.namespace, ref.name)
        forced = self.policies.forced.get(policy)
        if forced is not None:
            if run.state in (RunState.QUARANTINED, RunState.CANCEL_REQUESTED):
                return True  # to be canceled or retried: neither sends anything, neither needs it
            await self.quarantine(key, ref.name, forced)
            return False
        if self.policies.wait_for(policy, key):
            conflict = self.policies.conflicts.get(policy)
            reason, why = (
                (VERSION_CONFLICT, f"{conflict}: not used")
                if conflict is not None
                else ("PolicyNotFound", f"waiting for AgentPolicy {ref.name!r}: nothing runs without it")
            )
            log.warning("run %s/%s waits for its AgentPolicy %r: %s", *key, ref.name, why)
            await self.events.record(body, reason, why, warning=True)
            await self.store.note_waiting(body, f"agentpolicy:{ref.name}")
        return False

    async def _known(self, namespace: str, name: str) -> bool:
        if self.policies.get((namespace, name)) is not None:
            return True
        waited = await self.policies.fetch(namespace, name)
        for run in waited or ():
            self.enqueue(run)
        return waited is not None
