"""Run Lease watch events enter here and go to the run worker. Nothing else happens here.

AgentRun events do not come through kopf: the run worker's own reflector lists and watches them
(durable_agents.shell.reflector explains why), started with the worker in ``runtime``.
"""

from __future__ import annotations

from typing import Any

import kopf

from durable_agents.shell.leases import RUN_LABEL
from durable_agents_controllers.runtime import worker


@kopf.on.event("coordination.k8s.io", "v1", "leases", labels={RUN_LABEL: kopf.PRESENT})
async def run_lease_event(event: kopf.RawEvent, **_: Any) -> None:
    worker().observe_lease(event.get("type"), dict(event["object"]))
