"""Child runs: a step that starts another AgentRun, owned by this one, and waits for its end."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from durable_agents.api.v1alpha1 import API_VERSION
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import Checkpoint, ChildRecord, ExternalEvidenceRef
from durable_agents.core.digest import canonical_digest
from durable_agents.core.engine.commits import CommitBuilder
from durable_agents.core.engine.decisions import Commit, Decision, Idle, NeedChildren
from durable_agents.core.engine.snapshot import ChildObservation, RunSnapshot
from durable_agents.core.planner import StartChild
from durable_agents.core.statemachine import RunEvent

PARENT_LABEL = "durable-agents.io/parent"


def child_run_name(parent: str, step: str) -> str:
    """``<parent>-<step>``, shortened with a hash when it would not fit a label value (63)."""
    name = f"{parent}-{step}"
    if len(name) <= 63:
        return name
    return f"{name[:52].rstrip('-.')}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


def child_body(run: RunSnapshot, step: StartChild) -> dict[str, Any]:
    """The child AgentRun: owned by the parent, same ServiceAccount, policy and deadline."""
    spec = run.spec
    child: dict[str, Any] = {
        "taskType": step.child.task_type,
        "objective": step.child.objective,
        "serviceAccountName": spec.service_account_name,
        "steps": [child_step.wire() for child_step in step.child.steps],
        "parentRef": {"name": run.name, "uid": run.uid},
    }
    if spec.policy_ref is not None:
        child["policyRef"] = spec.policy_ref.wire()
    if spec.deadline is not None:
        child["deadline"] = spec.deadline.isoformat()
    if spec.tenant is not None:
        child["tenant"] = spec.tenant
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentRun",
        "metadata": {
            "name": child_run_name(run.name, step.name),
            "namespace": run.namespace,
            "labels": {PARENT_LABEL: run.name},
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": "AgentRun", "name": run.name, "uid": run.uid}
            ],
        },
        "spec": child,
    }


def start_child(builder: CommitBuilder, run: RunSnapshot, step: StartChild) -> Commit:
    """Record the child in the checkpoint and wait for it; the shell creates it after the commit."""
    cp = builder.cp
    name = child_run_name(run.name, step.name)
    record = ChildRecord(name=name, step_index=cp.position.step)
    commit = builder.commit(
        RunEvent.EXTERNAL_AWAITED,
        checkpoint=cp.model_copy(update={"children": [*cp.children, record]}),
        waiting_for=f"child:{name}",
        detail=f"child run {name} ({step.child.task_type})",
    )
    # The intent (the child's name) is committed before the child is created.
    return replace(commit, children=(child_body(run, step),))


def ended(record: ChildRecord, seen: ChildObservation) -> ChildRecord:
    """The child's record with its terminal outcome."""
    outcome = seen.state.value
    return record.model_copy(update={"outcome": outcome, "reason": (seen.reason or outcome)[:128]})


def running_children(cp: Checkpoint) -> list[ChildRecord]:
    return [child for child in cp.children if child.outcome is None]


def children_cancel_reason(cp: Checkpoint) -> str | None:
    """Why this run's running children must be canceled, if they must."""
    for record in cp.cancellations:
        # Task scope covers every child; children and turn scope those of the step they were made at.
        if record.effective and (
            record.scope == "task"
            or (record.scope in ("children", "turn") and record.step_index == cp.position.step)
        ):
            return f"parent {record.scope} cancellation {record.request_id}"
    return None


def reconcile_children(
    builder: CommitBuilder, run: RunSnapshot, children: Mapping[str, ChildObservation] | None
) -> Decision:
    """Take the first child that ended into the checkpoint; wait while every child still runs."""
    cp = builder.cp
    running = running_children(cp)
    cancel = children_cancel_reason(cp)
    if children is None:
        return NeedChildren({child.name: _child_body_of(run, child) for child in running}, cancel)
    for record in running:
        seen = children.get(record.name)
        if seen is None or not seen.state.terminal:
            continue
        outcome = seen.state.value
        done = ended(record, seen)
        ref = ExternalEvidenceRef(
            id=f"child-{record.name}",
            step_index=record.step_index,
            recorded_at=builder.now,
            uri=f"agentrun://{run.namespace}/{record.name}",
            content_digest=canonical_digest({"state": outcome, "reason": seen.reason or ""}),
        )
        # A child canceled because we asked is the outcome the user chose: the parent goes on.
        advance = seen.state is RunState.COMPLETED or (seen.state is RunState.CANCELED and cancel is not None)
        checkpoint = cp.model_copy(
            update={
                "children": [done if child is record else child for child in cp.children],
                "evidence": [*cp.evidence, ref],
                "position": cp.position.model_copy(
                    update={"step": cp.position.step + 1 if advance else cp.position.step}
                ),
            }
        )
        return builder.commit(
            RunEvent.EXTERNAL_RECEIVED, checkpoint=checkpoint, detail=f"child run {record.name} {outcome}"
        )
    return Idle(wake_at=run.spec.deadline, reason="child run in progress")


def _child_body_of(run: RunSnapshot, record: ChildRecord) -> dict[str, Any] | None:
    if record.step_index >= len(run.spec.steps):
        return None
    step = run.spec.steps[record.step_index]
    if step.child is None:
        return None
    return child_body(run, StartChild(step.name, step.child))


def failed_child_of_step(cp: Checkpoint) -> ChildRecord | None:
    """A child of the current step that ended other than completed."""
    for child in cp.children:
        if child.step_index == cp.position.step and child.outcome not in (None, "completed"):
            return child
    return None
