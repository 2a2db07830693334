"""The model planner's turns in the engine: ask, record the proposal, settle it once its step ended.

A model call is never a commit of its own: what the model proposed is a transition of the batch
(``step_completed``, ready -> ready) that is written with the next semantic boundary (an approval
request, an intent, a wait, the end). A crash before that write repeats the call; the reference
model server answers a repeated request identically, and a real model may not, which is why
nothing the model proposed acts before it is committed (and approved, where the policy says so).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from durable_agents.api.v1alpha1 import Outcome
from durable_agents.core.agent.context import start_facts
from durable_agents.core.agent.exchange import ModelRequest
from durable_agents.core.agent.interpret import CallMcpTool, FinalAnswer, ProposedCall, ToolError, interpret
from durable_agents.core.agent.limits import AgentLimits, exceeded
from durable_agents.core.agent.planner import ModelPlanner
from durable_agents.core.agent_facts import (
    AgentFacts,
    ModelTurn,
    SettledOutcome,
    TokenUsage,
    new_turn,
    sealed_answer,
    settle_last,
    turn_arguments,
    with_model_call,
    with_turn,
)
from durable_agents.core.checkpoint import Checkpoint, PendingAction
from durable_agents.core.engine.actions import TakeResponse
from durable_agents.core.engine.commits import CommitBuilder
from durable_agents.core.engine.decisions import Decision, NeedModelTurn
from durable_agents.core.engine.retries import attempt_failed
from durable_agents.core.engine.snapshot import (
    ActionObservation,
    ModelAnswer,
    ReadResult,
    RunSnapshot,
    Settings,
)
from durable_agents.core.engine.waits import delivered_key
from durable_agents.core.sealed_values import ValueSealingError, is_sealed, outcome_label, unseal_value
from durable_agents.core.statemachine import RunEvent

EMPTY_REPLY = "ModelReplyEmpty"


def _facts(cp: Checkpoint, planner: ModelPlanner) -> AgentFacts:
    if cp.agent is not None:
        return cp.agent
    inputs = planner.inputs
    return start_facts(model=inputs.model, system_prompt=inputs.system_prompt, tools=inputs.tools)


def limits_of(planner: ModelPlanner, settings: Settings) -> AgentLimits:
    """The planner's limits, with those its Agent sets, then those the run's policy sets instead
    (a limit both set: the lower, so an Agent never raises what its policy allows)."""
    agent = dict(planner.inputs.agent_limits)
    limits = replace(planner.inputs.limits, **agent)
    policy = settings.policy
    if policy is None:
        return limits
    chosen = {
        k: min(v, agent[k]) if k in agent else v
        for k, v in policy.agent_limits.model_dump().items()
        if v is not None
    }
    return replace(limits, **chosen)


def model_turn(
    builder: CommitBuilder,
    planner: ModelPlanner,
    settings: Settings,
    request: ModelRequest,
    answer: ModelAnswer | None,
) -> Decision:
    """No call pending: within the run's limits, ask the model (or take its answer) and record it."""
    cp, inputs = builder.cp, planner.inputs
    facts = _facts(cp, planner)
    limits = limits_of(planner, settings)
    over = exceeded(facts, limits, calls_since_boundary=0)
    if over is not None:
        return builder.commit(
            RunEvent.ATTEMPT_FAILED, outcome=Outcome(reason="AgentLimitExceeded", message=over)
        )
    step_index = cp.position.step
    if answer is None or answer.request_digest != request.digest():
        return NeedModelTurn(request, step_index)
    if answer.reply is None:
        reason = answer.failure_reason or "ModelError"
        if not answer.retryable:
            return builder.commit(
                RunEvent.ATTEMPT_FAILED, outcome=Outcome(reason=reason, message=answer.failure_message)
            )
        return attempt_failed(builder, settings, reason, answer.failure_message, "model call failed")
    reply = answer.reply
    if reply.is_empty:  # the shell names the endpoint first; no reply without either completes a run
        message = "the model answered with no content and no tool calls"
        return attempt_failed(builder, settings, EMPTY_REPLY, message, "model call failed")
    usage = TokenUsage(input_tokens=reply.usage.input_tokens, output_tokens=reply.usage.output_tokens)
    proposal = interpret(reply, inputs.tools, step_index=step_index)
    if isinstance(proposal, FinalAnswer):
        facts = with_model_call(facts, usage)
        return builder.commit(
            RunEvent.SUCCEEDED,
            checkpoint=cp.model_copy(
                update={"agent": facts, "position": cp.position.model_copy(update={"step": step_index + 1})}
            ),
            outcome=Outcome(
                reason="Completed",
                message=f"the model answered at step {step_index}",
                result=sealed_answer(inputs.data_key, proposal.text, entropy=inputs.entropy),
            ),
        )
    return _record(builder, planner, facts, proposal, usage, limits)


