"""The requests people make to a live AgentRun, each stamped by the admission webhook: the
creator (``spec.createdBy``), approval decisions, cancellations, reconciliations, and who set a
single-field control (``spec.retryQuarantineRequest``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from durable_agents.api.v1alpha1.identity import Identity
from durable_agents.api.v1alpha1.identity import stamp_field as _stamp
from durable_agents.api.v1alpha1.meta import ApiModel
from durable_agents.api.v1alpha1.runstatus import CancelScope

PLAIN_TEXT = r"^[^\x00-\x08\x0B\x0C\x0E-\x1F\x7F\x{80}-\x{9F}]*$"
"""Text a person writes that others read (and a model may be told): no control characters but
tab and line breaks. Checked by the API server (the CRD's pattern), not when a run is read: a
reason stored before the check still parses."""


class Creator(Identity):
    """The run's creator, stamped by the admission webhook at creation. ``stamp`` is the operator's
    proof that this creator was allowed to ``use`` the run's ServiceAccount (the run acts as it),
    for this namespace, name and ServiceAccount, made at ``stampedAt``: the operator acts on it
    only if that is this object's ``metadata.creationTimestamp`` (within a few seconds), so a
    ``createdBy`` copied into a run re-created under the same name proves nothing."""

    stamped_at: datetime | None = Field(
        default=None,
        description="When the admission webhook stamped the run (set by the webhook, with the stamp).",
    )
    stamp: str | None = _stamp()


class ApprovalDecision(ApiModel):
    """An approver's decision on one approval request, keyed by its request ID in ``spec.approvals``.

    ``digest`` must equal the request's digest (it binds the decision to the exact action).
    ``approver``, ``decidedAt`` and ``stamp`` are overwritten by the admission webhook from the
    request's authenticated user; whatever a client writes there is discarded. The operator acts
    only on a decision whose stamp verifies.
    """

    digest: str = Field(max_length=71, pattern=r"^sha256:[0-9a-f]{64}$")
    """The request's digest, copied from status.approvalRequest.digest."""
    decision: Literal["approve", "reject"]
    """approve or reject (as the policy's allowedDecisions allow)."""
    reason: str | None = Field(default=None, max_length=1024, json_schema_extra={"pattern": PLAIN_TEXT})
    """Why, for the record (and, for a rejection under the policy's ``rejection.response: replan``,
    for the model: it is told this reason)."""
    approver: Identity | None = None
    """Who decided: written by the admission webhook from the request's user."""
    decided_at: datetime | None = None
    """When: written by the admission webhook."""
    stamp: str | None = _stamp()


class CancelRequest(ApiModel):
    """A user's request to cancel, keyed by a request ID in ``spec.cancellations``.

    ``requestedBy``, ``requestedAt`` and ``stamp`` are stamped by the admission webhook; the
    operator acts only on a request whose stamp verifies.
    """

    scope: CancelScope = CancelScope.TASK
    """task (the run and its children; it ends canceled), turn (the current step), toolCall (the
    pending tool call) or children (the run's child runs)."""
    reason: str = Field(default="", max_length=1024)
    """Why, for the record."""
    requested_by: Identity | None = None
    """Who asked: written by the admission webhook from the request's user."""
    requested_at: datetime | None = None
    """When: written by the admission webhook."""
    stamp: str | None = _stamp()


class Reconciliation(ApiModel):
    """A person's answer for an action whose outcome is unknown (its authoritative system cannot be
    asked by key, say an MCP tool), keyed in ``spec.reconciliations`` by the ActionRecord's name
    (``NAME.ATTEMPT`` for a later attempt of a record already reconciled once).

    ``attempt`` is the record's ``status.attempts`` the person looked at: the answer speaks of that
    send only (after a "not applied" the action is sent again, and that send needs its own answer).
    ``applied``: it happened (the record succeeds, nothing is sent again) or it did not (it is sent
    again with the same idempotency key). ``reconciler``, ``reconciledAt`` and ``stamp`` are
    overwritten by the admission webhook, which lets only who holds the policy's approver verb
    reconcile; the operator acts only on an answer whose stamp verifies.
    """

    applied: bool
    """true: the action happened (it succeeds); false: it did not (it is sent again, same key)."""
    attempt: int = Field(ge=0, le=1_000_000)
    """The ActionRecord's status.attempts this answer speaks of."""
    reason: str = Field(default="", max_length=1024)
    """How the person knows, for the record."""
    reconciler: Identity | None = None
    """Who answered: written by the admission webhook from the request's user."""
    reconciled_at: datetime | None = None
    """When: written by the admission webhook."""
    stamp: str | None = _stamp()


class ControlRequest(ApiModel):
    """Who asked for a control that is a single field (``spec.retryQuarantine``), when, and the
    operator's stamp over it: all three set by the admission webhook, never by a client."""

    requested_by: Identity | None = None
    """Who set the control: written by the admission webhook from the request's user."""
    requested_at: datetime | None = None
    """When: written by the admission webhook."""
    stamp: str | None = _stamp()
