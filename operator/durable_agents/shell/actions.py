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
from durable_agents.shell.kube import GROUP, VERSION
from durable_agents.shell.leases import RUN_LABEL
from durable_agents.shell.store import StatusStore

PLURAL = "actionrecords"


class ActionStore(StatusStore):
    kind = "ActionRecord"
    plural = PLURAL

    async def ensure(self, namespace: str, spec: ActionRecordSpec) -> dict[str, Any]:
        """Create the intent record, or return the one that exists (a suppressed duplicate)."""
        name = action_record_name(spec.idempotency_key)
        body = {
            "apiVersion": API_VERSION,
            "kind": "ActionRecord",
            "metadata": {"name": name, "namespace": namespace, "labels": {RUN_LABEL: spec.run_ref.name}},
            "spec": spec.wire(),
        }
        async with self.faults.serialized():
            self.faults.before()
            try:
                out: dict[str, Any] = await self.kube.call(
                    self.kube.custom.create_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, body
                )
            except ApiException as err:
                metrics.API_WRITES.labels("actionrecords", "create").inc()
                if err.status != 409:
                    raise
                metrics.DUPLICATE_SUPPRESSIONS.inc()
                self.faults.after()
                return await self.get(namespace, name)
            metrics.API_WRITES.labels("actionrecords", "create").inc()
            self.faults.after()
            return out
