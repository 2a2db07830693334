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

from durable_agents.api.v1alpha1 import Identity
from durable_agents.core.controls import MODELS, VERBS, control_run_id, control_unproven, spec_value, token_of
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground.kube import Kube

# admission.refused_verb: (kube, user, verb, resource, namespace, name) -> why not, or None.
RefusedVerb = Callable[[Kube, Identity, str, str, str, str], Awaitable[str | None]]


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
        before, after = spec_value(old, field), spec_value(new, field)
        if before is not None and after is None:
            return f"spec.{field} cannot be withdrawn (make a new request with a new token)"
        if after is None or (before is not None and token_of(after) == token_of(before)):
            if after != before:
                return f"spec.{field} cannot be changed once made (make a new request with a new token)"
            continue
        refused = await refused_verb(kube, user, VERBS[field], "agentruns", namespace, name)
        if refused is not None:
            return f"{refused} (spec.{field} {token_of(after)!r})"
        try:
            request = model.model_validate(after)
        except ValidationError as err:
            return f"spec.{field} is not a valid request: {err.errors()[0].get('msg')}"
        by = request.requested_by
        if (
            by is None
            or by.username != user.username
            or control_unproven(keyring, control_run_id(old), field, request)
        ):
            unstamped = "is not stamped by the admission webhook for"
            return f"spec.{field} {request.token!r} {unstamped} {user.username!r}"
    return None
