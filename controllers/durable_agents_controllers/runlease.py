"""Run Lease watch events go to the run worker (an orphaned Lease of an idle run gets reaped).

AgentRun events do not come through kopf: the manager's one reflector lists and watches them
(durable_agents.shell.intake.reflector explains why) for every subscriber (``agentrun`` wires the worker).
"""

from __future__ import annotations

from typing import Any

import kopf

from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents_controllers.manager import Manager


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    @kopf.on.event("coordination.k8s.io", "v1", "leases", labels={RUN_LABEL: kopf.PRESENT}, registry=registry)
    async def run_lease_event(event: kopf.RawEvent, **_: Any) -> None:
        manager.worker.observe_lease(event.get("type"), dict(event["object"]))
