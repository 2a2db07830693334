"""Child runs: a step that starts another AgentRun, owned by this one, and waits for its end.

Only a child the operator made is adopted. Anyone who may create AgentRuns can create one under
the expected name, with the parent as owner, before the operator does; adopting it would let the
parent go on as if its own child had run. So the operator stamps each child it creates
(:data:`CHILD_STAMP_ANNOTATION`, a :class:`~durable_agents.core.stamps.Purpose.CHILD` stamp over
the parent's run ID, the step and the child's name: a user can copy it, not make it) and adopts
an object under a child's name only if that stamp verifies and its spec is the step's child
(:func:`foreign_child`). The stamp travels with the child itself, so a child created right before
a crash, and never recorded by the parent, is still recognised as ours. Anything else is a
foreign child: never adopted, never canceled, and the parent's step fails ``ForeignChild``.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import API_VERSION, AgentRunSpec, Outcome
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import Checkpoint, ChildRecord, ExternalEvidenceRef
from durable_agents.core.digest import canonical_digest
from durable_agents.core.engine.commits import CommitBuilder
from durable_agents.core.engine.decisions import Commit, Decision, Idle, NeedChildren
from durable_agents.core.engine.snapshot import ChildObservation, RunSnapshot
from durable_agents.core.plan_guard import DEFINING_FIELDS
from durable_agents.core.planner import StartChild
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp, verify
from durable_agents.core.statemachine import RunEvent

PARENT_LABEL = "durable-agents.io/parent"
PARENT_STEP_ANNOTATION = "durable-agents.io/parent-step"
CHILD_STAMP_ANNOTATION = "durable-agents.io/child-stamp"
AGENT_PATH_ANNOTATION = "durable-agents.io/agent-path"
AGENT_PATH_STAMP_ANNOTATION = "durable-agents.io/agent-path-stamp"
FOREIGN_CHILD = "ForeignChild"
"""The reason a step fails when an object under its child's name is not the operator's child."""
CHILD_NOT_PERMITTED = "ChildNotPermitted"
"""The run's ServiceAccount may not create AgentRuns (403 on the child's creation)."""
CHILD_INVALID = "ChildInvalid"
"""The API server refused the child as invalid (422 on its creation)."""


LABEL_VALUE_MAX = 63


def label_value(name: str) -> str:
    """``name`` as a label value: itself when it fits (63), else shortened with a hash of it.

    A run's name may be 253 characters; a label value may not. The hashed form is stable, so a
    selector on it still finds what was labelled (and a reader checks the full name elsewhere).
    """
    if len(name) <= LABEL_VALUE_MAX:
        return name
    return f"{name[:52].rstrip('-.')}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


def child_run_name(parent: str, step: str) -> str:
    """``<parent>-<step>``, shortened with a hash when it would not fit a label value (63)."""
    return label_value(f"{parent}-{step}")


def child_body(run: RunSnapshot, step: StartChild) -> dict[str, Any]:
    """The child AgentRun: owned by the parent, same ServiceAccount, policy and deadline."""
    what = {
        "taskType": step.child.task_type,
        "objective": step.child.objective,
        "steps": [child_step.wire() for child_step in step.child.steps],
    }
    return owned_child(run, step.name, what, {})


def owned_child(
    run: RunSnapshot, step: str, what: dict[str, Any], annotations: dict[str, str]
) -> dict[str, Any]:
    """A child AgentRun of ``run`` made by its ``step``: ``what`` it does, with the parent's
    ServiceAccount, policy, deadline and tenant, owned by the parent (scripted children and
    sub-agents alike)."""
    spec = run.spec
    child: dict[str, Any] = {
        **what,
        "serviceAccountName": spec.service_account_name,
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
            "name": child_run_name(run.name, step),
            "namespace": run.namespace,
            "labels": {PARENT_LABEL: label_value(run.name)},
            "annotations": {PARENT_STEP_ANNOTATION: step, **annotations},
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": "AgentRun", "name": run.name, "uid": run.uid}
            ],
        },
        "spec": child,
    }


def child_proof(parent_run_id: str, step: str, child: str) -> dict[str, str]:
    """What a child's stamp vouches for: this parent run's step made this child."""
    return {"parentRunId": parent_run_id, "step": step, "child": child}


def stamp_child(body: Mapping[str, Any], keyring: Keyring, parent_run_id: str) -> dict[str, Any]:
    """The child's body with the operator's stamp (the shell stamps right before creating it)."""
    out = copy.deepcopy(dict(body))
    meta = out["metadata"]
    annotations = meta.setdefault("annotations", {})
    proof = child_proof(parent_run_id, annotations[PARENT_STEP_ANNOTATION], meta["name"])
    annotations[CHILD_STAMP_ANNOTATION] = stamp(keyring, Purpose.CHILD, proof)
    path = annotations.get(AGENT_PATH_ANNOTATION)
    if path is not None:  # a sub-agent: the Agents above it, which bound its depth and cycles
        parent = out["spec"]["parentRef"]["name"]
        annotations[AGENT_PATH_STAMP_ANNOTATION] = stamp(
            keyring, Purpose.CHILD, {"subAgentOf": parent, "child": meta["name"], "agentPath": path}
        )
    return out


def foreign_child(
    found: Mapping[str, Any],
    expected: Mapping[str, Any] | None,
    *,
    keyring: Keyring | None,
    parent_run_id: str,
    parent_name: str,
) -> str | None:
    """Why the AgentRun ``found`` under a child's name is not the child the operator made for this
    parent (a short clause), or None when it is.

    ``expected`` is the child's body as the step defines it (None when the step is no longer
    known, e.g. while canceling): then only the stamp and the parent reference are checked.
    """
    meta = found.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    value = annotations.get(CHILD_STAMP_ANNOTATION)
    if not value:
        return "it carries no child stamp"
    step = annotations.get(PARENT_STEP_ANNOTATION) or ""
    if expected is not None:
        expected_step = (expected["metadata"].get("annotations") or {}).get(PARENT_STEP_ANNOTATION)
        if step != expected_step:
            return f"it was made for step {step!r}, not {expected_step!r}"
    if not verify(keyring, Purpose.CHILD, child_proof(parent_run_id, step, meta.get("name", "")), value):
        return "its child stamp is not the operator's for this parent and step"
    try:
        spec = AgentRunSpec.model_validate(found.get("spec") or {})
        wanted = AgentRunSpec.model_validate(expected["spec"]) if expected is not None else None
    except ValidationError:
        return "its spec is not a valid AgentRun spec"
    if spec.parent_ref is None or spec.parent_ref.name != parent_name:
        return f"its parentRef does not name {parent_name!r}"
    if wanted is not None:
        differs = [f for f in DEFINING_FIELDS if getattr(spec, f) != getattr(wanted, f)]
        if differs:
            return f"its spec differs from the step's child in {', '.join(differs)}"
    return None


def child_failure(namespace: str, child: ChildRecord) -> Outcome:
    """The outcome of a step whose child did not complete (resume validation fails the step)."""
    if child.reason == FOREIGN_CHILD:
        return Outcome(
            reason=FOREIGN_CHILD,
            message=f"AgentRun {namespace}/{child.name} exists under this step's child name but was not"
            " created by the operator for this run: it was not adopted, and the step's child never ran",
        )
    if child.reason in (CHILD_NOT_PERMITTED, CHILD_INVALID):
        why = (
            "the run's ServiceAccount may not create AgentRuns"
            if child.reason == CHILD_NOT_PERMITTED
            else "the API server refused it as invalid"
        )
        return Outcome(
            reason=child.reason,
            message=f"child run {namespace}/{child.name} was never created: {why} (see the run's Events)",
        )
    return Outcome(
        reason="ChildRunFailed",
        message=f"child run {child.name} ended {child.outcome}: {child.reason}",
    )


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
        foreign = ""
        if seen.reason == FOREIGN_CHILD:
            foreign = " (ForeignChild: not created by the operator, not adopted)"
        return builder.commit(
            RunEvent.EXTERNAL_RECEIVED,
            checkpoint=checkpoint,
            detail=f"child run {record.name} {outcome}{foreign}",
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
