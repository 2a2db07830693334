"""The entry point: from a snapshot of a run to what happens next, by the run's state.

A run is accepted only if the operator can verify that its creator may act as its ServiceAccount
(the admission webhook's stamp in ``spec.createdBy``); otherwise it fails at acceptance
(``ServiceAccountNotAuthorized``) before any read, effect or child. A run an earlier operator
accepted (it has a checkpoint and has left ``pending``) is not asked again: that operator
checked what it checked then, and ``serviceAccountName`` and ``createdBy`` are immutable.
"""

from __future__ import annotations

from datetime import datetime

from durable_agents.api.v1alpha1 import Outcome
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.agent.mcp_questions import is_server_question
from durable_agents.core.agent.planner import ModelPlanner
from durable_agents.core.authority import Unproven, service_account_unproven
from durable_agents.core.checkpoint import Checkpoint, Fencing, Loaded, Quarantine
from durable_agents.core.durations import InvalidDuration
from durable_agents.core.engine.actions import pending_specs, reconcile_actions
from durable_agents.core.engine.approvals import await_decision, definition_rule, kept_definition
from durable_agents.core.engine.cancellation import (
    cancellation_of_step,
    cancellation_to_refuse,
    finish_cancel,
    handle_cancel,
    next_cancellation,
)
from durable_agents.core.engine.children import reconcile_children, running_children
from durable_agents.core.engine.commits import (
    CommitBuilder,
    already_refused,
    commit_forged,
    commit_untouched,
    refusal_of,
    refuse,
)
from durable_agents.core.engine.decisions import Commit, Decision, Idle, NeedActions
from durable_agents.core.engine.loading import (
    UNBOUND_STATES,
    forged_position,
    initial_checkpoint,
    load_stored,
)
from durable_agents.core.engine.model_turns import effect_response_taker
from durable_agents.core.engine.plan import plan
from durable_agents.core.engine.quarantine import cancel_unreadable, enter_quarantine, quarantine_controls
from durable_agents.core.engine.retries import retry_when_due
from durable_agents.core.engine.runtime import deployment_change
from durable_agents.core.engine.snapshot import NOTHING_OBSERVED, Observations, RunSnapshot, Settings
from durable_agents.core.engine.subagents import reconcile_sub_agents
from durable_agents.core.engine.validation import resume_validation
from durable_agents.core.engine.waits import (
    ask_server_input,
    closed_server_question,
    leave_external_wait,
    leave_input_wait,
)
from durable_agents.core.plan_guard import SPEC_CHANGED, changed_since_accepted
from durable_agents.core.planner import Planner
from durable_agents.core.positions import stamp_position
from durable_agents.core.reconciliations import reconciliation_to_refuse
from durable_agents.core.statemachine import RunEvent


def decide(
    run: RunSnapshot,
    *,
    now: datetime,
    epoch: Fencing,
    planner: Planner,
    settings: Settings | None = None,
    observed: Observations = NOTHING_OBSERVED,
) -> Decision:
    """The next thing to do for ``run``: :class:`Idle`, a request to the shell, or a :class:`Commit`.

    ``observed`` is what the shell observed after an earlier answer asked for it; each part is
    ignored unless the run is at the point that needs it.
    A commit leaves here with its position stamp over its final status (:mod:`..positions`).
    """
    settings = settings or Settings()
    decision = _decide(run, now, epoch, planner, settings, observed)
    if isinstance(decision, Commit) and settings.keyring is not None:
        decision.status.position_stamp = stamp_position(settings.keyring, run.run_id, decision.status)
    return decision


