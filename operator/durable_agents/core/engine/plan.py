"""A ready run takes the planner's next step: read, ask, await, act, start a child, or finish."""

from __future__ import annotations

from dataclasses import replace

from durable_agents.api.v1alpha1 import ActionTier, Outcome
from durable_agents.core.agent.mcp_sampling import SamplingAllowance, sampling_allowance
from durable_agents.core.agent.planner import ModelPlanner, ModelTurnNeeded
from durable_agents.core.checkpoint import PendingAction, ToolCallRecord
from durable_agents.core.destinations import effect_refusal
from durable_agents.core.engine.actions import action_spec
from durable_agents.core.engine.approvals import approved_for, request_approval
from durable_agents.core.engine.children import start_child
from durable_agents.core.engine.commits import CommitBuilder
from durable_agents.core.engine.currency import policy_moved
from durable_agents.core.engine.decisions import Commit, Decision, NeedRead, NeedToolCall
from durable_agents.core.engine.model_turns import limits_of, model_turn, settle_finished, settle_read
from durable_agents.core.engine.retries import attempt_failed
from durable_agents.core.engine.snapshot import ModelAnswer, ReadResult, RunSnapshot, Settings
from durable_agents.core.engine.subagents import start_sub_agent
from durable_agents.core.engine.waits import ask_human, await_event
from durable_agents.core.ledger import action_record_name
from durable_agents.core.planner import (
    AskHuman,
    AwaitEvent,
    Finish,
    PerformEffect,
    PlannedStep,
    Planner,
    PlannerError,
    PlanningContext,
    ReadObject,
    ReadTool,
    StartChild,
    StartSubAgent,
)
from durable_agents.core.policy_resolution import POLICY_REQUIRED, policy_required_message
from durable_agents.core.statemachine import RunEvent


def plan(
    builder: CommitBuilder,
    run: RunSnapshot,
    planner: Planner,
    settings: Settings,
    read: ReadResult | None,
    model: ModelAnswer | None = None,
) -> Decision:
    """Ask the planner for the next step and carry it out (a planner error fails the attempt)."""
    if isinstance(planner, ModelPlanner):
        return _plan_model(builder, run, planner, settings, read, model)
    try:
        step = planner.next_step(PlanningContext(run.spec, builder.cp))
    except PlannerError as err:
        return builder.commit(RunEvent.ATTEMPT_FAILED, outcome=Outcome(reason=err.reason, message=str(err)))
    return _carry_out(builder, run, step, settings, read)


def _sampling(
    builder: CommitBuilder, planner: ModelPlanner, settings: Settings, step: ReadTool
) -> SamplingAllowance | None:
    """What the read's server may sample of the run's model: its policy grant, within what the
    run's limits leave."""
    return sampling_allowance(
        settings.policy,
        server=step.server,
        url=step.url,
        model=planner.inputs.model,
        facts=builder.cp.agent,
        limits=limits_of(planner, settings),
    )


def _plan_model(
    builder: CommitBuilder,
    run: RunSnapshot,
    planner: ModelPlanner,
    settings: Settings,
    read: ReadResult | None,
    model: ModelAnswer | None,
) -> Decision:
    """The model planner: settle the call whose step ended, then carry out the pending call, or ask
    the model for the next one. A failed read is the call's result (the model is told), not the
    run's failure."""
    settle_finished(builder, run, planner)
    try:
        step = planner.next_step(PlanningContext(run.spec, builder.cp))
    except ModelTurnNeeded as need:
        return model_turn(builder, planner, settings, need.request, model)
    except PlannerError as err:
        return builder.commit(RunEvent.ATTEMPT_FAILED, outcome=Outcome(reason=err.reason, message=str(err)))
    index = builder.cp.position.step
    if isinstance(step, StartSubAgent):
        return start_sub_agent(builder, run, step, limits_of(planner, settings), settings.keyring)
    if isinstance(step, ReadTool):
        if read is None or read.step_index != index:
            return NeedToolCall(index, step, _sampling(builder, planner, settings, step))
        builder.cp = settle_read(builder, planner, read)
        cp = builder.cp
        outcome = "failed" if read.error_reason else "answered"
        return builder.commit(
            RunEvent.STEP_COMPLETED,
            checkpoint=cp.model_copy(update={"position": cp.position.model_copy(update={"step": index + 1})}),
            detail=f"MCP tool {step.server}/{step.tool} {outcome}: told the model",
        )
    if isinstance(step, ReadObject) and read is not None and read.step_index == index:
        builder.cp = settle_read(builder, planner, read)
        if read.evidence is None:
            cp = builder.cp
            return builder.commit(
                RunEvent.STEP_COMPLETED,
                checkpoint=cp.model_copy(
                    update={"position": cp.position.model_copy(update={"step": index + 1})}
                ),
                detail=f"read {step.ref.kind}/{step.ref.name} failed ({read.error_reason}): told the model",
            )
    return _carry_out(builder, run, step, settings, read)


