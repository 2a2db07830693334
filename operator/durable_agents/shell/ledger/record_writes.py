"""What a dispatcher writes about one ActionRecord: its next status, and the Events that say so.

Every status is :func:`~durable_agents.core.ledger.next_status` of the status the dispatcher
believes, under its identity and claim lifetime, committed by compare-and-swap (and stamped) by
:class:`~.actions.ActionStore`: a record that moved on meanwhile raises
:class:`~durable_agents.shell.ground.store.Conflict` for the dispatcher to read it again.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from durable_agents.api.v1alpha1 import (
    ActionInput,
    ActionRecordSpec,
    ActionRecordStatus,
    ActionState,
    ResolvedReference,
)
from durable_agents.core.ledger import next_status
from durable_agents.core.sealed_values import DataKey
from durable_agents.shell.effects import Applied, Failed, InputRequired, Unknown
from durable_agents.shell.ground import metrics
from durable_agents.shell.ledger.actions import ActionStore
from durable_agents.shell.ledger.input_asked import asked_input
from durable_agents.shell.ledger.unsealing import sealed_outcome
from durable_agents.shell.observability.events import EventRecorder

A = ActionState
HELD_CALL_LOST = "HeldCallLost"
"""A call held open while its server's question waited was lost: its outcome is unknown."""


class RecordWrites:
    """One dispatcher's writes to ActionRecords. ``all_events``: also the routine Events
    (Dispatched, Succeeded), each an API write."""

    def __init__(
        self,
        store: ActionStore,
        events: EventRecorder,
        identity: str,
        claim_ttl: timedelta,
        *,
        all_events: bool = False,
    ) -> None:
        self.store = store
        self.events = events
        self.identity = identity
        self.claim_ttl = claim_ttl
        self.all_events = all_events

    async def write(
        self,
        body: dict[str, Any],
        status: ActionRecordStatus,
        state: ActionState,
        *,
        claim: bool = False,
        first: bool = False,
        queried: bool = False,
        outcome: dict[str, Any] | None = None,
        reason: str | None = None,
        message: str | None = None,
        references: list[ResolvedReference] | None = None,
        asked: ActionInput | None = None,
        claim_until: datetime | None = None,
    ) -> dict[str, Any]:
        new = next_status(
            status,
            state,
            datetime.now(UTC),
            self.identity,
            self.claim_ttl,
            claim=claim,
            first=first,
            queried=queried,
            outcome=outcome,
            reason=reason,
            message=message,
            references=references,
            asked=asked,
            claim_until=claim_until,
        )
        return await self.store.commit_status(body, new.wire())

    async def event(self, body: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        await self.events.record(body, reason, message, warning=warning)

    async def routine_event(self, body: dict[str, Any], reason: str, message: str) -> None:
        """An Event only a reader of every step wants (``all_events``)."""
        if self.all_events:
            await self.event(body, reason, message)

    async def give_up(
        self, body: dict[str, Any], status: ActionRecordStatus, spec: ActionRecordSpec
    ) -> dict[str, Any]:
        """A claim (or first claim) expired without an answer: whether it was sent is unknown."""
        metrics.ACTION_DISPATCHES.labels(spec.effect, "ClaimExpired").inc()
        if status.state is A.INTENT and spec.first_claim is not None:
            holder, attempts = spec.first_claim.holder, max(status.attempts, 1)  # it may have sent
        else:
            holder, attempts = status.claimed_by or "its claimant", status.attempts
        reason, message = "ClaimExpired", f"{holder} did not record an answer in time"
        if status.state is A.INPUT_REQUIRED:  # the call held open for a person's answer is gone
            reason = HELD_CALL_LOST
            message = (
                f"the call {holder} held open while its server's question waited was lost (an "
                "operator restart, a lost claim): the question is closed, the outcome is unknown"
            )
        update = {"attempts": attempts}
        out = await self.write(
            body, status.model_copy(update=update), A.OUTCOME_UNKNOWN, reason=reason, message=message
        )
        if reason == HELD_CALL_LOST:  # the record's reason moves on with its queries: the Event stays
            await self.event(out, reason, message, warning=True)
        return out

    async def fail_before_dispatch(
        self, body: dict[str, Any], status: ActionRecordStatus, reason: str, message: str, direct: bool
    ) -> dict[str, Any]:
        # Nothing was dispatched: a definite failure, visible with its reason.
        out = await self.fail_unsent(body, status, direct, reason, message)
        await self.event(out, reason, message, warning=True)
        return out

    async def fail_unsent(
        self, body: dict[str, Any], status: ActionRecordStatus, direct: bool, reason: str, message: str
    ) -> dict[str, Any]:
        """Failed before anything was sent: claimed first, so that no other dispatcher sends it
        meanwhile; ``direct`` under our own first claim, which already keeps everyone else out.
        A held call lost and refused its re-send (``mcp.idempotentTools``) is no failure: its first
        send's outcome is unknown, so it is given up as any lost held call."""
        if status.state is A.INPUT_REQUIRED and status.input is not None and status.input.held_open:
            message = f"the call held open was lost and is not sent again ({reason}: {message})"[:4096]
            out = await self.write(body, status, A.OUTCOME_UNKNOWN, reason=HELD_CALL_LOST, message=message)
            await self.event(out, HELD_CALL_LOST, message, warning=True)
            return out
        if not direct:
            body = await self.write(body, status, A.DISPATCHING, claim=True)
            status = ActionRecordStatus.model_validate(body["status"])
        return await self.write(body, status, A.FAILED, reason=reason, message=message)

    async def dispatch_answered(
        self,
        claimed: dict[str, Any],
        status: ActionRecordStatus,
        spec: ActionRecordSpec,
        result: Applied | Failed | Unknown | InputRequired,
        data_key: DataKey | None,
        *,
        first: bool,
        references: list[ResolvedReference],
    ) -> dict[str, Any]:
        """Record what a dispatch answered: ``succeeded`` (its outcome sealed), ``failed``,
        ``outcome_unknown`` (to be asked about), or ``input_required`` (its questions sealed, for
        the run to ask: :mod:`.input_asked`). ``first``: sent under our first claim, so the
        attempt (and the ``references`` read for it) is recorded with the answer."""
        refs = references if first else None
        if isinstance(result, InputRequired):
            asked = asked_input(status, spec, result, data_key)
            if isinstance(asked, ActionInput):
                out = await self.write(
                    claimed,
                    status,
                    A.INPUT_REQUIRED,
                    reason="InputRequired",
                    message=f"the system asks for input (round {asked.round}: {', '.join(asked.keys) or '-'})"
                    "; nothing was applied",
                    first=first,
                    references=refs,
                    asked=asked,
                )
                await self.event(out, "InputRequired", out["status"]["message"])
                return out
            result = asked
        if isinstance(result, Applied):
            outcome = sealed_outcome(result.outcome, data_key, claimed["metadata"]["name"])
            out = await self.write(
                claimed, status, A.SUCCEEDED, outcome=outcome, first=first, references=refs
            )
            await self.routine_event(out, "Succeeded", f"{spec.effect} applied key={spec.idempotency_key}")
            return out
        state = A.FAILED if isinstance(result, Failed) else A.OUTCOME_UNKNOWN
        out = await self.write(
            claimed, status, state, reason=result.reason, message=result.message, first=first, references=refs
        )
        if isinstance(result, Failed):
            await self.event(out, "Failed", f"{result.reason}: {result.message}", warning=True)
        else:
            told = f"{result.reason}: {result.message}; asking the authoritative system"
            await self.event(out, "OutcomeUnknown", told, warning=True)
        return out
