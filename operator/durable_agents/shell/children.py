"""Child runs: created AS the parent's ServiceAccount, observed, and canceled with the parent.

A parent's step names its child; the engine commits the child's name in the parent's checkpoint
before this module creates it (the intent first, as for effects). Creation is idempotent by name
(AlreadyExists is success if the child names this parent). Creating and canceling a child are
impersonated, so a run can start or stop only what its ServiceAccount may: no confused deputy.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import API_VERSION, AgentRunStatus
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import ChildObservation, NeedChildren, RunSnapshot
from durable_agents.shell import metrics
from durable_agents.shell.kube import Kube, service_account_user
from durable_agents.shell.store import Gone, RunStore

log = logging.getLogger(__name__)


class ChildRuns:
    def __init__(self, kube: Kube, store: RunStore) -> None:
        self.kube = kube
        self.store = store

    def _resource(self) -> Any:
        return self.kube.dynamic().resources.get(api_version=API_VERSION, kind="AgentRun")

    async def create(self, parent: RunSnapshot, body: dict[str, Any]) -> None:
        user = service_account_user(parent.namespace, parent.spec.service_account_name)

        def create() -> None:
            self.kube.dynamic().create(
                self._resource(),
                body=body,
                namespace=parent.namespace,
                header_params={"Impersonate-User": user},
            )

        try:
            await self.kube.call(create)
        except ApiException as err:
            metrics.API_WRITES.labels("agentruns", "create").inc()
            if err.status != 409:
                raise
            log.info("child run %s/%s exists already", parent.namespace, body["metadata"]["name"])
            return
        metrics.API_WRITES.labels("agentruns", "create").inc()

    async def cancel(self, parent: RunSnapshot, child: dict[str, Any], reason: str) -> None:
        """Ask a running child to cancel (task scope, so its own children follow), once."""
        request_id = f"parent-{parent.status.state_version}"
        if any(k.startswith("parent-") for k in (child.get("spec") or {}).get("cancellations") or {}):
            return  # asked already
        user = service_account_user(parent.namespace, parent.spec.service_account_name)
        patch = {"spec": {"cancellations": {request_id: {"scope": "task", "reason": reason[:1024]}}}}
        name = child["metadata"]["name"]

        def send() -> None:
            self.kube.dynamic().patch(
                self._resource(),
                name=name,
                namespace=parent.namespace,
                body=patch,
                content_type="application/merge-patch+json",
                header_params={"Impersonate-User": user},
            )

        await self.kube.call(send)
        metrics.API_WRITES.labels("agentruns", "patch").inc()
        log.info("asked child run %s/%s to cancel: %s", parent.namespace, name, reason)

    async def observe(self, parent: RunSnapshot, need: NeedChildren) -> dict[str, ChildObservation]:
        """Each child's state; a missing child is created from its body, a running one canceled if asked."""
        seen: dict[str, ChildObservation] = {}
        for name, body in need.records.items():
            try:
                child = await self.store.get(parent.namespace, name)
            except Gone:
                if body is None:
                    # Gone (deleted by someone): that is a terminal fact, not something to wait on.
                    seen[name] = ChildObservation(RunState.CANCELED, "ChildDeleted")
                    continue
                await self.create(parent, body)
                seen[name] = ChildObservation(RunState.PENDING)
                continue
            refs = [r.get("uid") for r in (child["metadata"].get("ownerReferences") or [])]
            if parent.uid not in refs:
                seen[name] = ChildObservation(RunState.FAILED, "NameTakenByAnotherRun")
                continue
            status = AgentRunStatus.model_validate(
                {k: v for k, v in (child.get("status") or {}).items() if k != "checkpoint"}
            )
            if need.cancel is not None and not status.state.terminal:
                await self.cancel(parent, child, need.cancel)
            reason = status.outcome.reason if status.outcome else None
            seen[name] = ChildObservation(status.state, reason)
        return seen
