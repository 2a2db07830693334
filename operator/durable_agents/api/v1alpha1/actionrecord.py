"""ActionRecord: one entry of the action ledger (intent, dispatch, outcome)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

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
    """Where an action is in the ledger: intent, dispatching, input_required, succeeded, failed,
    outcome_unknown or canceled."""

    INTENT = "intent"
    DISPATCHING = "dispatching"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OUTCOME_UNKNOWN = "outcome_unknown"
    CANCELED = "canceled"
    INPUT_REQUIRED = "input_required"
    """The system asked for a person's input before it completes the call (an MCP server's
    ``InputRequiredResult``): nothing was applied; sent again with the answers (``status.input``)."""


class FirstClaim(ApiModel):
    """The operator process that created the intent sends it first, without a claim write: it
    holds the shard of the intent's run, the fencing that makes a separate claim unnecessary.
    Until ``expiresAt`` nobody else sends; after it, whether a send happened is unknown, so the
    authoritative system is asked before anything else (as for an expired claim)."""

    holder: str = Field(max_length=253)
    """The operator process that sends it first."""
    expires_at: datetime
    """Until when nobody else sends it."""


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
    """<run ID>/<step index>/<step name>[/attempt-N]: sent with the effect, so the authoritative
    system can deduplicate and be asked by it; the record's name is derived from it."""
    run_ref: RunReference
    """The AgentRun the action serves."""
    service_account_name: str = Field(default="default", max_length=253, description="Who the effect acts as")
    step_index: int = Field(ge=0)
    """The index of the run's step (or tool call) the action serves."""
    effect: str = Field(max_length=128)
    """The effect plugin (or tool) that performs it."""
    tier: ActionTier
    """The action's tier, fixed when the intent was made."""
    target: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """Where the effect lands, in the plugin's terms."""
    arguments: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """What the effect is sent, in the plugin's terms (sealed values stay sealed here)."""
    approval_request_id: str | None = Field(default=None, max_length=128)
    """The approval request that allowed it, for an action that needed approval."""
    compensates: str | None = Field(default=None, max_length=253)
    """The ActionRecord this action compensates."""
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
    """The Secret's name."""
    key: str = Field(max_length=253)
    """The key in the Secret."""
    resource_version: str | None = Field(default=None, max_length=64)
    """The Secret's resourceVersion that was read."""
    digest: str | None = Field(default=None, max_length=128)
    """A digest of the value keyed by the run's data key (never the value)."""


class ActionProgress(ApiModel):
    """The latest progress the called system reported while the action is dispatching (an MCP
    server's progress notifications), written at most once per few seconds; cleared when the
    action's state changes. The ``message`` is the server's text, not the operator's."""

    progress: float
    """How far the call is, in the server's own unit (grows with each notification)."""
    total: float | None = None
    """The server's total in the same unit, when it knows one."""
    message: str | None = Field(default=None, max_length=256)
    """The server's own words about the progress (quoted and escaped when shown)."""
    notifications: int = Field(default=0, ge=0)
    """Progress notifications received so far in this attempt."""
    at: datetime
    """When this progress was written."""


class ActionTask(ApiModel):
    """The task an MCP server answered a ``tools/call`` with (the tasks extension): a durable
    handle, written (stamped) before the first poll. While it is set and the action is not settled,
    the operator polls the server for the task (never sends the call again) and records the
    task's result as the action's outcome once it is terminal. ``statusMessage`` is the server's
    text, not the operator's."""

    id: str = Field(max_length=256)
    """The task ID the server gave."""
    server: str = Field(max_length=2048)
    """The MCP endpoint the task lives at (the action's target URL)."""
    status: str = Field(max_length=32)
    """The task's last polled status: working, input_required, completed, failed or cancelled."""
    status_message: str | None = Field(default=None, max_length=512)
    """The server's own words about the task (quoted and escaped when shown)."""
    poll_interval_ms: int | None = Field(default=None, ge=0)
    """The polling interval the server suggested, in milliseconds."""
    polls: int = Field(default=0, ge=0)
    """Times the task was polled so far."""
    created_at: datetime
    """When the operator recorded the task."""
    polled_at: datetime | None = None
    """When the task was last polled."""
    cancel_requested_at: datetime | None = None
    """When the operator asked the server to cancel the task (its run was canceled)."""
    cancel_answer: str | None = Field(default=None, max_length=512)
    """What the server answered to the cancellation (its task status, or its error)."""
    protocol: Literal["2026-07-28", "2025-11-25"] | None = None
    """The form of the task, which says how it is polled: absent (or ``2026-07-28``) for the tasks
    extension (``tasks/get`` carrying the result), ``2025-11-25`` for ``tasks/get`` in the task's
    MCP session, then ``tasks/result``. Covered by the outcome stamp when set."""
    session: str | None = Field(default=None, max_length=256)
    """The MCP session a 2025-11-25 task lives in (the server keeps its tasks per session): the
    polls are sent in it. Covered by the outcome stamp."""


