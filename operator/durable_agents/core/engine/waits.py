"""Waits for a human's answer or an external event: entered, left, expired, or re-entered.

An answer or event is acted on only once its seal proves the admission webhook admitted it
(:mod:`durable_agents.core.deliveries`); one that is not is refused once and the run waits for
the same question or event under a new key.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from durable_agents.api.v1alpha1 import ActionState, Outcome
from durable_agents.core.agent.mcp_questions import (
    QUESTION_PREFIX,
    answer_ref_id,
    is_server_question,
    question_name,
)
from durable_agents.core.authority import Unproven
from durable_agents.core.checkpoint import Checkpoint, ExternalEvidenceRef, PendingExternal, PendingInput
from durable_agents.core.deliveries import DeliveryField, delivery_unproven, next_key
from durable_agents.core.digest import canonical_digest
from durable_agents.core.durations import parse_duration
from durable_agents.core.engine.children import running_children
from durable_agents.core.engine.commits import CommitBuilder, refusal_of, refuse_in
from durable_agents.core.engine.decisions import Commit, Decision, Idle
from durable_agents.core.engine.snapshot import ActionObservation, RunSnapshot, Settings
from durable_agents.core.planner import AskHuman, AwaitEvent
from durable_agents.core.sealed_values import DATA_KEY_ANNOTATION, DataKey, fingerprint, open_data_key
from durable_agents.core.sealing import UndecryptableError
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


def ask_server_input(
    builder: CommitBuilder, settings: Settings, actions: Mapping[str, ActionObservation] | None
) -> Commit | None:
    """A pending action whose system asks for input (``input_required``): ask its first question
    the run has not recorded an answer to, in ``waiting_input`` (the policy's input expiry). None:
    no action asks, or every question of its round is answered (the dispatcher sends it again)."""
    cp = builder.cp
    answered = {ref.id for ref in cp.input_refs}
    for pending in cp.pending_actions:
        seen = (actions or {}).get(pending.action_record_name)
        if seen is None or seen.state is not ActionState.INPUT_REQUIRED or seen.input is None:
            continue
        for key in seen.input.keys:
            name = question_name(pending.step_index, seen.input.round, key)
            question = seen.input.questions.get(key)
            if answer_ref_id(name) in answered or not isinstance(question, str) or not question:
                continue
            expires = builder.now + parse_duration(settings.wait_expiries.input)
            asked = PendingInput(request_id=name, question=question, expires_at=expires)
            return builder.commit(
                RunEvent.INPUT_REQUESTED,
                checkpoint=cp.model_copy(update={"pending_input": asked}),
                waiting_for=f"input:{name}",
                detail=f"{pending.effect}: the server asks {key} (round {seen.input.round})",
            )
    return None


def closed_server_question(
    builder: CommitBuilder, actions: Mapping[str, ActionObservation] | None
) -> Commit | None:
    """In waiting_input on a server's question whose action no longer asks it (a call held open
    went on past its bound, or was lost): the question closes with the record's reason, unanswered,
    and the run waits on the action again. None: it still asks, or nothing is known of it."""
    cp, asked = builder.cp, builder.cp.pending_input
    if asked is None or not is_server_question(asked.request_id) or not actions:
        return None
    for pending in cp.pending_actions:
        seen = actions.get(pending.action_record_name)
        if seen is None or not asked.request_id.startswith(f"{QUESTION_PREFIX}{pending.step_index}-"):
            continue
        if seen.state is ActionState.INPUT_REQUIRED and seen.input is not None:  # noqa: SIM102
            if any(
                question_name(pending.step_index, seen.input.round, k) == asked.request_id
                for k in seen.input.keys
            ):
                return None
        why = f"{seen.reason}: {seen.message}" if seen.reason else f"the action is {seen.state.value}"
        return builder.commit(
            RunEvent.INPUT_RECEIVED,
            checkpoint=cp.model_copy(update={"pending_input": None}),
            detail=f"question {asked.request_id} closed unanswered: {why}"[:1024],
        )
    return None


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


def awaited_key(pending: PendingInput | PendingExternal) -> str:
    """The key the answer (event) is awaited under: a new one once a value was refused."""
    if pending.key is not None:
        return pending.key
    return pending.request_id if isinstance(pending, PendingInput) else pending.event


def leave_input_wait(builder: CommitBuilder, settings: Settings) -> Decision:
    """In waiting_input: move on once the answer is in the spec (and proven), or expire."""
    asked = builder.cp.pending_input
    if asked is None:
        return builder.commit(RunEvent.INPUT_RECEIVED, detail="no pending question recorded")
    return _leave_wait(
        builder,
        settings,
        RunEvent.INPUT_RECEIVED,
        "answer",
        asked.request_id,
        "answers",
        awaited_key(asked),
        builder.run.spec.answers,
        clear="pending_input",
        expires_at=asked.expires_at,
        expired="InputExpired",
        # A server's question is asked mid-action: its step goes on once the action settles.
        advance=not is_server_question(asked.request_id),
    )


def leave_external_wait(builder: CommitBuilder, settings: Settings) -> Decision:
    """In waiting_external on an event: move on once the event is in the spec (and proven), or expire."""
    awaited = builder.cp.pending_external
    if awaited is None:
        return builder.commit(RunEvent.EXTERNAL_RECEIVED, detail="no pending event recorded")
    return _leave_wait(
        builder,
        settings,
        RunEvent.EXTERNAL_RECEIVED,
        "event",
        awaited.request_id,
        "events",
        awaited_key(awaited),
        builder.run.spec.events,
        clear="pending_external",
        expires_at=awaited.expires_at,
        expired="ExternalEventExpired",
    )


def _leave_wait(
    builder: CommitBuilder,
    settings: Settings,
    event: RunEvent,
    kind: str,
    request_id: str,
    field_name: DeliveryField,
    key: str,
    delivered: Mapping[str, str],
    *,
    clear: str,
    expires_at: datetime,
    expired: str,
    advance: bool = True,
) -> Decision:
    """An answer or event arrived: once its seal proves the webhook admitted it, record a
    reference to it (never its text) and move on; else refuse it and ask again under a new key.

    Nothing arrived: expire at the expiry, or stay idle until then.
    """
    value = delivered.get(key)
    if value is None:
        return _expire_or_idle(builder, expires_at, expired, builder.run.spec.deadline)
    cp, run = builder.cp, builder.run
    try:
        data_key = run_data_key(run, cp, settings)
    except UndecryptableError as err:  # nothing can be verified: never act on it
        return builder.commit(
            RunEvent.QUARANTINE,
            outcome=Outcome(
                reason="Undecryptable", message=f"spec.{field_name}[{key}] cannot be verified: {err}"
            ),
        )
    problem = delivery_unproven(data_key, field_name, key, value)
    if problem is not None:
        return _ask_again(builder, field_name, key, delivered, clear, problem)
    ref = ExternalEvidenceRef(
        id=f"{kind}-{request_id}",
        step_index=cp.position.step,
        recorded_at=builder.now,
        uri=delivery_uri(run, field_name, key),
        content_digest=canonical_digest(value),
    )
    checkpoint = cp.model_copy(
        update={
            "input_refs": [*cp.input_refs, ref],
            clear: None,
            "position": cp.position.model_copy(update={"step": cp.position.step + int(advance)}),
        }
    )
    return builder.commit(
        event, checkpoint=checkpoint, detail=f"{kind} {'to ' if kind == 'answer' else ''}{key}"
    )


def run_data_key(run: RunSnapshot, cp: Checkpoint, settings: Settings) -> DataKey | None:
    """The run's data key (None: a run that never had one); :class:`UndecryptableError` when it has
    one this operator cannot open (no keyring, the key retired), or not the one it had."""
    if run.data_key is None and cp.data_key_digest is None:
        return None
    if run.data_key is None:
        raise UndecryptableError(
            "",
            f"the run had a data key and its {DATA_KEY_ANNOTATION} annotation is gone: removed by "
            "someone other than the operator, so no answer or event of it can be verified",
        )
    if settings.keyring is None:
        raise UndecryptableError("", "this operator has no sealing keyring to open the run's data key")
    data_key = open_data_key(settings.keyring, run.data_key, run.namespace, run.name)
    if cp.data_key_digest is not None and fingerprint(data_key) != cp.data_key_digest:
        raise UndecryptableError(
            "",
            f"the run's {DATA_KEY_ANNOTATION} annotation holds another data key than the one it "
            "had: replaced by someone other than the operator",
        )
    return data_key


def delivery_uri(run: RunSnapshot, field_name: str, key: str) -> str:
    return f"agentrun://{run.namespace}/{run.name}/spec.{field_name}/{key}"


def delivered_key(cp: Checkpoint, step_index: int, field_name: str) -> str | None:
    """The ``spec.<field_name>`` key whose value the wait at ``step_index`` moved on with (its
    reference records it), or None."""
    marker = f"/spec.{field_name}/"
    for ref in reversed(cp.input_refs):
        if isinstance(ref, ExternalEvidenceRef) and ref.step_index == step_index and marker in ref.uri:
            return ref.uri.rsplit(marker, 1)[1]
    return None


def _ask_again(
    builder: CommitBuilder,
    field_name: DeliveryField,
    key: str,
    delivered: Mapping[str, str],
    clear: str,
    problem: Unproven,
) -> Decision:
    """Refuse the value under ``key`` once and wait for the same question or event under a new key
    (``key`` stays taken: the map is append-only). Through resume validation, back into the wait
    recorded in the checkpoint (:func:`recorded_wait`), as a refused approval decision is asked again."""
    cp = builder.cp
    taken = {*delivered, *(r.key for r in builder.run.status.refused_requests if r.field == field_name)}
    new = next_key(key, taken)
    pending = getattr(cp, clear)
    checkpoint = cp.model_copy(update={clear: pending.model_copy(update={"key": new})})
    commit = builder.commit(
        RunEvent.REVALIDATION_REQUIRED,
        checkpoint=checkpoint,
        detail=f"spec.{field_name}[{key}] refused ({problem.reason}): asked again as {new}",
    )
    said = Unproven(problem.reason, f"{problem.message}; asked again as spec.{field_name}[{new}]")
    return refuse_in(commit, refusal_of(field_name, key, said, builder.now))


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
            RunEvent.INPUT_REQUESTED, waiting_for=f"input:{awaited_key(cp.pending_input)}", detail=detail
        )
    if cp.pending_external is not None:
        return builder.commit(
            RunEvent.EXTERNAL_AWAITED, waiting_for=f"event:{awaited_key(cp.pending_external)}", detail=detail
        )
    if cp.retry.retry_at is not None:
        commit = builder.commit(
            RunEvent.RETRY_SCHEDULED, waiting_for=f"retry:{cp.retry.retry_at.isoformat()}", detail=detail
        )
        commit.status.retry_at = cp.retry.retry_at
        return commit
    return None
