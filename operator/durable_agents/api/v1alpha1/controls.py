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
    """A new token is a new request; the operator acts once per token."""
    action: str | None = Field(
        default=None, max_length=253, description="One ActionRecord's name; unset: every unknown outcome."
    )
    requested_by: Identity | None = None
    """Who asked: written by the admission webhook from the request's user."""
    requested_at: datetime | None = None
    """When: written by the admission webhook."""
    stamp: str | None = _stamp()


class EscalationRequest(ApiModel):
    """Mark the run for a person (``kubectl agentrun escalate RUN --reason``). A new ``token`` is a
    new request; ``requestedBy``, ``requestedAt`` and ``stamp`` are written by the admission
    webhook (verb ``escalate`` on the run), never by a client."""

    token: str = Field(max_length=63, pattern=NAME_PATTERN)
    """A new token is a new request; the operator acts once per token."""
    reason: str = Field(min_length=1, max_length=1024)
    """Why the run needs a person (shown in the Escalated condition and a Warning Event)."""
    requested_by: Identity | None = None
    """Who escalated: written by the admission webhook from the request's user."""
    requested_at: datetime | None = None
    """When: written by the admission webhook."""
    stamp: str | None = _stamp()


class ReconcileAnswer(ApiModel):
    """What the authoritative system said about one action when asked now."""

    action: str = Field(max_length=253)
    """The ActionRecord's name (empty with NothingUnknown)."""
    answer: str = Field(
        max_length=32,
        description=(
            "Applied, NotApplied or Unknown (what the system said); NotUnknown (the outcome was not "
            "unknown, or no such record), NoDispatcher (asked at the next paced query) or "
            "NothingUnknown (the run had no unknown outcome)."
        ),
    )
    message: str = Field(default="", max_length=512)
    """Details, for people."""


class ReconcileNowStatus(ApiModel):
    """The spec.reconcileNow request last acted on, and the answers."""

    token: str = Field(max_length=63)
    """The spec.reconcileNow token acted on."""
    asked_by: str = Field(default="", max_length=253)
    """The user who asked (from the request's stamped requestedBy)."""
    asked_at: datetime
    """When the operator asked the authoritative system."""
    answers: list[ReconcileAnswer] = Field(default_factory=list, max_length=32)
    """One answer per ActionRecord asked about."""


class EscalationStatus(ApiModel):
    """The spec.escalation request last acted on (the run carries condition Escalated)."""

    token: str = Field(max_length=63)
    """The spec.escalation token acted on."""
    reason: str = Field(default="", max_length=1024)
    """The reason given with the request."""
    escalated_by: str = Field(default="", max_length=253)
    """The user who escalated (from the request's stamped requestedBy)."""
    escalated_at: datetime
    """When the operator marked the run."""
