"""The action ledger's store: ActionRecords created once by name, their status by compare-and-swap.

The record's name derives from the idempotency key, so creating an intent twice is answered by
the API server with AlreadyExists: counted as a suppressed duplicate, never an error. Records
carry the run's label for listing but no ownerReference: the ledger outlives the run (retention).
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import API_VERSION, ActionRecordSpec
from durable_agents.core.ledger import action_record_name
from durable_agents.shell import metrics
from durable_agents.shell.hooks import CommitHooks, process_hooks
from durable_agents.shell.kube import GROUP, VERSION, Kube
from durable_agents.shell.leases import RUN_LABEL
from durable_agents.shell.store import Conflict, Gone

PLURAL = "actionrecords"


class ActionStore:
    def __init__(self, kube: Kube, hooks: CommitHooks | None = None) -> None:
        self.kube = kube
        self.hooks = hooks or process_hooks()

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            out: dict[str, Any] = await self.kube.call(
                self.kube.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name
            )
        except ApiException as err:
            if err.status == 404:
                raise Gone(f"{namespace}/{name}") from err
            raise
        return out

    async def ensure(self, namespace: str, spec: ActionRecordSpec) -> dict[str, Any]:
        """Create the intent record, or return the one that exists (a suppressed duplicate)."""
        name = action_record_name(spec.idempotency_key)
        body = {
            "apiVersion": API_VERSION,
            "kind": "ActionRecord",
            "metadata": {"name": name, "namespace": namespace, "labels": {RUN_LABEL: spec.run_ref.name}},
            "spec": spec.wire(),
        }
        self.hooks.before()
        try:
            out: dict[str, Any] = await self.kube.call(
                self.kube.custom.create_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, body
            )
        except ApiException as err:
            metrics.API_WRITES.labels("actionrecords", "create").inc()
            if err.status != 409:
                raise
            metrics.DUPLICATE_SUPPRESSIONS.inc()
            self.hooks.after()
            return await self.get(namespace, name)
        metrics.API_WRITES.labels("actionrecords", "create").inc()
        self.hooks.after()
        return out

    async def commit_status(self, current: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        meta = current["metadata"]
        body = {
            "apiVersion": API_VERSION,
            "kind": "ActionRecord",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "resourceVersion": meta["resourceVersion"],
            },
            "spec": current["spec"],
            "status": status,
        }
        self.hooks.before()
        try:
            out: dict[str, Any] = await self.kube.call(
                self.kube.custom.replace_namespaced_custom_object_status,
                GROUP,
                VERSION,
                meta["namespace"],
                PLURAL,
                meta["name"],
                body,
            )
        except ApiException as err:
            metrics.API_WRITES.labels("actionrecords/status", "update").inc()
            if err.status == 409:
                raise Conflict(f"{meta['namespace']}/{meta['name']}") from err
            if err.status == 404:
                raise Gone(f"{meta['namespace']}/{meta['name']}") from err
            raise
        metrics.API_WRITES.labels("actionrecords/status", "update").inc()
        self.hooks.after()
        return out
