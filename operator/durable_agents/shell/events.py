"""Kubernetes Events on runs (one per transition, reason = the transition) and on action records.

Events carry task ID, state version, attempt and policy version; never prompt content.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import Any

from durable_agents.shell import metrics
from durable_agents.shell.kube import GROUP, VERSION, Kube

log = logging.getLogger(__name__)
COMPONENT = "durable-agents"


def reason_of(event: str) -> str:
    return "".join(part.capitalize() for part in event.split("_"))


class EventRecorder:
    def __init__(self, kube: Kube, instance: str) -> None:
        self.kube = kube
        self.instance = instance

    async def record(self, run: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        meta = run["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": run.get("apiVersion", f"{GROUP}/{VERSION}"),
                "kind": run.get("kind", "AgentRun"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.kube.call(self.kube.core.create_namespaced_event, meta["namespace"], body)
            metrics.API_WRITES.labels("events", "create").inc()
        except Exception:  # events are best effort; the status history is authoritative
            log.warning("could not record event %s on %s/%s", reason, meta["namespace"], meta["name"])