REQUEST_STATE_MAX = 16 * 1024
"""The longest ``requestState`` an MCP server may ask to have echoed (the record holds it)."""


class ActionInput(ApiModel):
    """A round of input the system asked for (``input_required``): the keys of its questions (a
    question per key on the run, named ``mcp-<step>-<round>-<key>``), the keys refused before any
    person saw them (told ``decline``), and the opaque state echoed on the retry."""

    round: int = Field(ge=1, le=64)
    """The round: the first request for input of this action is 1; each retry that asks again adds one."""
    keys: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list, max_length=32)
    """The server's keys of the requests a person answers."""
    refused: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list, max_length=32)
    """The server's keys of requests refused before any person saw them (answered ``decline``)."""
    questions: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """Each key's question as a person reads it, sealed with the run's data key (the run asks it)."""
    request_state: str | None = Field(default=None, max_length=REQUEST_STATE_MAX)
    """The server's opaque state, echoed byte for byte on the retry."""
    asked_at: datetime
    """When the system asked."""
    held_open: bool = False
    """Asked while the call was open (``elicitation/create``, protocol 2025-11-25): the answer
    goes back on that open call (no request state, nothing sent again); a call lost meanwhile
    (operator restart, lost claim) leaves the outcome unknown (``HeldCallLost``), unless the run's
    policy trusts the tool as idempotent (``mcp.idempotentTools``): then it is sent again."""


class ActionRecordStatus(ApiModel):
    """The dispatch record: written by the operator's dispatchers only, stamped (status.stamp)."""

    state: ActionState = ActionState.INTENT
    """Where the action is: intent, dispatching, succeeded, failed, outcome_unknown or canceled."""
    attempts: int = Field(default=0, ge=0)
    """Sends so far."""
    queries: int = Field(default=0, ge=0, description="Times the authoritative system was asked")
    claimed_by: str | None = Field(default=None, max_length=253)
    """The operator process that took the last attempt (claimed it, or sent it under a first claim)."""
    claim_expires_at: datetime | None = None
    """Until when a dispatching claim holds; after it the outcome is unknown and is asked for."""
    first_dispatched_at: datetime | None = None
    """When it was first sent."""
    last_attempt_at: datetime | None = None
    """When it was last sent."""
    outcome_unknown_since: datetime | None = None
    """When its outcome became unknown (the authoritative system is asked by key)."""
    finished_at: datetime | None = None
    """When it settled (succeeded, failed or canceled)."""
    outcome: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """What the effect reported when it settled, in the plugin's terms."""
    reason: str | None = Field(default=None, max_length=128)
    """Why it is in its state, as a CamelCase word (for example PolicyChanged, RunCanceled)."""
    message: str | None = Field(default=None, max_length=4096)
    """Why, for people."""
    progress: ActionProgress | None = None
    """The called system's latest progress while dispatching (see ActionProgress)."""
    task: ActionTask | None = None
    """The server's task, when it answered the call with one (see ActionTask)."""
    input: ActionInput | None = None
    """The last round of input the system asked for (see ActionInput); kept once answered."""
    resolved_references: list[ResolvedReference] = Field(
        default_factory=list,
        max_length=32,
        description="Arguments given by reference to a Secret, read right before the last send.",
    )
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, json_schema_extra=CONDITIONS_SCHEMA_EXTRA
    )
    """Conditions for kubectl wait and people."""
    stamp: str | None = Field(
        default=None,
        max_length=256,
        description=(
            "The operator's outcome stamp (HMAC) over the record's name and idempotency key, state,"
            " attempts, claim expiry, outcome digest and reason: proof that the operator wrote this status"
        ),
    )


class ActionRecord(ApiModel):
    """One entry of the action ledger: an effect's intent (spec) and its dispatch (status)."""

    api_version: Literal["durable-agents.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["ActionRecord"] = "ActionRecord"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ActionRecordSpec
    status: ActionRecordStatus | None = None
