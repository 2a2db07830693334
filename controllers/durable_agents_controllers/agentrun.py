"""AgentRun (and run Lease) watch events enter here and go to the run worker. Nothing else happens here."""

from __future__ import annotations

from typing import Any

import kopf

from durable_agents.shell.kube import GROUP, VERSION
from durable_agents.shell.leases import RUN_LABEL
from durable_agents_controllers.runtime import worker


@kopf.on.event(GROUP, VERSION, "agentruns")
async def agentrun_event(event: kopf.RawEvent, **_: Any) -> None:
    worker().observe(event.get("type"), dict(event["object"]))


@kopf.on.event("coordination.k8s.io", "v1", "leases", labels={RUN_LABEL: kopf.PRESENT})
async def run_lease_event(event: kopf.RawEvent, **_: Any) -> None:
    worker().observe_lease(event.get("type"), dict(event["object"]))
