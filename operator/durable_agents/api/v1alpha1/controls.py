"""The on-call controls that are single requests on a run: ask the authoritative system now
(``spec.reconcileNow``) and mark the run for a person (``spec.escalation``), and what the operator
recorded of them in the status (:mod:`durable_agents.core.controls`)."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from durable_agents.api.v1alpha1.identity import Identity
from durable_agents.api.v1alpha1.identity import stamp_field as _stamp
from durable_agents.api.v1alpha1.meta import NAME_PATTERN, ApiModel


class ReconcileNowRequest(ApiModel):
    """Ask the authoritative system now about the run's actions whose outcome is unknown (or the
    one named), instead of waiting for the next paced query (``kubectl agentrun reconcile RUN``).
    A new ``token`` is a new request; ``requestedBy``, ``requestedAt`` and ``stamp`` are written
    by the admission webhook (verb ``reconcile`` on the run), never by a client."""

    token: str = Field(max_length=63, pattern=NAME_PATTERN)
    action: str | None = Field(default=None, max_length=253, description="One ActionRecord's name.")
    requested_by: Identity | None = None
    requested_at: datetime | None = None
    stamp: str | None = _stamp()


class EscalationRequest(ApiModel):
    """Mark the run for a person (``kubectl agentrun escalate RUN --reason``). A new ``token`` is a
    new request; ``requestedBy``, ``requestedAt`` and ``stamp`` are written by the admission
    webhook (verb ``escalate`` on the run), never by a client."""

    token: str = Field(max_length=63, pattern=NAME_PATTERN)
    reason: str = Field(min_length=1, max_length=1024)
    requested_by: Identity | None = None
    requested_at: datetime | None = None
    stamp: str | None = _stamp()


class ReconcileAnswer(ApiModel):
    """What the authoritative system said about one action when asked now."""

    action: str = Field(max_length=253)
    answer: str = Field(max_length=32, description="Applied, NotApplied, Unknown or NotUnknown.")
    message: str = Field(default="", max_length=512)


class ReconcileNowStatus(ApiModel):
    """The spec.reconcileNow request last acted on, and the answers."""

    token: str = Field(max_length=63)
    asked_by: str = Field(default="", max_length=253)
    asked_at: datetime
    answers: list[ReconcileAnswer] = Field(default_factory=list, max_length=32)


class EscalationStatus(ApiModel):
    """The spec.escalation request last acted on (the run carries condition Escalated)."""

    token: str = Field(max_length=63)
    reason: str = Field(default="", max_length=1024)
    escalated_by: str = Field(default="", max_length=253)
    escalated_at: datetime
