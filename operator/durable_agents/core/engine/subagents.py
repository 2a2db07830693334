"""Sub-agents: a model-planned run calls another Agent as a tool; the call is a child AgentRun.

The child is a run of the called Agent (``spec.agentRef``) with the model's objective, owned by
the parent, under the parent's ServiceAccount, policy, deadline and tenant: it never has more
authority than the parent. It is named from the parent and the call's step (``<parent>-agent-N``)
and that name is committed in the parent's checkpoint before the child is created, so a crash
between the two never makes two children (the creation finds the first: AlreadyExists), and the
child is adopted only when the operator's child stamp on it verifies (:mod:`.children`).

Each child carries the Agents above it (``durable-agents.io/agent-path``, root first, ``*`` for a
run with an inline agent), stamped by the operator with the child: the parent's run refuses a call
that would make a cycle (an Agent already on the path), nest deeper than the policy's
``maxSubAgentDepth`` or start more than ``maxSubAgents`` children; each ends the run with its
reason. A run that has a parent but no path the operator stamped calls no sub-agent.

The parent waits in ``waiting_external`` (``status.waitingFor`` child:NAME). When the child ends,
its final answer (its ``outcome.result``, sealed under the run tree's data key and believed only
when the child's status stamp verifies, which the shell checks) is the call's result, sealed into
the parent's turn like every other tool result; a child that failed or was canceled is told to
the model as a failed call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from durable_agents.api.v1alpha1 import Outcome
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.agent.limits import AgentLimits
from durable_agents.core.agent.planner import ModelPlanner
from durable_agents.core.agent_facts import ANSWER_LABEL, SettledOutcome, settle_last
from durable_agents.core.checkpoint import ChildRecord, ExternalEvidenceRef
from durable_agents.core.digest import canonical_digest
from durable_agents.core.engine.children import (
    AGENT_PATH_ANNOTATION,
    child_run_name,
    children_cancel_reason,
    ended,
    owned_child,
    running_children,
)
from durable_agents.core.engine.commits import CommitBuilder
from durable_agents.core.engine.decisions import Commit, Decision, Idle, NeedChildren
from durable_agents.core.engine.snapshot import ChildObservation, RunSnapshot
from durable_agents.core.planner import PlannerError, PlanningContext, StartSubAgent
from durable_agents.core.sealed_values import ValueSealingError, is_sealed, unseal_value
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, verify
from durable_agents.core.statemachine import RunEvent

INLINE_AGENT = "*"
"""A run with an inline ``spec.agent`` on a path: it counts for depth, never for a cycle."""

SUB_AGENT_CYCLE = "SubAgentCycle"
SUB_AGENT_DEPTH = "SubAgentDepthExceeded"
SUB_AGENT_FAN_OUT = "SubAgentFanOutExceeded"
SUB_AGENT_UNPROVEN = "SubAgentAncestryUnproven"
RESULT_MAX = 2800
"""A child's answer given to the parent's model, in characters (a sealed answer holds that much)."""


def ancestry(run: RunSnapshot, keyring: Keyring | None) -> tuple[str, ...] | None:
    """The Agents above ``run`` (root first): () for a top-level run; None for a run with a parent
    but no path the operator stamped (it may not call sub-agents: its depth is unknown)."""
    if run.spec.parent_ref is None:
        return ()
    if run.agent_path is None:
        return None
    # As :func:`~.children.stamp_child` stamps it: the operator made this child below this path.
    proof = {"subAgentOf": run.spec.parent_ref.name, "child": run.name, "agentPath": run.agent_path}
    if not verify(keyring, Purpose.CHILD, proof, run.agent_path_stamp):
        return None
    return tuple(part for part in run.agent_path.split("/") if part)


def sub_agent_body(run: RunSnapshot, step: StartSubAgent, path: tuple[str, ...]) -> dict[str, Any]:
    """The child AgentRun: a run of the called Agent, owned by the parent, with its ServiceAccount,
    policy, deadline and tenant; ``path`` is the Agents above the child (the parent's last)."""
    what = {
        "taskType": (run.spec.task_type[:40] + "-subagent").strip("-."),
        "objective": step.objective,
        "agentRef": step.agent_ref,
    }
    return owned_child(run, step.name, what, {AGENT_PATH_ANNOTATION: "/".join(path)})


def call_refusal(
    run: RunSnapshot, step: StartSubAgent, limits: AgentLimits, keyring: Keyring | None
) -> Outcome | str:
    """Why this call may not start its child (an Outcome), else the child's path."""
    path = ancestry(run, keyring)
    if path is None:
        return Outcome(
            reason=SUB_AGENT_UNPROVEN,
            message=f"run {run.name} has a parent but no Agent path the operator stamped: "
            f"it may not call Agent {step.agent_ref!r}",
        )
    below = (*path, run.spec.agent_ref or INLINE_AGENT)
    if step.agent_ref in below:
        chain = " → ".join([*(p for p in below if p != INLINE_AGENT), step.agent_ref])
        return Outcome(
            reason=SUB_AGENT_CYCLE, message=f"calling Agent {step.agent_ref!r} makes a cycle: {chain}"
        )
    if len(below) > limits.max_sub_agent_depth:
        return Outcome(
            reason=SUB_AGENT_DEPTH,
            message=f"a run of Agent {step.agent_ref!r} here would be {len(below)} levels deep; the policy "
            f"allows {limits.max_sub_agent_depth} (agentLimits.maxSubAgentDepth)",
        )
    return "/".join(below)


def start_sub_agent(
    builder: CommitBuilder,
    run: RunSnapshot,
    step: StartSubAgent,
    limits: AgentLimits,
    keyring: Keyring | None,
) -> Commit:
    """Record the child in the checkpoint and wait for it (the shell creates it after the commit);
    or end the run with the bound the call breaks."""
    cp = builder.cp
    refused = call_refusal(run, step, limits, keyring)
    if isinstance(refused, Outcome):
        return builder.commit(RunEvent.ATTEMPT_FAILED, outcome=refused, detail=refused.message)
    if len(cp.children) >= limits.max_sub_agents:
        why = (
            f"the run started {len(cp.children)} sub-agent runs; the policy allows "
            f"{limits.max_sub_agents} (agentLimits.maxSubAgents): Agent {step.agent_ref!r} not called"
        )
        return builder.commit(
            RunEvent.ATTEMPT_FAILED, outcome=Outcome(reason=SUB_AGENT_FAN_OUT, message=why), detail=why
        )
    name = child_run_name(run.name, step.name)
    record = ChildRecord(name=name, step_index=cp.position.step)
    commit = builder.commit(
        RunEvent.EXTERNAL_AWAITED,
        checkpoint=cp.model_copy(update={"children": [*cp.children, record]}),
        waiting_for=f"child:{name}",
        detail=f"sub-agent run {name} (Agent {step.agent_ref})",
    )
    # The intent (the child's name) is committed before the child is created.
    return replace(commit, children=(sub_agent_body(run, step, tuple(refused.split("/"))),))


def child_answer(planner: ModelPlanner, seen: ChildObservation) -> dict[str, Any]:
    """What the parent's model is told of its sub-agent: how it ended and, when it completed,
    its final answer (opened with the run tree's key; bounded)."""
    told: dict[str, Any] = {"state": seen.state.value, "reason": seen.reason or seen.state.value}
    answer: Any = seen.result
    if answer is not None and is_sealed(answer):
        try:
            answer = unseal_value(planner.inputs.data_key, answer, ANSWER_LABEL)
        except ValueSealingError:
            answer = {"error": "the sub-agent's answer cannot be opened with this run's key"}
    if isinstance(answer, str):
        answer = answer[:RESULT_MAX]
    if answer is not None:
        told["answer"] = answer
    return told


def reconcile_sub_agents(
    builder: CommitBuilder,
    run: RunSnapshot,
    planner: ModelPlanner,
    keyring: Keyring | None,
    children: Mapping[str, ChildObservation] | None,
) -> Decision:
    """The pending call's child: created if missing, waited for; once it ended, its answer settles
    the call (sealed into the turn) and the run goes on, whatever the child's end."""
    cp = builder.cp
    running = running_children(cp)
    cancel = children_cancel_reason(cp)
    if children is None:
        body = _body_of_checkpoint(run, planner, keyring, builder)
        return NeedChildren({child.name: body if child is running[-1] else None for child in running}, cancel)
    for record in running:
        seen = children.get(record.name)
        if seen is None or not seen.state.terminal:
            continue
        outcome: SettledOutcome = "succeeded" if seen.state is RunState.COMPLETED else "failed"
        ref = ExternalEvidenceRef(
            id=f"child-{record.name}",
            step_index=record.step_index,
            recorded_at=builder.now,
            uri=f"agentrun://{run.namespace}/{record.name}",
            content_digest=canonical_digest(
                {"state": seen.state.value, "reason": seen.reason or "", "result": seen.result}
            ),
        )
        facts = cp.agent
        if facts is not None and facts.pending is not None and facts.pending.step_index == record.step_index:
            inputs = planner.inputs
            facts = settle_last(
                facts,
                inputs.data_key,
                entropy=inputs.entropy,
                outcome=outcome,
                result=child_answer(planner, seen),
            )
        checkpoint = cp.model_copy(
            update={
                "agent": facts,
                "children": [ended(record, seen) if child is record else child for child in cp.children],
                "evidence": [*cp.evidence, ref],
                "position": cp.position.model_copy(
                    update={"step": max(cp.position.step, record.step_index + 1)}
                ),
            }
        )
        return builder.commit(
            RunEvent.EXTERNAL_RECEIVED,
            checkpoint=checkpoint,
            detail=f"sub-agent run {record.name} {seen.state.value}: told the model",
        )
    return Idle(wake_at=run.spec.deadline, reason="sub-agent run in progress")


def _body_of_checkpoint(
    run: RunSnapshot, planner: ModelPlanner, keyring: Keyring | None, builder: CommitBuilder
) -> dict[str, Any] | None:
    """The pending call's child, to create it if a crash came between the commit and the creation
    (None: no such call; only then is a missing child taken as deleted)."""
    try:
        step = planner.next_step(PlanningContext(run.spec, builder.cp))
    except PlannerError:
        return None
    if not isinstance(step, StartSubAgent):
        return None
    path = ancestry(run, keyring)
    if path is None:
        return None
    return sub_agent_body(run, step, (*path, run.spec.agent_ref or INLINE_AGENT))
