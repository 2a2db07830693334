"""Read steps: fetch a Kubernetes object AS THE RUN'S ServiceAccount and pin it as evidence.

The read is impersonated (``Impersonate-User: system:serviceaccount:<ns>:<sa>``; the API server
adds the ServiceAccount's groups itself), so a run reads only what its ServiceAccount may read,
never what the operator may. A 403 is a definite failure with the API server's reason.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kubernetes.client.rest import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from durable_agents.api.v1alpha1 import ObjectReference
from durable_agents.core.checkpoint import KubernetesEvidenceRef
from durable_agents.core.digest import object_content_digest
from durable_agents.core.engine import NeedRead, ReadResult, RunSnapshot
from durable_agents.shell.ground.kube import Kube, service_account_user


class EvidenceReader:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def reread(
        self, run: RunSnapshot, ref: KubernetesEvidenceRef, now: datetime
    ) -> KubernetesEvidenceRef | None:
        """The same evidence reference as it reads now (same ID), or None if it cannot be read."""
        need = NeedRead(
            ref.step_index,
            ref.id,
            ObjectReference(
                api_version=ref.api_version, kind=ref.kind, name=ref.name, namespace=ref.namespace
            ),
        )
        result = await self.read(run, need, now)
        if result.evidence is None:
            return None
        return result.evidence.model_copy(update={"id": ref.id, "step_index": ref.step_index})

    async def read(self, run: RunSnapshot, need: NeedRead, now: datetime) -> ReadResult:
        ref = need.ref
        namespace = ref.namespace or run.namespace
        sa = run.spec.service_account_name
        user = service_account_user(run.namespace, sa)
        try:
            obj: dict[str, Any] = await self.kube.call(
                self.kube.get_as, ref.api_version, ref.kind, ref.name, namespace, user
            )
        except ResourceNotFoundError:
            return ReadResult(
                need.step_index,
                error_reason="UnknownKind",
                error_message=f"the API server serves no {ref.kind} in {ref.api_version}",
            )
        except ApiException as err:
            target = f"{ref.kind} {namespace}/{ref.name}"
            if err.status == 403:
                return ReadResult(
                    need.step_index,
                    error_reason="Forbidden",
                    error_message=f"ServiceAccount {run.namespace}/{sa} may not read {target}",
                )
            if err.status == 404:
                return ReadResult(
                    need.step_index, error_reason="NotFound", error_message=f"{target} not found"
                )
            raise
        meta = obj["metadata"]
        evidence = KubernetesEvidenceRef(
            id=f"evidence-{need.step_index}-{need.step_name}",
            step_index=need.step_index,
            recorded_at=now,
            api_version=ref.api_version,
            kind=ref.kind,
            namespace=meta.get("namespace"),
            name=meta["name"],
            uid=meta.get("uid"),
            resource_version=meta["resourceVersion"],
            content_digest=object_content_digest(obj),
        )
        # What a model planner is told the read returned (sealed in its checkpoint, cut to size
        # there); the server's bookkeeping of who wrote which field is noise to it.
        content = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        return ReadResult(need.step_index, evidence=evidence, content=content)