def _decide(
    run: RunSnapshot,
    now: datetime,
    epoch: Fencing,
    planner: Planner,
    settings: Settings,
    observed: Observations,
) -> Decision:
    state = run.state
    parked = _unbound(run, now, epoch, settings)
    if parked is not None:
        return parked
    # A cancellation in progress finishes reconciling even past the deadline: no new work starts.
    past_deadline = (
        run.spec.deadline is not None and now >= run.spec.deadline and state is not RunState.CANCEL_REQUESTED
    )
    never_accepted = state is RunState.PENDING or run.raw_checkpoint is None
    unauthorized = (
        service_account_unproven(
            settings.keyring,
            run.namespace,
            run.name,
            run.spec,
            run.created_at,
            settings.untimed_stamps_before,
        )
        if never_accepted and not past_deadline
        else None
    )
    if unauthorized is not None and state is not RunState.PENDING:
        # No checkpoint, yet not pending: a status the operator did not write. Nothing runs.
        return commit_untouched(
            run,
            now,
            epoch,
            RunEvent.QUARANTINE,
            _not_authorized(unauthorized),
            "ServiceAccountNotAuthorized",
        )
    if state is RunState.PENDING and run.raw_checkpoint is None and not past_deadline:
        return _accept(run, now, epoch, settings, unauthorized)

    loaded = (
        Loaded(Checkpoint.model_validate(initial_checkpoint(run, now, epoch, settings)))
        if run.raw_checkpoint is None
        else load_stored(run, settings)
    )
    if isinstance(loaded, Quarantine):
        if state is RunState.CANCEL_REQUESTED:
            return cancel_unreadable(run, now, epoch, loaded)
        return enter_quarantine(run, now, epoch, loaded)
    forged = forged_position(run, settings)
    if forged is not None:
        return enter_quarantine(run, now, epoch, forged)
    # A cancellation in progress finishes (it starts nothing new); anything else only on the spec
    # the run was accepted with (core/plan_guard.py: the spec policy's second line).
    changed = None if state is RunState.CANCEL_REQUESTED else spec_changed(run, loaded.checkpoint)
    if changed is not None:
        return enter_quarantine(run, now, epoch, changed)
    builder = CommitBuilder(run, loaded, now, epoch, settings)
    if past_deadline:
        assert run.spec.deadline is not None
        return builder.commit(
            RunEvent.DEADLINE_EXCEEDED,
            outcome=Outcome(
                reason="DeadlineExceeded",
                message=f"the run's deadline {run.spec.deadline.isoformat()} passed",
            ),
        )
    if unauthorized is not None:  # pending with a checkpoint (a takeover fenced it first)
        return _reject(builder, unauthorized)
    try:
        return _by_state(builder, planner, settings, observed)
    except InvalidDuration as err:
        return _invalid_duration(builder, err)


def _unbound(run: RunSnapshot, now: datetime, epoch: Fencing, settings: Settings) -> Decision | None:
    """A state the checkpoint need not bind (an end, a quarantine, a cancellation) is verified
    before anything acts on it (any other is bound to the checkpoint once that is loaded); an end
    is idle and a quarantine moves only on a person's control. None: decide by the checkpoint."""
    forged = forged_position(run, settings) if run.state in UNBOUND_STATES else None
    if forged is not None:
        return commit_forged(run, now, epoch, forged.message)
    if run.state.terminal:
        return Idle(reason=f"run is {run.state.value}")
    if run.state is RunState.QUARANTINED:
        return quarantine_controls(run, now, epoch, settings)
    return None


def _invalid_duration(builder: CommitBuilder, err: InvalidDuration) -> Commit:
    """A duration of the run or its policy that does not parse (too long, overflowing: admission
    refuses these, but one stored before may remain) fails the attempt for good, with a reason:
    deciding again would only fail again. Retrying is no way out (its backoff may be the culprit)."""
    outcome = Outcome(reason="InvalidDuration", message=f"a duration of this run or its policy: {err}")
    event = (
        RunEvent.ATTEMPT_FAILED
        if builder.run.state in (RunState.READY, RunState.RESUME_VALIDATION)
        else RunEvent.QUARANTINE
    )
    return builder.commit(event, outcome=outcome, detail=outcome.message)


def _accept(
    run: RunSnapshot, now: datetime, epoch: Fencing, settings: Settings, unauthorized: Unproven | None
) -> Commit:
    cp = Checkpoint.model_validate(initial_checkpoint(run, now, epoch, settings))
    builder = CommitBuilder(run, Loaded(cp), now, epoch, settings)
    if unauthorized is not None:
        return _reject(builder, unauthorized)
    return _accepted(builder, settings)


def _accepted(builder: CommitBuilder, settings: Settings) -> Commit:
    """Accepted; a run of an Agent with its definition pinned, or failed saying why it cannot be."""
    name, cp = builder.run.spec.agent_ref, builder.cp
    if name is None:
        return builder.commit(RunEvent.ACCEPTED, detail="spec accepted")
    pinned = cp.definition or settings.definition
    if pinned is None:
        why = settings.definition_refused or f"the definition of Agent {name!r} was not resolved"
        return builder.commit(
            RunEvent.REJECTED,
            outcome=Outcome(reason="DefinitionUnusable", message=why),
            detail=f"not accepted: {why}",
        )
    return builder.commit(
        RunEvent.ACCEPTED,
        checkpoint=cp.model_copy(update={"definition": pinned}),
        detail=f"spec accepted; Agent {name} pinned at {pinned.digest}",
    )


