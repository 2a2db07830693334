"""AgentPolicy watch events keep the worker's read-only view of the policies current."""

from __future__ import annotations

from typing import Any

import kopf

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_controllers.manager import Manager


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    @kopf.on.event(GROUP, VERSION, "agentpolicies", registry=registry)
    async def agentpolicy_event(event: kopf.RawEvent, **_: Any) -> None:
        manager.worker.observe_policy(event.get("type"), dict(event["object"]))
