"""``kubernetes.apply``: server-side apply of one object, AS the run's ServiceAccount.

arguments: ``{"object": <manifest>}`` (namespace defaults to the run's). The applied object is
itself the authoritative record: it carries the annotation ``durable-agents.io/idempotency-key``,
so a query (GET as the ServiceAccount) recognises an apply that happened before a crash. A 403 is
a definite failure naming what the ServiceAccount may not do; the operator's own rights never
reach the target.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from kubernetes.client.rest import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from durable_agents.api.v1alpha1 import ActionTier
from durable_agents.shell.effects.base import (
    Action,
    Applied,
    DispatchResult,
    EffectContext,
    Failed,
    NotApplied,
    QueryResult,
    Unknown,
)
from durable_agents.shell.ground.kube import service_account_user

KEY_ANNOTATION = "durable-agents.io/idempotency-key"
FIELD_MANAGER = "durable-agents"


def _manifest(ctx: EffectContext, action: Action) -> dict[str, Any] | None:
    obj = action.arguments.get("object")
    if not isinstance(obj, dict) or not obj.get("apiVersion") or not obj.get("kind"):
        return None
    body = copy.deepcopy(obj)
    meta = body.setdefault("metadata", {})
    if not meta.get("name"):
        return None
    meta.setdefault("namespace", ctx.namespace)
    meta.setdefault("annotations", {})[KEY_ANNOTATION] = action.key
    return body


def _outcome(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "namespace": meta.get("namespace"),
        "name": meta["name"],
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
    }


class KubernetesApply:
    name = "kubernetes.apply"
    tier = ActionTier.REVERSIBLE
    reversible = True
    compensation: str | None = "kubernetes.apply"  # apply the previous state again

    def _denied(self, ctx: EffectContext, verb: str, body: dict[str, Any]) -> Failed:
        meta = body["metadata"]
        return Failed(
            "Forbidden",
            f"ServiceAccount {ctx.namespace}/{ctx.service_account} may not {verb} "
            f"{body['kind']} {meta.get('namespace')}/{meta['name']}",
        )

    async def dispatch(self, ctx: EffectContext, action: Action) -> DispatchResult:
        body = _manifest(ctx, action)
        if body is None:
            return Failed(
                "InvalidArguments", "kubernetes.apply needs arguments.object with apiVersion, kind, name"
            )
        user = service_account_user(ctx.namespace, ctx.service_account)

        def apply() -> dict[str, Any]:
            dyn = ctx.kube.dynamic()
            resource = dyn.resources.get(api_version=body["apiVersion"], kind=body["kind"])
            out = dyn.server_side_apply(
                resource,
                body=body,
                field_manager=FIELD_MANAGER,
                header_params={"Impersonate-User": user},
            )
            result: dict[str, Any] = out.to_dict()
            return result

        try:
            applied = await asyncio.wait_for(ctx.kube.call(apply), ctx.timeout)
        except TimeoutError:
            return Unknown("Timeout", f"server-side apply did not answer within {ctx.timeout}s")
        except ResourceNotFoundError:
            return Failed("UnknownKind", f"the API server serves no {body['kind']} in {body['apiVersion']}")
        except ApiException as err:
            if err.status == 403:
                return self._denied(ctx, "apply", body)
            if err.status and 400 <= err.status < 500 and err.status not in (408, 429):
                # Refused (invalid, conflict, too large, ...): nothing was applied. Definite.
                return Failed(f"HTTP{err.status}", f"server-side apply refused: {err.reason}")
            return Unknown(f"HTTP{err.status}", f"server-side apply answered {err.status}")
        except (ConnectionError, OSError) as err:
            return Unknown("ConnectionError", f"{type(err).__name__}: {err}")
        return Applied(_outcome(applied))

    async def query(self, ctx: EffectContext, action: Action) -> QueryResult:
        body = _manifest(ctx, action)
        if body is None:
            return Unknown("InvalidArguments", "cannot reconcile: no object in arguments")
        user = service_account_user(ctx.namespace, ctx.service_account)
        meta = body["metadata"]

        def get() -> dict[str, Any]:
            dyn = ctx.kube.dynamic()
            resource = dyn.resources.get(api_version=body["apiVersion"], kind=body["kind"])
            out = dyn.get(
                resource,
                name=meta["name"],
                namespace=meta["namespace"] if resource.namespaced else None,
                header_params={"Impersonate-User": user},
            )
            result: dict[str, Any] = out.to_dict()
            return result

        try:
            current = await asyncio.wait_for(ctx.kube.call(get), ctx.timeout)
        except TimeoutError:
            return Unknown("Timeout", f"GET did not answer within {ctx.timeout}s")
        except ApiException as err:
            if err.status == 404:
                return NotApplied()
            return Unknown(f"HTTP{err.status}", f"GET answered {err.status}")
        annotations = (current.get("metadata") or {}).get("annotations") or {}
        if annotations.get(KEY_ANNOTATION) == action.key:
            return Applied(_outcome(current))
        return NotApplied()