def _carry_out(
    builder: CommitBuilder, run: RunSnapshot, step: PlannedStep, settings: Settings, read: ReadResult | None
) -> Decision:
    if isinstance(step, ReadObject):
        return _read_object(builder, step, settings, read)
    if isinstance(step, AskHuman):
        return ask_human(builder, step, settings)
    if isinstance(step, AwaitEvent):
        return await_event(builder, step, settings)
    if isinstance(step, PerformEffect):
        return _perform_effect(builder, run, step, settings)
    if isinstance(step, StartChild):
        return start_child(builder, run, step)
    if isinstance(step, ReadTool | StartSubAgent):  # only the model planner proposes these
        return builder.commit(
            RunEvent.ATTEMPT_FAILED,
            outcome=Outcome(
                reason="PlannerError", message=f"step {step.name}: the call needs the model planner"
            ),
        )
    assert isinstance(step, Finish)
    return _finish(builder, step)


def _read_object(
    builder: CommitBuilder, step: ReadObject, settings: Settings, read: ReadResult | None
) -> Decision:
    """The shell reads first; its result for THIS step is recorded as evidence, or fails the attempt."""
    cp, now = builder.cp, builder.now
    index = cp.position.step
    if read is None or read.step_index != index:
        return NeedRead(index, step.name, step.ref)
    if read.evidence is None:
        return attempt_failed(
            builder,
            settings,
            read.error_reason or "ReadFailed",
            read.error_message,
            f"read {step.ref.kind}/{step.ref.name} failed",
        )
    call = ToolCallRecord(
        id=f"call-{index}-{step.name}",
        tool="kubernetes.read",
        step_index=index,
        started_at=now,
        finished_at=now,
        outcome="succeeded",
        result_ref=read.evidence.id,
        attempt=cp.retry.attempts,
    )
    return builder.commit(
        RunEvent.STEP_COMPLETED,
        checkpoint=cp.model_copy(
            update={
                "evidence": [*cp.evidence, read.evidence],
                "tool_calls": [*cp.tool_calls, call],
                "position": cp.position.model_copy(update={"step": index + 1}),
            }
        ),
        detail=f"read {step.ref.kind}/{step.ref.name}@{read.evidence.resource_version}",
    )


DESTINATION_NOT_ALLOWED = "DestinationNotAllowed"


def _destination_refused(run: RunSnapshot, step: PerformEffect, settings: Settings, index: int) -> str | None:
    """Why the effect's target is outside the run's policy's ``spec.destinations`` now, or None."""
    if settings.policy is None:
        return None
    where = f"tool {step.tool} target" if step.tool else f"spec.steps[{index}].effect.target"
    source = f"AgentPolicy {run.namespace}/{settings.policy_name}"
    return effect_refusal(source, settings.policy, step.effect, step.target, where)


def _perform_effect(
    builder: CommitBuilder, run: RunSnapshot, step: PerformEffect, settings: Settings
) -> Commit:
    """Commit the effect's intent and wait for its outcome; first an approval, if the policy wants one."""
    cp = builder.cp
    index = cp.position.step
    refused = _destination_refused(run, step, settings, index)
    if refused is not None:  # nothing to approve or send: the policy does not allow where it lands
        return attempt_failed(
            builder, settings, DESTINATION_NOT_ALLOWED, refused, f"step {step.name}: refused"
        )
    spec = action_spec(run, index, step, settings, cp.retry.attempts)
    policy = settings.policy
    approved = None
    if policy is None and settings.policy_required and spec.tier is not ActionTier.READ_ONLY:
        return builder.commit(  # ungoverned: read-only work only, and nothing is sent
            RunEvent.ATTEMPT_FAILED,
            outcome=Outcome(
                reason=POLICY_REQUIRED, message=policy_required_message(step.effect, spec.tier.value)
            ),
        )
    if policy is not None and spec.tier in policy.approval_required_tiers:
        approved = approved_for(cp, index, run, spec, step)
        if approved is None:
            return request_approval(builder, run, spec, step, settings, reason=f"{spec.tier.value} effect")
        # Revalidated under another policy version (one write earlier, or decided before it):
        # the intent is committed only under the version its approval still binds.
        moved = policy_moved(approved.policy_version, settings)
        if moved is not None:
            return request_approval(builder, run, spec, step, settings, reason=f"{moved} since the approval")
    name = action_record_name(spec.idempotency_key)
    action = PendingAction(
        idempotency_key=spec.idempotency_key,
        action_record_name=name,
        effect=step.effect,
        tier=spec.tier.value,
        step_index=index,
        approval_request_id=approved.request_id if approved else None,
    )
    # The intent is committed before anything is dispatched: no effect happens that the run's
    # checkpoint does not already name.
    commit = builder.commit(
        RunEvent.EXTERNAL_AWAITED,
        checkpoint=cp.model_copy(update={"pending_actions": [*cp.pending_actions, action]}),
        waiting_for=f"action:{name}",
        detail=f"intent {step.effect} key={spec.idempotency_key}",
    )
    return replace(commit, intents=(spec,))


def _finish(builder: CommitBuilder, step: Finish) -> Commit:
    cp = builder.cp
    return builder.commit(
        RunEvent.SUCCEEDED,
        checkpoint=cp.model_copy(
            update={"position": cp.position.model_copy(update={"step": cp.position.step + 1})}
        ),
        outcome=Outcome(reason="Completed", message=f"finished at step {step.name}", result=step.result),
    )
