"""Waits for a human's answer or an external event: entered, left, expired, or re-entered."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from durable_agents.api.v1alpha1 import Outcome
from durable_agents.core.checkpoint import ExternalEvidenceRef, PendingExternal, PendingInput
from durable_agents.core.digest import canonical_digest
from durable_agents.core.durations import parse_duration
from durable_agents.core.engine.children import running_children
from durable_agents.core.engine.commits import CommitBuilder
from durable_agents.core.engine.decisions import Commit, Decision, Idle
from durable_agents.core.engine.snapshot import Settings
from durable_agents.core.planner import AskHuman, AwaitEvent
from durable_agents.core.statemachine import RunEvent


def ask_human(builder: CommitBuilder, step: AskHuman, settings: Settings) -> Commit:
    """Ask the question and wait for the answer until it expires (the policy's expiry by default)."""
    cp = builder.cp
    expires = builder.now + (step.expires_in or parse_duration(settings.wait_expiries.input))
    pending = PendingInput(request_id=step.request_id, question=step.question, expires_at=expires)
    return builder.commit(
        RunEvent.INPUT_REQUESTED,
        checkpoint=cp.model_copy(update={"pending_input": pending}),
        waiting_for=f"input:{step.request_id}",
        detail=f"asked {step.request_id}",
    )


def await_event(builder: CommitBuilder, step: AwaitEvent, settings: Settings) -> Commit:
    """Wait for the event until it expires (the policy's expiry by default)."""
    cp = builder.cp
    expires = builder.now + (step.expires_in or parse_duration(settings.wait_expiries.external))
    awaited = PendingExternal(request_id=step.request_id, event=step.event, expires_at=expires)
    return builder.commit(
        RunEvent.EXTERNAL_AWAITED,
        checkpoint=cp.model_copy(update={"pending_external": awaited}),
        waiting_for=f"event:{step.event}",
        detail=f"awaiting {step.event}",
    )


def leave_input_wait(builder: CommitBuilder) -> Decision:
    """In waiting_input: move on once the answer is in the spec, or expire."""
    asked = builder.cp.pending_input
    if asked is None:
        return builder.commit(RunEvent.INPUT_RECEIVED, detail="no pending question recorded")
    return _leave_wait(
        builder,
        RunEvent.INPUT_RECEIVED,
        "answer",
        asked.request_id,
        "answers",
        asked.request_id,
        builder.run.spec.answers,
        clear="pending_input",
        expires_at=asked.expires_at,
        expired="InputExpired",
    )


def leave_external_wait(builder: CommitBuilder) -> Decision:
    """In waiting_external on an event: move on once the event is in the spec, or expire."""
    awaited = builder.cp.pending_external
    if awaited is None:
        return builder.commit(RunEvent.EXTERNAL_RECEIVED, detail="no pending event recorded")
    return _leave_wait(
        builder,
        RunEvent.EXTERNAL_RECEIVED,
        "event",
        awaited.request_id,
        "events",
        awaited.event,
        builder.run.spec.events,
        clear="pending_external",
        expires_at=awaited.expires_at,
        expired="ExternalEventExpired",
    )


def _leave_wait(
    builder: CommitBuilder,
    event: RunEvent,
    kind: str,
    request_id: str,
    field_name: str,
    key: str,
    delivered: Mapping[str, str],
    *,
    clear: str,
    expires_at: datetime,
    expired: str,
) -> Decision:
    """An answer or event arrived: record a reference to it (never its text) and move on.

    Nothing arrived: expire at the expiry, or stay idle until then.
    """
    value = delivered.get(key)
    if value is None:
        return _expire_or_idle(builder, expires_at, expired, builder.run.spec.deadline)
    cp, run = builder.cp, builder.run
    ref = ExternalEvidenceRef(
        id=f"{kind}-{request_id}",
        step_index=cp.position.step,
        recorded_at=builder.now,
        uri=f"agentrun://{run.namespace}/{run.name}/spec.{field_name}/{key}",
        content_digest=canonical_digest(value),
    )
    checkpoint = cp.model_copy(
        update={
            "input_refs": [*cp.input_refs, ref],
            clear: None,
            "position": cp.position.model_copy(update={"step": cp.position.step + 1}),
        }
    )
    return builder.commit(
        event, checkpoint=checkpoint, detail=f"{kind} {'to ' if kind == 'answer' else ''}{key}"
    )


def _expire_or_idle(
    builder: CommitBuilder, expires_at: datetime, reason: str, deadline: datetime | None
) -> Decision:
    if builder.now >= expires_at:
        return builder.commit(
            RunEvent.WAIT_EXPIRED,
            outcome=Outcome(reason=reason, message=f"nothing arrived before {expires_at.isoformat()}"),
        )
    return Idle(wake_at=min(expires_at, deadline) if deadline else expires_at, reason="waiting")


def recorded_wait(builder: CommitBuilder) -> Commit | None:
    """A checkpoint that still records a wait (a run released from quarantine mid-wait): go back
    into that wait instead of planning its step again (which would repeat an intent)."""
    cp = builder.cp
    detail = "back to the wait recorded in the checkpoint"
    if cp.pending_actions:
        names = ", ".join(pending.action_record_name for pending in cp.pending_actions)
        return builder.commit(RunEvent.EXTERNAL_AWAITED, waiting_for=f"action:{names}"[:253], detail=detail)
    running = running_children(cp)
    if running:
        return builder.commit(
            RunEvent.EXTERNAL_AWAITED, waiting_for=f"child:{running[0].name}", detail=detail
        )
    if cp.pending_input is not None:
        return builder.commit(
            RunEvent.INPUT_REQUESTED, waiting_for=f"input:{cp.pending_input.request_id}", detail=detail
        )
    if cp.pending_external is not None:
        return builder.commit(
            RunEvent.EXTERNAL_AWAITED, waiting_for=f"event:{cp.pending_external.event}", detail=detail
        )
    if cp.retry.retry_at is not None:
        commit = builder.commit(
            RunEvent.RETRY_SCHEDULED, waiting_for=f"retry:{cp.retry.retry_at.isoformat()}", detail=detail
        )
        commit.status.retry_at = cp.retry.retry_at
        return commit
    return None
