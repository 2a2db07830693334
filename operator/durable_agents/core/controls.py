"""The on-call controls that are single fields of a run's spec: ``spec.reconcileNow`` (ask the
authoritative system now) and ``spec.escalation`` (mark the run for a person).

Like a quarantine retry (:mod:`durable_agents.core.authority`), each is a request the admission
webhook stamps (who asked, when, ``Purpose.CONTROL``) after a SubjectAccessReview for its custom
verb on the run (``reconcile``, ``escalate``); the operator acts only on a stamp that verifies and
refuses anything else once (``status.refusedRequests``). A new ``token`` is a new request; the
status records the token last acted on, so each is acted on once. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import (
    AgentRunSpec,
    AgentRunStatus,
    Condition,
    ConditionStatus,
    EscalationRequest,
    Identity,
    ReconcileNowRequest,
)
from durable_agents.core.authority import Unproven, instant, unproven
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp

ControlField = Literal["reconcileNow", "escalation"]
VERBS: dict[ControlField, str] = {"reconcileNow": "reconcile", "escalation": "escalate"}
ESCALATED = "Escalated"
Request = ReconcileNowRequest | EscalationRequest


def proof(run_id: str, field: ControlField, request: Request) -> dict[str, Any] | None:
    """What the stamp of ``spec.<field>`` covers; None while it names nobody who asked, or no time."""
    if request.requested_by is None or request.requested_at is None:
        return None
    what = (
        {"action": request.action or ""}
        if isinstance(request, ReconcileNowRequest)
        else {"reason": request.reason}
    )
    return {
        "runId": run_id,
        "control": field,  # the purpose is shared with other controls: never one of theirs
        "token": request.token,
        **what,
        "requestedBy": request.requested_by.who().wire(),
        "requestedAt": instant(request.requested_at),
    }


def stamp_control(keyring: Keyring, run_id: str, field: ControlField, request: Request) -> str:
    covered = proof(run_id, field, request)
    if covered is None:
        raise ValueError(f"spec.{field} names nobody to stamp")
    return stamp(keyring, Purpose.CONTROL, covered)


def control_unproven(
    keyring: Keyring | None, run_id: str, field: ControlField, request: Request
) -> Unproven | None:
    what = f"{field} {request.token!r}"
    return unproven(keyring, Purpose.CONTROL, proof(run_id, field, request), request.stamp, what)


def requested(spec: AgentRunSpec, field: ControlField) -> Request | None:
    return spec.reconcile_now if field == "reconcileNow" else spec.escalation


def pending(spec: AgentRunSpec, status: AgentRunStatus, field: ControlField) -> Request | None:
    """The request in ``spec.<field>`` not yet acted on, or None."""
    request = requested(spec, field)
    done = status.reconcile_now if field == "reconcileNow" else status.escalation
    if request is None or (done is not None and done.token == request.token):
        return None
    return request


def who(identity: Identity | None) -> str:
    return identity.username if identity is not None else "(nobody)"


def with_condition(conditions: list[Condition], condition: Condition) -> list[Condition]:
    """``conditions`` with ``condition`` in place of the one of its type (the others kept, in
    order; its transition time kept when its status does not change)."""
    prior = next((c for c in conditions if c.type == condition.type), None)
    if prior is not None and prior.status == condition.status:
        condition = condition.model_copy(update={"last_transition_time": prior.last_transition_time})
    others = [c for c in conditions if c.type != condition.type]
    return [*others, condition] if prior is None else [c if c is not prior else condition for c in conditions]


def escalated_condition(request: EscalationRequest, now: datetime, generation: int | None) -> Condition:
    message = f"escalated by {who(request.requested_by)}: {request.reason}"
    return Condition(
        type=ESCALATED,
        status=ConditionStatus.TRUE,
        reason=ESCALATED,
        message=message[:32768],
        last_transition_time=now,
        observed_generation=generation,
    )


def is_escalated(status: AgentRunStatus) -> bool:
    return any(c.type == ESCALATED and c.status is ConditionStatus.TRUE for c in status.conditions)


MODELS: dict[ControlField, type[ReconcileNowRequest] | type[EscalationRequest]] = {
    "reconcileNow": ReconcileNowRequest,
    "escalation": EscalationRequest,
}


def spec_value(obj: Mapping[str, Any] | None, field: str) -> Any:
    spec = (obj or {}).get("spec")
    return spec.get(field) if isinstance(spec, Mapping) else None


def token_of(value: Any) -> Any:
    return value.get("token") if isinstance(value, Mapping) else None


def control_run_id(old: Mapping[str, Any] | None) -> str:
    status = (old or {}).get("status")
    run_id = status.get("runId") if isinstance(status, Mapping) else None
    return str(run_id or ((old or {}).get("metadata") or {}).get("uid") or "")


def new_request(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, field: str
) -> Mapping[str, Any] | None:
    """``spec.<field>`` when it is a new request (a token the old object did not have)."""
    value = spec_value(new, field)
    if not isinstance(value, Mapping) or not isinstance(value.get("token"), str):
        return None
    return value if value.get("token") != token_of(spec_value(old, field)) else None


def control_stamps(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, user: Identity, at: str, keyring: Keyring
) -> dict[str, Any]:
    """The merge into ``spec`` that stamps each new control request (empty when there is none)."""
    out: dict[str, Any] = {}
    for field, model in MODELS.items():
        value = new_request(new, old, field)
        if value is None:
            continue
        asked = {**value, "requestedBy": {**user.wire(), "uid": user.uid}, "requestedAt": at}
        try:
            request = model.model_validate(asked)
        except ValidationError:
            continue  # the schema refuses it after this webhook
        out[field] = {**asked, "stamp": stamp_control(keyring, control_run_id(old), field, request)}
    return out
