"""ActionRecord: one entry of the action ledger (intent, dispatch, outcome)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field

from durable_agents.api.v1alpha1.meta import (
    API_VERSION,
    CONDITIONS_SCHEMA_EXTRA,
    ActionTier,
    ApiModel,
    Condition,
    RunReference,
    cel,
)

# --- ActionRecord --------------------------------------------------------------------------


class ActionState(StrEnum):
    INTENT = "intent"
    DISPATCHING = "dispatching"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OUTCOME_UNKNOWN = "outcome_unknown"
    CANCELED = "canceled"


class FirstClaim(ApiModel):
    """The operator process that created the intent sends it first, without a claim write: it
    holds the shard of the intent's run, the fencing that makes a separate claim unnecessary.
    Until ``expiresAt`` nobody else sends; after it, whether a send happened is unknown, so the
    authoritative system is asked before anything else (as for an expired claim)."""

    holder: str = Field(max_length=253)
    expires_at: datetime


# An intent under a first claim is never claimed: its holder sends it without a claim write, and
# once the first claim expired it is given up to outcome_unknown and queried. Enforced by the API
# server too, so that a dispatcher of an earlier release (which knows no first claims) cannot
# claim it and send it a second time while its holder's request is on its way.
FIRST_CLAIM_RULE = cel(
    "!has(self.spec.firstClaim) || !has(self.status) || !has(self.status.state)"
    " || self.status.state != 'dispatching'"
    " || (has(oldSelf.status) && has(oldSelf.status.state) && oldSelf.status.state != 'intent')",
    "an intent under a first claim (spec.firstClaim) is sent by its holder only: it is never claimed"
    " from intent; once the first claim expired it goes to outcome_unknown and is queried",
)


class ActionRecordSpec(ApiModel):
    """The intent: immutable once committed; the name of the record derives from the key."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [cel("self == oldSelf", "an action intent is immutable")]
        }
    )

    idempotency_key: str = Field(max_length=253)
    run_ref: RunReference
    service_account_name: str = Field(default="default", max_length=253, description="Who the effect acts as")
    step_index: int = Field(ge=0)
    effect: str = Field(max_length=128)
    tier: ActionTier
    target: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    arguments: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    approval_request_id: str | None = Field(default=None, max_length=128)
    compensates: str | None = Field(default=None, max_length=253)
    first_claim: FirstClaim | None = Field(
        default=None, description="Who sends it first without a claim write, and until when (see FirstClaim)"
    )
    status_stamped: bool | None = Field(
        default=None,
        description=(
            "Set by the operator when it creates the record: every status of this record carries"
            " status.stamp, and a settled or unknown state (or a far claim) whose stamp does not verify"
            " is not believed: the authoritative system is asked by key. Absent on records created"
            " before outcome stamps (their statuses are believed as written)."
        ),
    )


class ResolvedReference(ApiModel):
    """An argument given by reference to a Secret, as the dispatcher read it (as the run's
    ServiceAccount) right before the send: which version, and a digest keyed by the run's data
    key (comparable within the run, useless for guessing the value). The value is never stored."""

    path: str = Field(max_length=253, description="Where in the arguments, e.g. headers.token")
    secret: str = Field(max_length=253)
    key: str = Field(max_length=253)
    resource_version: str | None = Field(default=None, max_length=64)
    digest: str | None = Field(default=None, max_length=128)


class ActionRecordStatus(ApiModel):
    state: ActionState = ActionState.INTENT
    attempts: int = Field(default=0, ge=0)
    queries: int = Field(default=0, ge=0, description="Times the authoritative system was asked")
    claimed_by: str | None = Field(default=None, max_length=253)
    claim_expires_at: datetime | None = None
    first_dispatched_at: datetime | None = None
    last_attempt_at: datetime | None = None
    outcome_unknown_since: datetime | None = None
    finished_at: datetime | None = None
    outcome: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    reason: str | None = Field(default=None, max_length=128)
    message: str | None = Field(default=None, max_length=4096)
    resolved_references: list[ResolvedReference] = Field(
        default_factory=list,
        max_length=32,
        description="Arguments given by reference to a Secret, read right before the last send.",
    )
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, json_schema_extra=CONDITIONS_SCHEMA_EXTRA
    )
    stamp: str | None = Field(
        default=None,
        max_length=256,
        description=(
            "The operator's outcome stamp (HMAC) over the record's name and idempotency key, state,"
            " attempts, claim expiry, outcome digest and reason: proof that the operator wrote this status"
        ),
    )


class ActionRecord(ApiModel):
    api_version: Literal["durable-agents.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["ActionRecord"] = "ActionRecord"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ActionRecordSpec
    status: ActionRecordStatus | None = None