def _record(
    builder: CommitBuilder,
    planner: ModelPlanner,
    facts: AgentFacts,
    proposal: ProposedCall | ToolError,
    usage: TokenUsage,
    limits: AgentLimits,
) -> Decision:
    """A proposed call, pending until its step is carried out; or a bad call, refused with the
    reason the model is told (the run fails after too many in a row)."""
    cp, inputs = builder.cp, planner.inputs
    step_index = cp.position.step
    index = len(facts.turns)
    if isinstance(proposal, ToolError):
        turn = new_turn(
            inputs.data_key,
            entropy=inputs.entropy,
            index=index,
            call_id=proposal.call_id,
            tool=proposal.tool,
            arguments=proposal.arguments,
            reason=proposal.reason,
            step_index=step_index,
            usage=usage,
            refusal=proposal.message,
            dropped_tools=proposal.dropped,
        )
        facts = with_turn(facts, turn)
        if facts.tool_errors >= limits.max_consecutive_tool_errors:
            message = f"{facts.tool_errors} bad tool calls in a row; the last: {proposal.message}"
            return builder.commit(
                RunEvent.ATTEMPT_FAILED,
                checkpoint=cp.model_copy(update={"agent": facts}),
                outcome=Outcome(reason="ToolCallsInvalid", message=message[:1024]),
            )
        return builder.commit(
            RunEvent.STEP_COMPLETED,
            checkpoint=cp.model_copy(update={"agent": facts}),
            detail=(
                f"model call {proposal.call_id} refused: {proposal.message}"[:256]
                + _not_executed(proposal.dropped)
            ),
        )
    assert isinstance(proposal, ProposedCall)
    # An MCP call's tier is fixed now, with the proposal: no later listing lowers it.
    step = proposal.step
    tier = planner.proposed_tier(step, builder.run.spec) if isinstance(step, CallMcpTool) else None
    turn = new_turn(
        inputs.data_key,
        entropy=inputs.entropy,
        index=index,
        call_id=proposal.call_id,
        tool=proposal.tool.name,
        arguments=proposal.arguments,
        reason=proposal.reason,
        step_index=step_index,
        usage=usage,
        dropped_tools=proposal.dropped,
        tier=tier,
    )
    return builder.commit(
        RunEvent.STEP_COMPLETED,
        checkpoint=cp.model_copy(update={"agent": with_turn(facts, turn)}),
        detail=f"model proposed {proposal.tool.name} ({proposal.call_id}) at step {step_index}"
        + _not_executed(proposal.dropped),
    )


def _not_executed(dropped: tuple[str, ...]) -> str:
    """What the history says about a reply's further calls (the model is told in its next request)."""
    return f"; not executed (one call per turn): {', '.join(dropped)}"[:256] if dropped else ""


def settle_read(builder: CommitBuilder, planner: ModelPlanner, read: ReadResult) -> Checkpoint:
    """The pending read call's result, before the read step commits: the object the model asked
    for (sealed and bounded), or why it could not be read."""
    cp = builder.cp
    assert cp.agent is not None
    outcome: SettledOutcome = "succeeded"
    result: dict[str, Any]
    if read.error_reason is not None or (read.evidence is None and read.content is None):
        outcome = "failed"
        result = {"error": read.error_reason or "ReadFailed", "message": read.error_message}
    elif read.evidence is None:  # an MCP tool's answer
        result = dict(read.content or {})
    else:
        ref = read.evidence
        result = {
            "object": dict(read.content) if read.content is not None else None,
            "resourceVersion": ref.resource_version,
            "contentDigest": ref.content_digest,
        }
    inputs = planner.inputs
    facts = settle_last(cp.agent, inputs.data_key, entropy=inputs.entropy, outcome=outcome, result=result)
    if read.sampled_calls:  # the server's samples are model calls of the run, counted at this commit
        used = TokenUsage(input_tokens=read.sampled_input_tokens, output_tokens=read.sampled_output_tokens)
        facts = with_model_call(facts, used, calls=read.sampled_calls)
    return cp.model_copy(update={"agent": facts})


