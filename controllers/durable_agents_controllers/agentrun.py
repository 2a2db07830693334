"""AgentRun watch events enter here and go to the run worker's queue. Nothing else happens here."""

from __future__ import annotations

from typing import Any

import kopf

from durable_agents.shell.kube import GROUP, VERSION
from durable_agents_controllers.runtime import worker


@kopf.on.event(GROUP, VERSION, "agentruns")
async def agentrun_event(event: kopf.RawEvent, **_: Any) -> None:
    worker().observe(event.get("type"), dict(event["object"]))