def _reject(builder: CommitBuilder, problem: Unproven) -> Commit:
    """Not accepted: the run never acts as its ServiceAccount (nothing was read, done or started)."""
    return builder.commit(
        RunEvent.REJECTED, outcome=_not_authorized(problem), detail=f"not accepted: {problem.message}"
    )


def spec_changed(run: RunSnapshot, checkpoint: Checkpoint) -> Quarantine | None:
    """An accepted run whose spec is not the plan its checkpoint recorded at acceptance."""
    problem = changed_since_accepted(checkpoint.plan, run.plan)
    return None if problem is None else Quarantine(SPEC_CHANGED, problem)


def _not_authorized(problem: Unproven) -> Outcome:
    return Outcome(reason="ServiceAccountNotAuthorized", message=f"{problem.reason}: {problem.message}")


def _refused_reconciliation(run: RunSnapshot, settings: Settings, now: datetime) -> Decision | None:
    """A person's answer (``spec.reconciliations``) whose stamp does not verify, not refused yet:
    never acted on by the dispatcher; recorded once in ``status.refusedRequests``; blocks nobody."""
    unverified = reconciliation_to_refuse(
        run.run_id,
        run.spec.reconciliations,
        lambda key: already_refused(run.status, "reconciliations", key),
        settings.keyring,
    )
    return None if unverified is None else refuse(run, refusal_of("reconciliations", *unverified, now))


def _by_state(
    builder: CommitBuilder,
    planner: Planner,
    settings: Settings,
    observed: Observations,
) -> Decision:
    """A readable run within its deadline: a new cancellation request first, then its state's rule."""
    run, state = builder.run, builder.run.state
    if state is RunState.CANCEL_REQUESTED:  # it waits for unknown outcomes: say why an answer is not used
        return _refused_reconciliation(run, settings, builder.now) or finish_cancel(
            builder, run, planner, settings, observed.actions, observed.children
        )
    request = next_cancellation(run, builder.cp, settings.keyring)
    if request is not None:
        return handle_cancel(builder, run, *request)
    handled = {record.request_id for record in builder.cp.cancellations}
    refused = cancellation_to_refuse(run, handled, settings.keyring, builder.now)
    if refused is not None:
        return refuse(run, refused)
    unverified = _refused_reconciliation(run, settings, builder.now)
    if unverified is not None:
        return unverified
    if state is RunState.WAITING_INPUT:
        asked = builder.cp.pending_input
        if asked is not None and is_server_question(asked.request_id) and observed.actions is None:
            return NeedActions(pending_specs(run, builder.cp, planner, settings))  # does it still ask?
        return closed_server_question(builder, observed.actions) or leave_input_wait(builder, settings)
    if state is RunState.WAITING_EXTERNAL:
        return _waiting_external(builder, planner, settings, observed)
    if state is RunState.WAITING_APPROVAL:
        return kept_definition(builder, settings) or await_decision(builder, run, settings)
    if state is RunState.WAITING_RETRY:
        return retry_when_due(builder)
    if state is RunState.RESUME_VALIDATION:
        return resume_validation(builder, run, planner, settings, observed.fresh_evidence)
    if state is RunState.PENDING:  # a checkpoint exists but acceptance was not committed: accept again
        return _accepted(builder, settings)
    changed = deployment_change(builder, settings) or definition_rule(builder, settings)
    if changed is not None:
        return changed
    return plan(builder, run, planner, settings, observed.read, observed.model)


def _waiting_external(
    builder: CommitBuilder,
    planner: Planner,
    settings: Settings,
    observed: Observations,
) -> Decision:
    """In waiting_external: on the run's actions, then its child runs, else an external event."""
    cp = builder.cp
    if cp.pending_actions:
        # A turn or tool-call cancellation of this step: an undispatched intent is canceled.
        cancel = cancellation_of_step(cp, in_flight=True) is not None
        asked = None if cancel else ask_server_input(builder, settings, observed.actions)
        if asked is not None:  # the action's system asks a person first
            return asked
        take = effect_response_taker(builder.run, planner) if isinstance(planner, ModelPlanner) else None
        return reconcile_actions(
            builder, builder.run, planner, settings, observed.actions, cancel=cancel, take=take
        )
    if running_children(cp):
        if isinstance(planner, ModelPlanner):  # a model-planned run's children are its sub-agents
            return reconcile_sub_agents(builder, builder.run, planner, settings.keyring, observed.children)
        return reconcile_children(builder, builder.run, observed.children)
    return leave_external_wait(builder, settings)
