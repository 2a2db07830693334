"""What the admission webhook writes into an AgentRun request, and which requests it may take: purely.

- Stamps (mutating): on create, ``spec.createdBy`` is the authenticated user with the operator's
  stamp; on update, every NEW approval decision, cancellation, quarantine retry, on-call control
  and reconciliation gets the user, the time and a stamp (:mod:`durable_agents.core.authority`).
- Append-only (validating): a request once made is never changed or withdrawn.
- Verbs needed (validating): the verb on the run each new request needs (a decision: its policy's).

The shell's admission room (:mod:`durable_agents.shell.admission`) asks the API server the
questions these rules raise (SubjectAccessReviews, the policy, the ActionRecord).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from durable_agents.api.v1alpha1 import (
    AgentRunSpec,
    ApprovalDecision,
    CancelRequest,
    ControlRequest,
    Identity,
    PolicyReference,
)
from durable_agents.core.authority import (
    cancellation_unproven,
    instant,
    retry_unproven,
    stamp_cancellation,
    stamp_creator,
    stamp_decision,
    stamp_retry,
)
from durable_agents.core.controls import control_stamps
from durable_agents.core.reconciliations import reconciliation_stamps
from durable_agents.core.sealing import Keyring

# Requests to a live run, keyed by request ID: append-only.
REQUEST_MAPS = ("answers", "events", "approvals", "cancellations", "reconciliations")


# The verb each kind of request needs on the run (a decision needs its policy's verb).
REQUEST_VERBS = {"answers": "answer", "events": "answer", "cancellations": "cancel"}


RETRY_VERB = "retry"


Model = TypeVar("Model", bound=BaseModel)


def identity_of(userinfo: Mapping[str, Any]) -> Identity:
    return Identity(
        username=str(userinfo.get("username", "")),
        groups=[str(g) for g in userinfo.get("groups") or []],
        uid=userinfo.get("uid") or None,
    )


def spec_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _entries(obj: Mapping[str, Any] | None, field: str) -> Mapping[str, Any]:
    value = spec_of(obj).get(field)
    return value if isinstance(value, Mapping) else {}


def added_requests(new: Mapping[str, Any], old: Mapping[str, Any] | None, field: str) -> list[str]:
    before = _entries(old, field)
    return sorted(str(key) for key in _entries(new, field) if key not in before)


def _retry_token(obj: Mapping[str, Any] | None) -> Any:
    return spec_of(obj).get("retryQuarantine")


def run_id_of(old: Mapping[str, Any] | None) -> str:
    """The run ID stamps are bound to: ``status.runId``, else the uid (as the engine reads it)."""
    status = (old or {}).get("status")
    run_id = status.get("runId") if isinstance(status, Mapping) else None
    return str(run_id or ((old or {}).get("metadata") or {}).get("uid") or "")


def _parsed(model: type[Model], value: Any) -> Model | None:
    """``value`` as the API type, or None (the schema will refuse it after the mutating webhook)."""
    if not isinstance(value, Mapping):
        return None
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


def _replacing(user: Identity) -> dict[str, Any]:
    """The identity as a merge into whatever the client wrote: a client's ``uid`` never survives."""
    return {**user.wire(), "uid": user.uid}


def stamps(
    operation: str,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    now: datetime,
    keyring: Keyring,
) -> dict[str, Any]:
    """The spec fields to overwrite with the authenticated identity and the operator's stamps
    (a merge into ``spec``)."""
    spec = spec_of(new)
    if operation == "CREATE":
        meta = new.get("metadata") or {}
        sa = spec.get("serviceAccountName") or "default"
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        policy_ref = _parsed(PolicyReference, spec.get("policyRef"))  # invalid: refused by validation
        creator = stamp_creator(keyring, namespace, name, str(sa), user, now, policy_ref)
        return {"createdBy": {**creator, "uid": user.uid}}
    run_id, at = run_id_of(old), instant(now)
    out: dict[str, Any] = {}
    for request_id in added_requests(new, old, "approvals"):
        entry = _entries(new, "approvals")[request_id]
        decided = (
            {**entry, "approver": _replacing(user), "decidedAt": at} if isinstance(entry, Mapping) else None
        )
        decision = _parsed(ApprovalDecision, decided)
        if decided is not None and decision is not None:
            stamped = stamp_decision(keyring, run_id, request_id, decision)
            out.setdefault("approvals", {})[request_id] = {**decided, "stamp": stamped}
    for request_id in added_requests(new, old, "cancellations"):
        entry = _entries(new, "cancellations")[request_id]
        asked = (
            {**entry, "requestedBy": _replacing(user), "requestedAt": at}
            if isinstance(entry, Mapping)
            else None
        )
        request = _parsed(CancelRequest, asked)
        if asked is not None and request is not None:
            stamped = stamp_cancellation(keyring, run_id, request_id, request)
            out.setdefault("cancellations", {})[request_id] = {**asked, "stamp": stamped}
    retry = _retry_request(new, old, user, at, keyring, run_id)
    if retry != spec_of(new).get("retryQuarantineRequest"):
        out["retryQuarantineRequest"] = retry
    controls = control_stamps(new, old, user, at, keyring)  # reconcileNow, escalation
    return {**out, **reconciliation_stamps(new, old, user, at, keyring), **controls}