def settle_finished(builder: CommitBuilder, run: RunSnapshot, planner: ModelPlanner) -> bool:
    """Settle the pending call whose step has ended (an effect reconciled, a question answered, an
    event received): its result is what the checkpoint and the run record. Updates the builder's
    checkpoint (the next commit carries it); True if a call was settled."""
    settled = _settle(builder.cp, run, planner, response=None)
    if settled is None:
        return False
    builder.cp = settled
    return True


def effect_response_taker(run: RunSnapshot, planner: ModelPlanner) -> TakeResponse:
    """How the model's pending call takes the response of its action once the ledger recorded it
    succeeded: settled in the same commit as the outcome, with the response as the ledger holds it
    (the ActionRecord's outcome, whose stamp the shell verified), sealed into the turn. A restart
    rebuilds the model's request from the turn: the same response, and the effect is not asked again."""

    def take(cp: Checkpoint, action: PendingAction, seen: ActionObservation) -> Checkpoint:
        response = _recorded_response(planner, action.action_record_name, seen.outcome)
        return _settle(cp, run, planner, response=response) or cp

    return take


def _recorded_response(planner: ModelPlanner, record_name: str, outcome: Any) -> Any:
    """The ActionRecord's outcome, unsealed with the run's key (the dispatcher sealed it under the
    record's label): an MCP tool's content, an ``http.post``'s status and bounded body."""
    if outcome is None or not is_sealed(outcome):
        return outcome  # a run without a data key stores its responses as they come
    try:
        return unseal_value(planner.inputs.data_key, outcome, outcome_label(record_name))
    except ValueSealingError:
        return {"error": "the recorded response cannot be opened with this run's key"}


def _settle(cp: Checkpoint, run: RunSnapshot, planner: ModelPlanner, *, response: Any) -> Checkpoint | None:
    """``cp`` with its pending call settled, if its step has ended (None if not): its outcome,
    what was delivered to it, and the response of its action (``response``) when one was recorded."""
    pending = cp.agent.pending if cp.agent is not None else None
    if pending is None:
        return None
    calls = [c for c in cp.tool_calls if c.step_index == pending.step_index]
    in_flight = any(a.step_index == pending.step_index for a in cp.pending_actions)
    failed = bool(calls) and calls[-1].outcome == "failed" and not in_flight
    if pending.step_index >= cp.position.step and not failed:
        return None
    result: dict[str, Any] = {"step": pending.step_index}
    if calls:
        result.update(outcome=calls[-1].outcome, error=calls[-1].error)
    if response is not None:
        result["response"] = response
    delivered = _delivered(run, planner, pending, cp)
    if delivered is not None:
        result["delivered"] = delivered
    outcome: SettledOutcome = "failed" if failed else "succeeded"
    assert cp.agent is not None
    inputs = planner.inputs
    facts = settle_last(cp.agent, inputs.data_key, entropy=inputs.entropy, outcome=outcome, result=result)
    position = cp.position.model_copy(update={"step": max(cp.position.step, pending.step_index + 1)})
    return cp.model_copy(update={"agent": facts, "position": position})


def _delivered(run: RunSnapshot, planner: ModelPlanner, turn: ModelTurn, cp: Checkpoint) -> Any:
    """What a person answered the model's question (``spec.answers``, under the key the wait moved
    on with: the call's request ID, or a new one after a refused answer), or what arrived for the
    event it awaited (``spec.events``): unsealed, for the model. Only the value the wait proved
    (:mod:`durable_agents.core.deliveries`) and referenced is given."""
    arguments = turn_arguments(turn, planner.inputs.data_key)
    event = arguments.get("event") if isinstance(arguments, dict) else None
    request_id = f"agent-{turn.step_index}"
    answered = delivered_key(cp, turn.step_index, "answers")
    arrived = delivered_key(cp, turn.step_index, "events")
    if answered is None and arrived is None:  # a checkpoint from before keys were recorded this way
        answered, arrived = request_id, event if isinstance(event, str) else None
    for label, value in (
        (f"answers/{answered}", run.spec.answers.get(answered) if answered else None),
        (f"events/{arrived}", run.spec.events.get(arrived) if arrived else None),
    ):
        if value is None:
            continue
        if not is_sealed(value):
            return value  # no data key at admission: stored as written
        try:
            return unseal_value(planner.inputs.data_key, value, label)
        except ValueSealingError:
            return {"error": "the delivered value cannot be opened with this run's key"}
    return None


__all__ = ["effect_response_taker", "model_turn", "settle_finished", "settle_read"]
