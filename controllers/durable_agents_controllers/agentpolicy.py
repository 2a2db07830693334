"""AgentPolicy watch events keep the manager's one policy cache current (read by the run worker,
the dispatcher, retention, the stuck check and the admission webhook); the runs that waited for a
policy go to the worker once it is known."""

from __future__ import annotations

from typing import Any

import kopf

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_controllers.manager import Manager


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    @kopf.on.event(GROUP, VERSION, "agentpolicies", registry=registry)
    async def agentpolicy_event(event: kopf.RawEvent, **_: Any) -> None:
        for run in manager.policies.observe(event.get("type"), dict(event["object"])):
            manager.worker.enqueue(run)