def _retry_request(
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    at: str,
    keyring: Keyring,
    run_id: str,
) -> Any:
    """``retryQuarantineRequest`` as it must be: stamped anew for a new token, else as it was."""
    token = _retry_token(new)
    if not isinstance(token, str) or token == _retry_token(old):
        return spec_of(old).get("retryQuarantineRequest")
    asked = {"requestedBy": _replacing(user), "requestedAt": at}
    request = _parsed(ControlRequest, asked)
    assert request is not None  # made here from an authenticated identity
    return {**asked, "stamp": stamp_retry(keyring, run_id, token, request)}


def rewritten(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> str | None:
    """Why this update rewrites a request already made, or None: requests are append-only.

    Entries are compared key by key and value by value, never walked: the schema bounds each map
    (at most 64 entries) and each value (a string, or a request of fixed shape).
    """
    for field in REQUEST_MAPS:
        before, after = _entries(old, field), _entries(new, field)
        for key, value in before.items():
            if key not in after:
                return f"spec.{field}[{key!r}] cannot be withdrawn: {field} are append-only"
            if after[key] != value:
                return f"spec.{field}[{key!r}] cannot be changed once given: {field} are append-only"
    token, before = _retry_token(new), _retry_token(old)
    if before is not None and token is None:
        return "spec.retryQuarantine cannot be withdrawn (set a new token to retry again)"
    if token == before and spec_of(new).get("retryQuarantineRequest") != spec_of(old).get(
        "retryQuarantineRequest"
    ):
        return "spec.retryQuarantineRequest is written by the operator's admission webhook only"
    return None


def verbs_needed(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """The verb each new request needs (decisions aside: they need the policy's), and for what."""
    verbs: dict[str, list[str]] = {}
    for field, verb in REQUEST_VERBS.items():
        for key in added_requests(new, old, field):
            verbs.setdefault(verb, []).append(f"spec.{field}[{key!r}]")
    token = _retry_token(new)
    if token is not None and token != _retry_token(old):
        verbs.setdefault(RETRY_VERB, []).append(f"spec.retryQuarantine {token!r}")
    return verbs


_NOT_STAMPED = "is not stamped by the admission webhook"


def unstamped_controls(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, user: Identity, keyring: Keyring
) -> str | None:
    """A new cancellation or retry must carry this user's identity and the webhook's stamp."""
    run_id = run_id_of(old)
    for request_id in added_requests(new, old, "cancellations"):
        request = CancelRequest.model_validate(_entries(new, "cancellations")[request_id])
        by = request.requested_by
        problem = cancellation_unproven(keyring, run_id, request_id, request)
        if by is None or by.username != user.username or problem is not None:
            return f"spec.cancellations[{request_id!r}] {_NOT_STAMPED} for {user.username!r}"
    token = _retry_token(new)
    if isinstance(token, str) and token != _retry_token(old):
        spec = AgentRunSpec.model_validate(spec_of(new))
        asked = spec.retry_quarantine_request
        problem = retry_unproven(keyring, run_id, token, asked)
        if (
            asked is None
            or asked.requested_by is None
            or asked.requested_by.username != user.username
            or problem
        ):
            return f"spec.retryQuarantine {token!r} {_NOT_STAMPED} for {user.username!r}"
    return None
