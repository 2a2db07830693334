"""The admission webhook's rules for the on-call controls ``spec.reconcileNow`` and
``spec.escalation`` (:mod:`durable_agents.core.controls`).

- Mutating (:func:`control_stamps`): a NEW token gets ``requestedBy`` (the request's authenticated
  user, never what the client wrote), ``requestedAt`` and the operator's stamp.
- Validating (:func:`check_controls`): a request once made is never changed or withdrawn (a new
  one comes with a new token); a new one needs the custom verb on the run (``reconcile``,
  ``escalate``: a SubjectAccessReview, the refusal names the verb) and must carry this user's
  identity and the webhook's stamp.

The operator acts only on a stamp that verifies (:mod:`durable_agents.shell.runs.controls`): with the
webhook off, a request written by hand is refused and listed in ``status.refusedRequests``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import EscalationRequest, Identity, ReconcileNowRequest
from durable_agents.core.controls import VERBS, ControlField, control_unproven, stamp_control
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground.kube import Kube

# admission.refused_verb: (kube, user, verb, resource, namespace, name) -> why not, or None.
RefusedVerb = Callable[[Kube, Identity, str, str, str, str], Awaitable[str | None]]
MODELS: dict[ControlField, type[ReconcileNowRequest] | type[EscalationRequest]] = {
    "reconcileNow": ReconcileNowRequest,
    "escalation": EscalationRequest,
}


def _value(obj: Mapping[str, Any] | None, field: str) -> Any:
    spec = (obj or {}).get("spec")
    return spec.get(field) if isinstance(spec, Mapping) else None


def _token(value: Any) -> Any:
    return value.get("token") if isinstance(value, Mapping) else None


def _run_id(old: Mapping[str, Any] | None) -> str:
    status = (old or {}).get("status")
    run_id = status.get("runId") if isinstance(status, Mapping) else None
    return str(run_id or ((old or {}).get("metadata") or {}).get("uid") or "")


def _new(new: Mapping[str, Any], old: Mapping[str, Any] | None, field: str) -> Mapping[str, Any] | None:
    """``spec.<field>`` when it is a new request (a token the old object did not have)."""
    value = _value(new, field)
    if not isinstance(value, Mapping) or not isinstance(value.get("token"), str):
        return None
    return value if value.get("token") != _token(_value(old, field)) else None


def control_stamps(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, user: Identity, at: str, keyring: Keyring
) -> dict[str, Any]:
    """The merge into ``spec`` that stamps each new control request (empty when there is none)."""
    out: dict[str, Any] = {}
    for field, model in MODELS.items():
        value = _new(new, old, field)
        if value is None:
            continue
        asked = {**value, "requestedBy": {**user.wire(), "uid": user.uid}, "requestedAt": at}
        try:
            request = model.model_validate(asked)
        except ValidationError:
            continue  # the schema refuses it after this webhook
        out[field] = {**asked, "stamp": stamp_control(keyring, _run_id(old), field, request)}
    return out


async def check_controls(
    kube: Kube,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    keyring: Keyring,
    refused_verb: RefusedVerb,
) -> str | None:
    """Why this update's control requests must be refused, or None."""
    meta = new.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    for field, model in MODELS.items():
        before, after = _value(old, field), _value(new, field)
        if before is not None and after is None:
            return f"spec.{field} cannot be withdrawn (make a new request with a new token)"
        if after is None or (before is not None and _token(after) == _token(before)):
            if after != before:
                return f"spec.{field} cannot be changed once made (make a new request with a new token)"
            continue
        refused = await refused_verb(kube, user, VERBS[field], "agentruns", namespace, name)
        if refused is not None:
            return f"{refused} (spec.{field} {_token(after)!r})"
        try:
            request = model.model_validate(after)
        except ValidationError as err:
            return f"spec.{field} is not a valid request: {err.errors()[0].get('msg')}"
        by = request.requested_by
        if (
            by is None
            or by.username != user.username
            or control_unproven(keyring, _run_id(old), field, request)
        ):
            unstamped = "is not stamped by the admission webhook for"
            return f"spec.{field} {request.token!r} {unstamped} {user.username!r}"
    return None
