"""Cancellation requests: a task scope ends the run ``canceled``; a turn, tool-call or children
scope abandons the current step (or its children) and the run goes on. In-flight work is always
reconciled first, never assumed undone.

Only a request the operator's admission webhook stamped is acted on. One whose stamp does not
verify is never handled (nor recorded as handled): it is refused once, and the run goes on as
if it were not there (a stamped request can still follow under another request ID).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime

from durable_agents.api.v1alpha1 import (
    ActionState,
    AgentRunStatus,
    CancellationStatus,
    CancelRequest,
    CancelScope,
    Outcome,
    RefusedRequest,
    UnreversedEffect,
)
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.authority import Unproven, cancellation_unproven
from durable_agents.core.checkpoint import CancellationRecord, Checkpoint, ExternalEvidenceRef
from durable_agents.core.engine.actions import SETTLED, pending_specs
from durable_agents.core.engine.children import children_cancel_reason, ended, running_children
from durable_agents.core.engine.commits import CommitBuilder, already_refused, refusal_of
from durable_agents.core.engine.decisions import Commit, Decision, Idle, NeedActions, NeedChildren
from durable_agents.core.engine.snapshot import ActionObservation, ChildObservation, RunSnapshot, Settings
from durable_agents.core.planner import Planner
from durable_agents.core.sealing import Keyring
from durable_agents.core.statemachine import RunEvent


def _not_handled(
    run: RunSnapshot, handled: set[str], keyring: Keyring | None
) -> Iterator[tuple[str, CancelRequest, Unproven | None]]:
    """Each cancellation request not acted on yet, in request-ID order, with why it cannot be."""
    status = run.status
    if status.cancellation is not None:
        handled = handled | {status.cancellation.request_id}
    for request_id in sorted(run.spec.cancellations):
        if request_id not in handled:
            request = run.spec.cancellations[request_id]
            yield request_id, request, cancellation_unproven(keyring, run.run_id, request_id, request)


def next_cancellation(
    run: RunSnapshot, cp: Checkpoint, keyring: Keyring | None = None
) -> tuple[str, CancelRequest] | None:
    """The first stamped cancellation request (by request ID) this run has not acted on yet."""
    handled = {record.request_id for record in cp.cancellations}
    for request_id, request, problem in _not_handled(run, handled, keyring):
        if problem is None:
            return request_id, request
    return None


def cancellation_to_refuse(
    run: RunSnapshot, handled: set[str], keyring: Keyring | None, now: datetime
) -> RefusedRequest | None:
    """The first cancellation request whose stamp does not verify and that is not refused yet."""
    status: AgentRunStatus = run.status
    for request_id, _, problem in _not_handled(run, handled, keyring):
        if problem is not None and not already_refused(status, "cancellations", request_id):
            return refusal_of("cancellations", request_id, problem, now)
    return None


def cancellation_of_step(cp: Checkpoint, *, in_flight: bool = False) -> CancellationRecord | None:
    """A turn or tool-call cancellation of the current step, to act on once nothing is in flight."""
    if not in_flight and (cp.pending_actions or running_children(cp)):
        return None
    for record in cp.cancellations:
        if (
            record.effective
            and record.scope in ("turn", "toolCall")
            and record.step_index == cp.position.step
        ):
            return record
    return None


def skip_step(cp: Checkpoint) -> Checkpoint:
    """Abandon the current step: whatever it waited on is dropped, the run goes on with the next."""
    return cp.model_copy(
        update={
            "pending_input": None,
            "pending_external": None,
            "retry": cp.retry.model_copy(update={"retry_at": None}),
            "position": cp.position.model_copy(update={"step": cp.position.step + 1}),
        }
    )


def handle_cancel(
    builder: CommitBuilder, run: RunSnapshot, request_id: str, request: CancelRequest
) -> Commit:
    """Record a new cancellation request and act on it as far as its scope allows right now."""
    cp, state = builder.cp, run.state
    scope = request.scope
    in_flight = bool(cp.pending_actions or running_children(cp))
    # What the scope covers right now; a request with nothing to cover is recorded, never applied later.
    effective = {
        CancelScope.TASK: True,
        CancelScope.TURN: True,
        CancelScope.TOOL_CALL: bool(cp.pending_actions) or state is RunState.WAITING_APPROVAL,
        CancelScope.CHILDREN: bool(running_children(cp)),
    }[scope]
    record = CancellationRecord(
        request_id=request_id,
        scope=scope.value,
        step_index=cp.position.step,
        handled_at=builder.now,
        effective=effective,
    )
    recorded = cp.model_copy(update={"cancellations": [*cp.cancellations, record]})
    why = f"{scope.value} cancellation {request_id}" + (f": {request.reason}" if request.reason else "")
    if scope is CancelScope.TASK:
        commit = builder.commit(RunEvent.CANCEL_REQUESTED, checkpoint=recorded, detail=why)
        commit.status.cancellation = CancellationStatus(
            request_id=request_id, scope=scope, reason=request.reason, requested_at=request.requested_at
        )
        return commit
    step_scoped = scope in (CancelScope.TURN, CancelScope.TOOL_CALL)
    if not effective or not step_scoped or in_flight or state is RunState.RESUME_VALIDATION:
        # Children are canceled, or in-flight work reconciles first; then the step is abandoned.
        note = "" if effective else f" (no {'tool call' if step_scoped else 'child run'} to cancel)"
        return _keep_waiting_for(builder, run, RunEvent.CANCEL_RECORDED, recorded, why + note)
    # Nothing in flight: a wait is left for resume validation (which abandons the step); a ready
    # run abandons it at once.
    return builder.commit(
        RunEvent.STEP_CANCELED,
        checkpoint=skip_step(recorded) if state is RunState.READY else recorded,
        detail=why,
    )


def _keep_waiting_for(
    builder: CommitBuilder, run: RunSnapshot, event: RunEvent, cp: Checkpoint, detail: str
) -> Commit:
    """A commit that stays in the current state: what the run waits for stays visible."""
    commit = builder.commit(event, checkpoint=cp, waiting_for=run.status.waiting_for, detail=detail)
    commit.status.approval_request = run.status.approval_request
    commit.status.retry_at = run.status.retry_at
    return commit


def finish_cancel(
    builder: CommitBuilder,
    run: RunSnapshot,
    planner: Planner,
    settings: Settings,
    actions: Mapping[str, ActionObservation] | None,
    children: Mapping[str, ChildObservation] | None,
) -> Decision:
    """No new work: cancel what was not dispatched, reconcile what was, then end ``canceled``."""
    cp = builder.cp
    if cp.pending_actions and actions is None:
        return NeedActions(pending_specs(run, cp, planner, settings), cancel=True)
    running = running_children(cp)
    if running and children is None:
        reason = children_cancel_reason(cp) or "parent canceled"
        return NeedChildren({child.name: None for child in running}, reason)
    seen = actions or {}
    seen_children = children or {}
    unsettled = [
        pending.action_record_name
        for pending in cp.pending_actions
        if (observed := seen.get(pending.action_record_name)) is None or observed.state not in SETTLED
    ]
    live = [
        child.name
        for child in running
        if (child_seen := seen_children.get(child.name)) is None or not child_seen.state.terminal
    ]
    if unsettled or live:
        # Dispatched effects are reconciled, never assumed undone: wait for their answers.
        return Idle(reason=f"reconciling before cancel: {', '.join([*unsettled, *live])}")
    unreversed, canceled = _left_behind(run, cp, seen)
    status = _cancellation_status(run, settings, unreversed, canceled)
    message = (
        f"{len(unreversed)} effect(s) happened and were not undone" if unreversed else "no effect happened"
    )
    finished = {child.name: ended(child, seen_children[child.name]) for child in running}
    commit = builder.commit(
        RunEvent.CANCEL_FINISHED,
        checkpoint=cp.model_copy(
            update={
                "pending_actions": [],
                "children": [finished.get(child.name, child) for child in cp.children],
            }
        ),
        outcome=Outcome(reason="Canceled", message=f"{status.reason or 'canceled'}; {message}"),
        detail=f"{len(canceled)} undispatched action(s) canceled; {message}",
    )
    commit.status.cancellation = status
    return commit


def _left_behind(
    run: RunSnapshot, cp: Checkpoint, seen: Mapping[str, ActionObservation]
) -> tuple[list[UnreversedEffect], list[str]]:
    """What a finished cancellation leaves behind: the effects that happened and were not undone,
    and the intents it canceled before they were dispatched."""
    names = [step.name for step in run.spec.steps]
    unreversed: list[UnreversedEffect] = []
    records = {ref.id: ref.uri for ref in cp.evidence if isinstance(ref, ExternalEvidenceRef)}
    for call in cp.tool_calls:
        uri = records.get(call.result_ref or "", "")
        if call.outcome == "succeeded" and uri.startswith("actionrecord://"):
            record = uri.rsplit("/", 1)[-1]
            unreversed.append(_unreversed(names, call.step_index, call.tool, record, "succeeded"))
    canceled: list[str] = []
    for pending in cp.pending_actions:
        observed = seen[pending.action_record_name]
        if observed.state is ActionState.SUCCEEDED:
            unreversed.append(
                _unreversed(
                    names, pending.step_index, pending.effect, pending.action_record_name, "succeeded"
                )
            )
        elif observed.state is ActionState.CANCELED:
            canceled.append(pending.action_record_name)
    return unreversed, canceled


def _cancellation_status(
    run: RunSnapshot, settings: Settings, unreversed: list[UnreversedEffect], canceled: list[str]
) -> CancellationStatus:
    """The task cancellation as reported in status, with the steps that would compensate what
    happened when the policy asks for such proposals."""
    proposed: list[str] = []
    if settings.policy is not None and settings.policy.propose_compensations:
        undone = {effect.step for effect in unreversed}
        proposed = [
            step.name
            for step in run.spec.steps
            if step.effect is not None and step.effect.compensates in undone
        ]
    prior = run.status.cancellation
    return CancellationStatus(
        request_id=prior.request_id if prior else "unknown",
        scope=CancelScope.TASK,
        reason=prior.reason if prior else "",
        requested_at=prior.requested_at if prior else None,
        unreversed_effects=unreversed[:64],
        canceled_actions=canceled[:64],
        proposed_compensations=proposed[:64],
    )


def _unreversed(names: list[str], index: int, effect: str, record: str, state: str) -> UnreversedEffect:
    step = names[index] if index < len(names) else str(index)
    return UnreversedEffect(step=step, effect=effect, action_record=record, state=state)
