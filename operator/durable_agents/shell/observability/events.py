"""Kubernetes Events on runs (reason = the transition) and on action records.

Every transition is in ``status.history``, the operator's log and its metrics. A Kubernetes Event
is an API write (and etcd load), so by default only what a person acts on gets one: a wait for a
person, a failure, a cancellation, a quarantine (:data:`NOTABLE`; ``DURABLE_AGENTS_EVENTS=all``
records every transition, and the dispatcher's routine Dispatched / Succeeded Events too). A run
that starts or succeeds says so in its status (``kubectl get``, ``kubectl wait``), not in an Event.
Events carry task ID, state version, attempt, policy version and parent task; never prompt content.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import Any

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube

log = logging.getLogger(__name__)
COMPONENT = "durable-agents"


NOTABLE = frozenset(
    {
        "rejected",
        "input_requested",
        "approval_requested",
        "reapproval_required",
        "revalidation_required",
        "attempt_failed",
        "wait_expired",
        "deadline_exceeded",
        "cancel_requested",
        "cancel_recorded",
        "step_canceled",
        "cancel_finished",
        "quarantine",
        "release_quarantine",
    }
)
"""Transitions that get a Kubernetes Event by default: a run asking someone, failing, being
canceled or quarantined; not the routine ``accepted`` / ``step_completed`` / ``*_received`` /
``revalidated`` / ``retry_scheduled`` / ``succeeded`` traffic (the status and history keep those)."""


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
            # Cut so that a run name of up to 253 characters still gives a valid Event name.
            "metadata": {
                "name": f"{meta['name'][:236].rstrip('-.')}.{uuid.uuid4().hex[:16]}",
                "namespace": meta["namespace"],
            },
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
            await self.kube.call(self.kube.create_event, meta["namespace"], body)
            metrics.API_WRITES.labels("events", "create").inc()
        except Exception:  # events are best effort; the status history is authoritative
            log.warning("could not record event %s on %s/%s", reason, meta["namespace"], meta["name"])
