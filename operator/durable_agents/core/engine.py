"""The run engine: from a snapshot of an AgentRun to the next committed status, purely.

Given what the run's record says (spec, status, checkpoint), the clock, the worker's lease epoch
and, where a step needed one, the result of a read, :func:`decide` answers one of:

- :class:`Idle`: nothing to do now (a wait whose answer has not arrived; wake at ``wake_at``);
- :class:`NeedRead`: the step needs a read first; the shell performs it and calls back;
- :class:`Commit`: the complete next status, to be written in ONE compare-and-swap.

Every commit goes through the state machine's table, increments the state version by exactly one
and stamps the lease epoch (fencing token) into the checkpoint. No I/O, no Kubernetes here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from durable_agents.api.v1alpha1 import (
    API_VERSION,
    HISTORY_LIMIT,
    ActionRecordSpec,
    ActionState,
    ActionTier,
    AgentPolicySpec,
    AgentRunSpec,
    AgentRunStatus,
    ApprovalRequest,
    CancellationStatus,
    CancelRequest,
    CancelScope,
    ChangeResponse,
    Condition,
    ConditionStatus,
    ExpiryAction,
    HistoryEntry,
    ObjectReference,
    Outcome,
    RetryPolicy,
    RunReference,
    UnavailableResponse,
    UnreversedEffect,
    WaitExpiries,
)
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.approvals import approval_digest
from durable_agents.core.checkpoint import (
    ApprovalRecord,
    CancellationRecord,
    Checkpoint,
    ChildRecord,
    ExternalEvidenceRef,
    Fencing,
    KubernetesEvidenceRef,
    Loaded,
    PendingAction,
    PendingExternal,
    PendingInput,
    PolicyRef,
    Position,
    Quarantine,
    RetryState,
    RuntimeConfig,
    Timestamps,
    ToolCallRecord,
    dump_checkpoint,
    load_checkpoint,
    verify_sealed,
)
from durable_agents.core.digest import canonical_digest
from durable_agents.core.durations import parse_duration
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents.core.planner import (
    AskHuman,
    AwaitEvent,
    Finish,
    PerformEffect,
    Planner,
    PlannerError,
    PlanningContext,
    ReadObject,
    StartChild,
)
from durable_agents.core.sealing import Keyring
from durable_agents.core.statemachine import Position as MachinePosition
from durable_agents.core.statemachine import RunEvent, transition

E = RunEvent
S = RunState


@dataclass(frozen=True)
class RunSnapshot:
    """One read of an AgentRun, as the engine needs it."""

    uid: str
    name: str
    namespace: str
    generation: int
    resource_version: str
    spec: AgentRunSpec
    status: AgentRunStatus
    raw_checkpoint: Mapping[str, Any] | None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> RunSnapshot:
        meta = obj["metadata"]
        raw_status = dict(obj.get("status") or {})
        raw_checkpoint = raw_status.pop("checkpoint", None)
        return cls(
            uid=meta["uid"],
            name=meta["name"],
            namespace=meta["namespace"],
            generation=int(meta.get("generation", 1)),
            resource_version=meta["resourceVersion"],
            spec=AgentRunSpec.model_validate(obj["spec"]),
            status=AgentRunStatus.model_validate(raw_status),
            raw_checkpoint=raw_checkpoint,
        )

    @property
    def state(self) -> RunState:
        return self.status.state

    @property
    def run_id(self) -> str:
        """The identity effects are keyed by: recorded at the first commit, so it survives a
        restore from backup (which gives the object a new uid); the uid until then."""
        return self.status.run_id or self.uid


@dataclass(frozen=True)
class ReadResult:
    """What the shell observed when it performed a read step."""

    step_index: int
    evidence: KubernetesEvidenceRef | None = None
    error_reason: str | None = None
    error_message: str = ""


@dataclass(frozen=True)
class ActionObservation:
    """What the ledger says about one action: its dispatch state and authoritative outcome."""

    state: ActionState
    outcome: Mapping[str, Any] | None = None
    reason: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class NeedActions:
    """The run waits on these actions: make sure each record exists, then report its state.

    ``cancel``: cancel each one still undispatched (``intent``) first; a dispatched one is reconciled.
    """

    records: dict[str, ActionRecordSpec | None]
    cancel: bool = False


@dataclass(frozen=True)
class ChildObservation:
    """A child run's state, as its record says."""

    state: RunState
    reason: str | None = None


@dataclass(frozen=True)
class NeedChildren:
    """The run waits on these child runs: create any missing one (from its body), report each state.

    ``cancel``: ask each one not yet terminal to cancel (task scope), with this reason.
    """

    records: dict[str, dict[str, Any] | None]
    cancel: str | None = None


@dataclass(frozen=True)
class NeedEvidence:
    """Re-read these evidence references (as the run's ServiceAccount) before acting on approval."""

    refs: tuple[KubernetesEvidenceRef, ...]


@dataclass(frozen=True)
class Idle:
    wake_at: datetime | None = None
    reason: str = ""


@dataclass(frozen=True)
class NeedRead:
    step_index: int
    step_name: str
    ref: ObjectReference


@dataclass(frozen=True)
class Commit:
    event: RunEvent
    status: AgentRunStatus
    checkpoint: dict[str, Any] | None
    detail: str = ""
    intents: tuple[ActionRecordSpec, ...] = ()  # action records to create right after this commit
    children: tuple[dict[str, Any], ...] = ()  # child runs to create right after this commit
    migrated_from: int | None = None  # the checkpoint was read from this older schema version

    @property
    def state(self) -> RunState:
        return self.status.state

    def wire_status(self) -> dict[str, Any]:
        out = self.status.wire()
        if self.checkpoint is not None:
            out["checkpoint"] = self.checkpoint
        return out


Decision = Idle | NeedRead | NeedActions | NeedEvidence | NeedChildren | Commit


@dataclass(frozen=True)
class Settings:
    """Policy inputs the engine needs; the shell resolves them from the AgentPolicy, if any."""

    wait_expiries: WaitExpiries = field(default_factory=WaitExpiries)
    policy_name: str | None = None
    policy_version: str | None = None
    # Tier of each effect: the plugin's declared tier, overridden by the policy's.
    tiers: Mapping[str, ActionTier] = field(default_factory=dict)
    policy: AgentPolicySpec | None = None
    available_effects: frozenset[str] | None = None  # None: not checked
    operator_version: str | None = None  # None: deployment changes are not checked
    # Unseals checkpoints' sealed values; None: a checkpoint with any sealed value is quarantined.
    keyring: Keyring | None = None


def decide(
    run: RunSnapshot,
    *,
    now: datetime,
    epoch: Fencing,
    planner: Planner,
    settings: Settings | None = None,
    read: ReadResult | None = None,
    actions: Mapping[str, ActionObservation] | None = None,
    fresh_evidence: Mapping[str, KubernetesEvidenceRef | None] | None = None,
    children: Mapping[str, ChildObservation] | None = None,
) -> Decision:
    """The next thing to do for ``run``; see the module docstring."""
    settings = settings or Settings()
    state = run.state
    if state.terminal:
        return Idle(reason=f"run is {state.value}")
    if state is S.QUARANTINED:
        return _quarantined(run, now, epoch, settings)
    # A cancellation in progress finishes reconciling even past the deadline: no new work starts.
    past_deadline = (
        run.spec.deadline is not None and now >= run.spec.deadline and state is not S.CANCEL_REQUESTED
    )
    if state is S.PENDING and run.raw_checkpoint is None and not past_deadline:
        return _accept(run, now, epoch, settings)

    loaded = (
        Loaded(Checkpoint.model_validate(_initial_checkpoint(run, now, epoch, settings)))
        if run.raw_checkpoint is None
        else _load(run, settings)
    )
    if isinstance(loaded, Quarantine):
        if state is S.CANCEL_REQUESTED:
            return _cancel_unreadable(run, now, epoch, loaded)
        return _quarantine(run, now, epoch, loaded)
    b = _Builder(run, loaded, now, epoch, settings)

    if past_deadline:
        assert run.spec.deadline is not None
        return b.commit(
            E.DEADLINE_EXCEEDED,
            outcome=Outcome(
                reason="DeadlineExceeded",
                message=f"the run's deadline {run.spec.deadline.isoformat()} passed",
            ),
        )

    cp = b.cp
    if state is S.CANCEL_REQUESTED:
        return _finish_cancel(b, run, planner, settings, actions, children)
    request = _next_cancellation(run, cp)
    if request is not None:
        return _handle_cancel(b, run, *request)

    if state is S.WAITING_INPUT:
        asked = cp.pending_input
        if asked is None:
            return b.commit(E.INPUT_RECEIVED, detail="no pending question recorded")
        return _leave_wait(
            b,
            E.INPUT_RECEIVED,
            "answer",
            asked.request_id,
            "answers",
            asked.request_id,
            run.spec.answers,
            clear="pending_input",
            expires_at=asked.expires_at,
            expired="InputExpired",
        )

    if state is S.WAITING_EXTERNAL and cp.pending_actions:
        return _reconcile_actions(b, run, planner, settings, actions)

    if state is S.WAITING_EXTERNAL and _running_children(cp):
        return _reconcile_children(b, run, settings, children)

    if state is S.WAITING_EXTERNAL:
        awaited = cp.pending_external
        if awaited is None:
            return b.commit(E.EXTERNAL_RECEIVED, detail="no pending event recorded")
        return _leave_wait(
            b,
            E.EXTERNAL_RECEIVED,
            "event",
            awaited.request_id,
            "events",
            awaited.event,
            run.spec.events,
            clear="pending_external",
            expires_at=awaited.expires_at,
            expired="ExternalEventExpired",
        )

    if state is S.WAITING_APPROVAL:
        return _await_decision(b, run, settings)

    if state is S.WAITING_RETRY:
        due = cp.retry.retry_at
        if due is None or now >= due:
            retry = cp.retry.model_copy(update={"retry_at": None})
            return b.commit(
                E.RETRY_DUE,
                checkpoint=cp.model_copy(update={"retry": retry}),
                detail=f"attempt {cp.retry.attempts + 1} of step {cp.position.step}",
            )
        deadline = run.spec.deadline
        return Idle(wake_at=min(due, deadline) if deadline else due, reason="retry window")

    if state is S.RESUME_VALIDATION:
        return _resume_validation(b, run, planner, settings, fresh_evidence)

    if state is S.PENDING:  # a checkpoint exists but acceptance was not committed: accept again
        return b.commit(E.ACCEPTED)

    recorded = cp.runtime_config.operator
    if settings.operator_version is not None and recorded != settings.operator_version:
        # A deployment change: the checkpoint was committed by another operator version.
        return b.commit(
            E.REVALIDATION_REQUIRED,
            detail=f"deployment changed: operator {recorded or 'unrecorded'} -> {settings.operator_version}",
        )
    return _plan(b, run, planner, settings, read)


def _recorded_wait(b: _Builder) -> Commit | None:
    """A checkpoint that still records a wait (a run released from quarantine mid-wait): go back
    into that wait instead of planning its step again (which would repeat an intent)."""
    cp = b.cp
    detail = "back to the wait recorded in the checkpoint"
    if cp.pending_actions:
        names = ", ".join(p.action_record_name for p in cp.pending_actions)
        return b.commit(E.EXTERNAL_AWAITED, waiting_for=f"action:{names}"[:253], detail=detail)
    running = _running_children(cp)
    if running:
        return b.commit(E.EXTERNAL_AWAITED, waiting_for=f"child:{running[0].name}", detail=detail)
    if cp.pending_input is not None:
        return b.commit(E.INPUT_REQUESTED, waiting_for=f"input:{cp.pending_input.request_id}", detail=detail)
    if cp.pending_external is not None:
        return b.commit(E.EXTERNAL_AWAITED, waiting_for=f"event:{cp.pending_external.event}", detail=detail)
    if cp.retry.retry_at is not None:
        commit = b.commit(
            E.RETRY_SCHEDULED, waiting_for=f"retry:{cp.retry.retry_at.isoformat()}", detail=detail
        )
        commit.status.retry_at = cp.retry.retry_at
        return commit
    return None


def _resume_validation(
    b: _Builder,
    run: RunSnapshot,
    planner: Planner,
    settings: Settings,
    fresh_evidence: Mapping[str, KubernetesEvidenceRef | None] | None,
) -> Decision:
    """Leaving a wait, or meeting a new deployment: check what must still hold before acting."""
    cp = b.cp
    canceled = _cancellation_of_step(cp)
    if canceled is not None:
        return b.commit(
            E.REVALIDATED,
            checkpoint=_skip_step(cp),
            detail=f"step {cp.position.step} abandoned: {canceled.scope} cancellation {canceled.request_id}",
        )
    rewait = _recorded_wait(b)
    if rewait is not None:
        return rewait
    unavailable = _unavailable_runtime(cp, settings)
    if unavailable:
        policy = settings.policy
        if policy is None or policy.runtime.on_unavailable is UnavailableResponse.FAIL:
            return b.commit(
                E.ATTEMPT_FAILED,
                outcome=Outcome(
                    reason="RuntimeConfigUnavailable",
                    message=f"the run's {unavailable} is no longer available (policy {settings.policy_name})",
                ),
            )
    failed = _failed_call_of_step(cp)
    if failed is not None:
        return _attempt_failed(
            b,
            settings,
            "ActionFailed",
            f"{failed.tool}: {failed.error or 'failed'}",
            f"step {cp.position.step}",
        )
    child = _failed_child_of_step(cp)
    if child is not None:
        return b.commit(
            E.ATTEMPT_FAILED,
            outcome=Outcome(
                reason="ChildRunFailed",
                message=f"child run {child.name} ended {child.outcome}: {child.reason}",
            ),
        )
    decided = _decided_approval_of_step(cp)
    if decided is not None:
        return _revalidate_approval(b, run, planner, settings, decided, fresh_evidence)
    # Material facts: the deadline (checked before), the runtime configuration and the checkpoint.
    note = f"; {unavailable} unavailable, continuing per policy" if unavailable else ""
    return b.commit(E.REVALIDATED, detail=f"checkpoint valid, deadline not passed{note}")


def _plan(
    b: _Builder, run: RunSnapshot, planner: Planner, settings: Settings, read: ReadResult | None
) -> Decision:
    cp, now = b.cp, b.now
    try:
        step = planner.next_step(PlanningContext(run.spec, cp))
    except PlannerError as err:
        return b.commit(E.ATTEMPT_FAILED, outcome=Outcome(reason="PlannerError", message=str(err)))
    index = cp.position.step
    if isinstance(step, ReadObject):
        if read is None or read.step_index != index:
            return NeedRead(index, step.name, step.ref)
        if read.evidence is None:
            return _attempt_failed(
                b,
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
        return b.commit(
            E.STEP_COMPLETED,
            checkpoint=cp.model_copy(
                update={
                    "evidence": [*cp.evidence, read.evidence],
                    "tool_calls": [*cp.tool_calls, call],
                    "position": cp.position.model_copy(update={"step": index + 1}),
                }
            ),
            detail=f"read {step.ref.kind}/{step.ref.name}@{read.evidence.resource_version}",
        )
    if isinstance(step, AskHuman):
        expires = now + (step.expires_in or parse_duration(settings.wait_expiries.input))
        pending = PendingInput(request_id=step.request_id, question=step.question, expires_at=expires)
        return b.commit(
            E.INPUT_REQUESTED,
            checkpoint=cp.model_copy(update={"pending_input": pending}),
            waiting_for=f"input:{step.request_id}",
            detail=f"asked {step.request_id}",
        )
    if isinstance(step, AwaitEvent):
        expires = now + (step.expires_in or parse_duration(settings.wait_expiries.external))
        ext = PendingExternal(request_id=step.request_id, event=step.event, expires_at=expires)
        return b.commit(
            E.EXTERNAL_AWAITED,
            checkpoint=cp.model_copy(update={"pending_external": ext}),
            waiting_for=f"event:{step.event}",
            detail=f"awaiting {step.event}",
        )
    if isinstance(step, PerformEffect):
        spec = action_spec(run, index, step, settings, cp.retry.attempts)
        policy = settings.policy
        approved = None
        if policy is not None and spec.tier in policy.approval_required_tiers:
            approved = _approved_for(cp, index, run, spec, step)
            if approved is None:
                return _request_approval(b, run, spec, step, settings, reason=f"{spec.tier.value} effect")
        name = action_record_name(spec.idempotency_key)
        action = PendingAction(
            idempotency_key=spec.idempotency_key,
            action_record_name=name,
            effect=step.effect,
            tier=spec.tier.value,
            step_index=index,
            approval_request_id=approved.request_id if approved else None,
        )
        # The intent is committed before anything is dispatched (semantic boundary).
        commit = b.commit(
            E.EXTERNAL_AWAITED,
            checkpoint=cp.model_copy(update={"pending_actions": [*cp.pending_actions, action]}),
            waiting_for=f"action:{name}",
            detail=f"intent {step.effect} key={spec.idempotency_key}",
        )
        return replace(commit, intents=(spec,))
    if isinstance(step, StartChild):
        name = child_run_name(run.name, step.name)
        record = ChildRecord(name=name, step_index=index)
        commit = b.commit(
            E.EXTERNAL_AWAITED,
            checkpoint=cp.model_copy(update={"children": [*cp.children, record]}),
            waiting_for=f"child:{name}",
            detail=f"child run {name} ({step.child.task_type})",
        )
        # The intent (the child's name) is committed before the child is created.
        return replace(commit, children=(child_body(run, step),))
    assert isinstance(step, Finish)
    return b.commit(
        E.SUCCEEDED,
        checkpoint=cp.model_copy(update={"position": cp.position.model_copy(update={"step": index + 1})}),
        outcome=Outcome(reason="Completed", message=f"finished at step {step.name}", result=step.result),
    )


def action_spec(
    run: RunSnapshot, index: int, step: PerformEffect, settings: Settings, attempt: int = 0
) -> ActionRecordSpec:
    """The immutable intent of one effect step: the same on every recomputation of one attempt.

    A retry after a definite failure is a new action with its own key (the failed one was not applied).
    """
    key = idempotency_key(run.run_id, index, step.name, attempt)
    compensates = None
    if step.compensates is not None:
        names = [s.name for s in run.spec.steps]
        if step.compensates in names:
            target = names.index(step.compensates)
            compensates = action_record_name(idempotency_key(run.run_id, target, step.compensates))
    return ActionRecordSpec(
        idempotency_key=key,
        run_ref=RunReference(name=run.name, uid=run.uid),
        service_account_name=run.spec.service_account_name,
        step_index=index,
        effect=step.effect,
        tier=settings.tiers.get(step.effect, ActionTier.CONSEQUENTIAL),
        target=step.target or None,
        arguments=step.arguments or None,
        compensates=compensates,
    )


def _reconcile_actions(
    b: _Builder,
    run: RunSnapshot,
    planner: Planner,
    settings: Settings,
    actions: Mapping[str, ActionObservation] | None,
) -> Decision:
    cp = b.cp
    if actions is None:
        # A turn or tool-call cancellation of this step: an undispatched intent is canceled.
        cancel = _cancellation_of_step(cp, in_flight=True) is not None
        return NeedActions(_pending_specs(run, cp, planner, settings), cancel=cancel)
    for pending in cp.pending_actions:
        seen = actions.get(pending.action_record_name)
        if seen is None or seen.state not in (
            ActionState.SUCCEEDED,
            ActionState.FAILED,
            ActionState.CANCELED,
        ):
            continue
        # Reconciled: resume from a checkpoint committed after reconciliation, with the
        # authoritative outcome as an evidence reference (never the raw response body).
        ref = ExternalEvidenceRef(
            id=f"action-{pending.step_index}-{pending.action_record_name[4:16]}",
            step_index=pending.step_index,
            recorded_at=b.now,
            uri=f"actionrecord://{run.namespace}/{pending.action_record_name}",
            content_digest=canonical_digest(dict(seen.outcome or {})),
        )
        ok = seen.state is ActionState.SUCCEEDED
        call = ToolCallRecord(
            id=f"call-{pending.step_index}-{pending.action_record_name[4:16]}",
            tool=pending.effect,
            step_index=pending.step_index,
            started_at=b.now,
            finished_at=b.now,
            outcome="succeeded" if ok else "failed",
            result_ref=ref.id,
            error=None if ok else f"{seen.reason or seen.state.value}: {seen.message or ''}"[:1024],
            attempt=cp.retry.attempts,
        )
        remaining = [p for p in cp.pending_actions if p is not pending]
        step = cp.position.step + 1 if ok and not remaining else cp.position.step
        return b.commit(
            E.EXTERNAL_RECEIVED,
            checkpoint=cp.model_copy(
                update={
                    "pending_actions": remaining,
                    "evidence": [*cp.evidence, ref],
                    "tool_calls": [*cp.tool_calls, call],
                    "position": cp.position.model_copy(update={"step": step}),
                }
            ),
            detail=f"action {pending.effect} {seen.state.value}",
        )
    # Still in flight or unknown: the run waits (no expiry: an unknown outcome is never assumed).
    return Idle(wake_at=run.spec.deadline, reason="action in flight")


def _pending_specs(
    run: RunSnapshot, cp: Checkpoint, planner: Planner, settings: Settings
) -> dict[str, ActionRecordSpec | None]:
    """Each pending action's intent, recomputed (so a record lost from the ledger can be recreated)."""
    return {p.action_record_name: _rebuild_spec(run, cp, planner, settings, p) for p in cp.pending_actions}


def _rebuild_spec(
    run: RunSnapshot, cp: Checkpoint, planner: Planner, settings: Settings, pending: PendingAction
) -> ActionRecordSpec | None:
    try:
        step = planner.next_step(PlanningContext(run.spec, cp))
    except PlannerError:
        return None
    if not isinstance(step, PerformEffect):
        return None
    spec = action_spec(run, pending.step_index, step, settings, cp.retry.attempts)
    return spec if spec.idempotency_key == pending.idempotency_key else None


def _approvals_of_step(cp: Checkpoint, index: int) -> list[ApprovalRecord]:
    return [a for a in cp.approvals if a.step_index == index]


def _approved_for(
    cp: Checkpoint, index: int, run: RunSnapshot, spec: ActionRecordSpec, step: PerformEffect
) -> ApprovalRecord | None:
    """The approval that still binds this exact action, if any (digest recomputed now)."""
    records = _approvals_of_step(cp, index)
    if not records:
        return None
    last = records[-1]
    if last.decision != "approved":
        return None
    digest = approval_digest(
        effect=step.effect,
        arguments=spec.arguments,
        target=spec.target,
        policy_version=last.policy_version,
        run_uid=run.run_id,
        request_id=last.request_id,
    )
    return last if digest == last.digest else None


def _request_approval(
    b: _Builder,
    run: RunSnapshot,
    spec: ActionRecordSpec,
    step: PerformEffect,
    settings: Settings,
    *,
    reason: str,
    cp: Checkpoint | None = None,
    event: RunEvent = E.APPROVAL_REQUESTED,
) -> Commit:
    """ONE commit writes the request (status + checkpoint) and enters waiting_approval."""
    cp = cp or b.cp
    policy = settings.policy
    assert policy is not None
    index = spec.step_index
    request_id = f"{step.name}-{len(_approvals_of_step(cp, index)) + 1}"
    version = settings.policy_version or "unversioned"
    digest = approval_digest(
        effect=step.effect,
        arguments=spec.arguments,
        target=spec.target,
        policy_version=version,
        run_uid=run.run_id,
        request_id=request_id,
    )
    expires = b.now + parse_duration(policy.approval_expiry)
    rule = policy.approvers
    request = ApprovalRequest(
        request_id=request_id,
        digest=digest,
        step=step.name,
        effect=step.effect,
        tier=spec.tier,
        target=spec.target,
        arguments=spec.arguments,
        evidence=[e.id for e in cp.evidence],
        policy_version=version,
        policy_reason=f"policy {settings.policy_name}@{version} requires approval for {reason}",
        approver_role=f"{rule.verb} on {rule.resource}"
        + (" (not the run's creator)" if rule.four_eyes else ""),
        expires_at=expires,
        allowed_decisions=[d.value for d in policy.allowed_decisions],
    )
    record = ApprovalRecord(
        request_id=request_id, digest=digest, expires_at=expires, policy_version=version, step_index=index
    )
    commit = b.commit(
        event,
        checkpoint=cp.model_copy(update={"approvals": [*cp.approvals, record]}),
        waiting_for=f"approval:{request_id}",
        detail=f"approval {request_id} for {step.effect}: {reason}",
    )
    commit.status.approval_request = request
    return commit


def _await_decision(b: _Builder, run: RunSnapshot, settings: Settings) -> Decision:
    cp = b.cp
    request = run.status.approval_request
    pending = [a for a in cp.approvals if a.decision is None]
    if request is None or not pending:
        return b.commit(E.APPROVAL_DECIDED, detail="no pending approval request recorded")
    record = pending[-1]
    decision = run.spec.approvals.get(record.request_id)
    if decision is not None and decision.digest == record.digest and decision.approver is not None:
        decided = record.model_copy(
            update={
                "decision": "approved" if decision.decision == "approve" else "rejected",
                "decided_by": decision.approver.username,
                "decided_at": decision.decided_at or b.now,
            }
        )
        approvals = [decided if a.request_id == record.request_id else a for a in cp.approvals]
        commit = b.commit(
            E.APPROVAL_DECIDED,
            checkpoint=cp.model_copy(update={"approvals": approvals}),
            detail=f"{decision.decision} {record.request_id} by {decision.approver.username}",
        )
        commit.status.approval_request = None
        return commit
    if b.now >= record.expires_at:
        policy = settings.policy
        if policy is not None and policy.freshness.approval_expired is ExpiryAction.REAPPROVE:
            return b.commit(E.REVALIDATION_REQUIRED, detail=f"approval request {record.request_id} expired")
        return b.commit(
            E.WAIT_EXPIRED,
            outcome=Outcome(reason="ApprovalExpired", message=f"nobody decided {record.request_id} in time"),
        )
    deadline = run.spec.deadline
    return Idle(
        wake_at=min(record.expires_at, deadline) if deadline else record.expires_at, reason="approval"
    )


def _decided_approval_of_step(cp: Checkpoint) -> ApprovalRecord | None:
    """The approval decided (or expired) during the wait, for the step about to act, not acted on."""
    records = _approvals_of_step(cp, cp.position.step)
    if not records:
        return None
    last = records[-1]
    acted = any(p.approval_request_id == last.request_id for p in cp.pending_actions) or any(
        c.step_index == cp.position.step for c in cp.tool_calls
    )
    return None if acted else last


def _revalidate_approval(
    b: _Builder,
    run: RunSnapshot,
    planner: Planner,
    settings: Settings,
    record: ApprovalRecord,
    fresh: Mapping[str, KubernetesEvidenceRef | None] | None,
) -> Decision:
    """Before acting on an approval: the digest, the policy, the effect, the evidence (seed §7)."""
    cp, policy = b.cp, settings.policy
    if record.decision == "rejected":
        return b.commit(
            E.ATTEMPT_FAILED,
            outcome=Outcome(
                reason="ApprovalRejected", message=f"{record.decided_by} rejected {record.request_id}"
            ),
        )
    try:
        step = planner.next_step(PlanningContext(run.spec, cp))
    except PlannerError as err:
        return b.commit(E.ATTEMPT_FAILED, outcome=Outcome(reason="PlannerError", message=str(err)))
    if not isinstance(step, PerformEffect) or policy is None:
        return b.commit(E.REVALIDATED, detail="the approved step no longer needs approval")
    spec = action_spec(run, cp.position.step, step, settings, cp.retry.attempts)

    def reapprove(reason: str, checkpoint: Checkpoint | None = None) -> Commit:
        return _request_approval(
            b, run, spec, step, settings, reason=reason, cp=checkpoint, event=E.REAPPROVAL_REQUIRED
        )

    if record.decision is None:  # the request expired and the policy says: ask again
        return reapprove("a new request (the last one expired)")
    if _approved_for(cp, cp.position.step, run, spec, step) is None:
        return reapprove("the action changed since it was approved")
    if settings.available_effects is not None and step.effect not in settings.available_effects:
        return b.commit(
            E.ATTEMPT_FAILED,
            outcome=Outcome(reason="EffectUnavailable", message=f"effect {step.effect!r} is not installed"),
        )
    if (
        settings.policy_version is not None
        and settings.policy_version != record.policy_version
        and policy.freshness.policy_changed is not ChangeResponse.IMMATERIAL
    ):
        return reapprove(f"policy changed from {record.policy_version} to {settings.policy_version}")
    refs = tuple(e for e in cp.evidence if isinstance(e, KubernetesEvidenceRef))
    if refs and fresh is None:
        return NeedEvidence(refs)
    seen = fresh or {}
    changed = [
        e
        for e in refs
        if (now := seen.get(e.id)) is None
        or (now.resource_version, now.content_digest) != (e.resource_version, e.content_digest)
    ]
    if changed:
        names = ", ".join(f"{e.kind}/{e.name}" for e in changed)
        refreshed = cp.model_copy(update={"evidence": [seen.get(e.id) or e for e in cp.evidence]})
        response = policy.freshness.evidence_changed
        if response is ChangeResponse.REAPPROVE:
            return reapprove(f"evidence changed during the wait: {names}", refreshed)
        if response is ChangeResponse.REFRESH:
            return b.commit(E.REFRESH_REQUIRED, checkpoint=refreshed, detail=f"evidence refreshed: {names}")
    return b.commit(E.REVALIDATED, detail=f"approval {record.request_id} still binds the action")


def _failed_call_of_step(cp: Checkpoint) -> ToolCallRecord | None:
    """The failed call of the current step in the current attempt (earlier attempts were retried)."""
    calls = [c for c in cp.tool_calls if c.step_index == cp.position.step and c.attempt == cp.retry.attempts]
    return calls[-1] if calls and calls[-1].outcome == "failed" else None


def _leave_wait(
    b: _Builder,
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
        return _expire_or_idle(b, expires_at, expired, b.run.spec.deadline)
    cp, run = b.cp, b.run
    ref = ExternalEvidenceRef(
        id=f"{kind}-{request_id}",
        step_index=cp.position.step,
        recorded_at=b.now,
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
    return b.commit(event, checkpoint=checkpoint, detail=f"{kind} {'to ' if kind == 'answer' else ''}{key}")


def _expire_or_idle(b: _Builder, expires_at: datetime, reason: str, deadline: datetime | None) -> Decision:
    if b.now >= expires_at:
        return b.commit(
            E.WAIT_EXPIRED,
            outcome=Outcome(reason=reason, message=f"nothing arrived before {expires_at.isoformat()}"),
        )
    return Idle(wake_at=min(expires_at, deadline) if deadline else expires_at, reason="waiting")


def fence(
    run: RunSnapshot, epoch: Fencing, *, now: datetime, settings: Settings | None = None
) -> dict[str, Any] | None:
    """The status that stamps a new lease epoch into the run without a transition, or None.

    A worker that takes over an expired (not released) lease writes this first, by compare-and-
    swap, before the Lease names it: from then on a zombie holder's commit, prepared against the
    old resourceVersion, is refused. A run without a checkpoint gets its initial checkpoint (still
    ``pending``); an unreadable checkpoint is never rewritten (None: quarantine will follow).
    """
    if run.raw_checkpoint is None:
        status = run.status.wire()
        status["checkpoint"] = _initial_checkpoint(run, now, epoch, settings or Settings())
        return status
    loaded = _load(run, settings or Settings())
    if isinstance(loaded, Quarantine):
        return None
    status = run.status.wire()
    status["checkpoint"] = dump_checkpoint(loaded.checkpoint.model_copy(update={"fencing": epoch}))
    return status


# --- retries ---------------------------------------------------------------------------------


def retry_backoff(policy: RetryPolicy, attempts: int, run_uid: str) -> timedelta:
    """Exponential backoff with jitter, deterministic per (run, attempt): a recomputation agrees."""
    base = parse_duration(policy.initial_backoff).total_seconds() * 2 ** max(0, attempts - 1)
    capped = min(base, parse_duration(policy.max_backoff).total_seconds())
    draw = int.from_bytes(hashlib.sha256(f"{run_uid}/{attempts}".encode()).digest()[:8], "big") / 2**64
    return timedelta(seconds=capped * (1 - policy.jitter * draw))


def _attempt_failed(b: _Builder, settings: Settings, reason: str, message: str, detail: str) -> Commit:
    """A defined attempt that cannot continue: a retry window if the policy allows one, else failed."""
    cp = b.cp
    policy = settings.policy.retry if settings.policy is not None else RetryPolicy()
    attempts = cp.retry.attempts + 1
    failure = f"{reason}: {message}"[:1024]
    if attempts < policy.max_attempts:
        at = b.now + retry_backoff(policy, attempts, b.run.run_id)
        commit = b.commit(
            E.RETRY_SCHEDULED,
            checkpoint=cp.model_copy(
                update={"retry": RetryState(attempts=attempts, retry_at=at, last_failure=failure)}
            ),
            waiting_for=f"retry:{at.isoformat()}",
            detail=f"{detail}: {failure}; attempt {attempts + 1}/{policy.max_attempts} at {at.isoformat()}",
        )
        commit.status.retry_at = at
        return commit
    if policy.max_attempts > 1:
        reason, message = "RetriesExhausted", f"{policy.max_attempts} attempts failed; last: {failure}"
    return b.commit(
        E.ATTEMPT_FAILED,
        checkpoint=cp.model_copy(update={"retry": cp.retry.model_copy(update={"last_failure": failure})}),
        outcome=Outcome(reason=reason, message=message),
        detail=detail,
    )


# --- runtime configuration -------------------------------------------------------------------


def _unavailable_runtime(cp: Checkpoint, settings: Settings) -> str:
    """Which recorded runtime configuration ID the policy no longer allows ('' when all are allowed)."""
    if settings.policy is None:
        return ""
    allowed = settings.policy.runtime
    recorded = cp.runtime_config
    for what, value, listed in (
        ("model", recorded.model, allowed.models),
        ("prompt", recorded.prompt, allowed.prompts),
        ("tool set", recorded.tool_set, allowed.tool_sets),
    ):
        if listed and value is not None and value not in listed:
            return f"{what} {value!r}"
    return ""


# --- child runs ------------------------------------------------------------------------------

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
        "steps": [s.wire() for s in step.child.steps],
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


def _ended(record: ChildRecord, seen: ChildObservation) -> ChildRecord:
    """The child's record with its terminal outcome."""
    outcome = seen.state.value
    return record.model_copy(update={"outcome": outcome, "reason": (seen.reason or outcome)[:128]})


def _running_children(cp: Checkpoint) -> list[ChildRecord]:
    return [c for c in cp.children if c.outcome is None]


def _children_cancel_reason(cp: Checkpoint) -> str | None:
    """Why this run's running children must be canceled, if they must."""
    for record in cp.cancellations:
        # Task scope covers every child; children and turn scope those of the step they were made at.
        if record.effective and (
            record.scope == "task"
            or (record.scope in ("children", "turn") and record.step_index == cp.position.step)
        ):
            return f"parent {record.scope} cancellation {record.request_id}"
    return None


def _reconcile_children(
    b: _Builder, run: RunSnapshot, settings: Settings, children: Mapping[str, ChildObservation] | None
) -> Decision:
    cp = b.cp
    running = _running_children(cp)
    cancel = _children_cancel_reason(cp)
    if children is None:
        return NeedChildren({c.name: _child_body_of(run, c) for c in running}, cancel)
    for record in running:
        seen = children.get(record.name)
        if seen is None or not seen.state.terminal:
            continue
        outcome = seen.state.value
        done = _ended(record, seen)
        ref = ExternalEvidenceRef(
            id=f"child-{record.name}",
            step_index=record.step_index,
            recorded_at=b.now,
            uri=f"agentrun://{run.namespace}/{record.name}",
            content_digest=canonical_digest({"state": outcome, "reason": seen.reason or ""}),
        )
        # A child canceled because we asked is the outcome the user chose: the parent goes on.
        advance = seen.state is S.COMPLETED or (seen.state is S.CANCELED and cancel is not None)
        checkpoint = cp.model_copy(
            update={
                "children": [done if c is record else c for c in cp.children],
                "evidence": [*cp.evidence, ref],
                "position": cp.position.model_copy(
                    update={"step": cp.position.step + 1 if advance else cp.position.step}
                ),
            }
        )
        return b.commit(
            E.EXTERNAL_RECEIVED, checkpoint=checkpoint, detail=f"child run {record.name} {outcome}"
        )
    return Idle(wake_at=run.spec.deadline, reason="child run in progress")


def _child_body_of(run: RunSnapshot, record: ChildRecord) -> dict[str, Any] | None:
    if record.step_index >= len(run.spec.steps):
        return None
    step = run.spec.steps[record.step_index]
    if step.child is None:
        return None
    return child_body(run, StartChild(step.name, step.child))


def _failed_child_of_step(cp: Checkpoint) -> ChildRecord | None:
    for child in cp.children:
        if child.step_index == cp.position.step and child.outcome not in (None, "completed"):
            return child
    return None


# --- cancellation ----------------------------------------------------------------------------


def _next_cancellation(run: RunSnapshot, cp: Checkpoint) -> tuple[str, CancelRequest] | None:
    """The first cancellation request (by request ID) this run has not acted on yet."""
    handled = {c.request_id for c in cp.cancellations}
    if run.status.cancellation is not None:
        handled.add(run.status.cancellation.request_id)
    for request_id in sorted(run.spec.cancellations):
        if request_id not in handled:
            return request_id, run.spec.cancellations[request_id]
    return None


def _cancellation_of_step(cp: Checkpoint, *, in_flight: bool = False) -> CancellationRecord | None:
    """A turn or tool-call cancellation of the current step, to act on once nothing is in flight."""
    if not in_flight and (cp.pending_actions or _running_children(cp)):
        return None
    for record in cp.cancellations:
        if (
            record.effective
            and record.scope in ("turn", "toolCall")
            and record.step_index == cp.position.step
        ):
            return record
    return None


def _skip_step(cp: Checkpoint) -> Checkpoint:
    """Abandon the current step: whatever it waited on is dropped, the run goes on with the next."""
    return cp.model_copy(
        update={
            "pending_input": None,
            "pending_external": None,
            "retry": cp.retry.model_copy(update={"retry_at": None}),
            "position": cp.position.model_copy(update={"step": cp.position.step + 1}),
        }
    )


def _handle_cancel(b: _Builder, run: RunSnapshot, request_id: str, request: CancelRequest) -> Commit:
    cp, state = b.cp, run.state
    scope = request.scope
    in_flight = bool(cp.pending_actions or _running_children(cp))
    # What the scope covers right now; a request with nothing to cover is recorded, never applied later.
    effective = {
        CancelScope.TASK: True,
        CancelScope.TURN: True,
        CancelScope.TOOL_CALL: bool(cp.pending_actions) or state is S.WAITING_APPROVAL,
        CancelScope.CHILDREN: bool(_running_children(cp)),
    }[scope]
    record = CancellationRecord(
        request_id=request_id,
        scope=scope.value,
        step_index=cp.position.step,
        handled_at=b.now,
        effective=effective,
    )
    recorded = cp.model_copy(update={"cancellations": [*cp.cancellations, record]})
    why = f"{scope.value} cancellation {request_id}" + (f": {request.reason}" if request.reason else "")
    if scope is CancelScope.TASK:
        commit = b.commit(E.CANCEL_REQUESTED, checkpoint=recorded, detail=why)
        commit.status.cancellation = CancellationStatus(
            request_id=request_id, scope=scope, reason=request.reason, requested_at=request.requested_at
        )
        return commit
    step_scoped = scope in (CancelScope.TURN, CancelScope.TOOL_CALL)
    if not effective or not step_scoped or in_flight or state is S.RESUME_VALIDATION:
        # Children are canceled, or in-flight work reconciles first; then the step is abandoned.
        note = "" if effective else f" (no {'tool call' if step_scoped else 'child run'} to cancel)"
        return _keep_waiting_for(b, run, E.CANCEL_RECORDED, recorded, why + note)
    # Nothing in flight: a wait is left for resume validation (which abandons the step); a ready
    # run abandons it at once.
    return b.commit(
        E.STEP_CANCELED, checkpoint=_skip_step(recorded) if state is S.READY else recorded, detail=why
    )


def _keep_waiting_for(b: _Builder, run: RunSnapshot, event: RunEvent, cp: Checkpoint, detail: str) -> Commit:
    """A commit that stays in the current state: what the run waits for stays visible."""
    commit = b.commit(event, checkpoint=cp, waiting_for=run.status.waiting_for, detail=detail)
    commit.status.approval_request = run.status.approval_request
    commit.status.retry_at = run.status.retry_at
    return commit


def _finish_cancel(
    b: _Builder,
    run: RunSnapshot,
    planner: Planner,
    settings: Settings,
    actions: Mapping[str, ActionObservation] | None,
    children: Mapping[str, ChildObservation] | None,
) -> Decision:
    """No new work: cancel what was not dispatched, reconcile what was, then end ``canceled``."""
    cp = b.cp
    if cp.pending_actions and actions is None:
        return NeedActions(_pending_specs(run, cp, planner, settings), cancel=True)
    running = _running_children(cp)
    if running and children is None:
        reason = _children_cancel_reason(cp) or "parent canceled"
        return NeedChildren({c.name: None for c in running}, reason)
    seen = actions or {}
    unsettled = [
        p.action_record_name
        for p in cp.pending_actions
        if (o := seen.get(p.action_record_name)) is None or o.state not in _SETTLED
    ]
    live = [c.name for c in running if (o2 := (children or {}).get(c.name)) is None or not o2.state.terminal]
    if unsettled or live:
        # Dispatched effects are reconciled, never assumed undone: wait for their answers.
        return Idle(reason=f"reconciling before cancel: {', '.join([*unsettled, *live])}")
    names = [s.name for s in run.spec.steps]
    unreversed: list[UnreversedEffect] = []
    records = {e.id: e.uri for e in cp.evidence if isinstance(e, ExternalEvidenceRef)}
    for call in cp.tool_calls:
        uri = records.get(call.result_ref or "", "")
        if call.outcome == "succeeded" and uri.startswith("actionrecord://"):
            record = uri.rsplit("/", 1)[-1]
            unreversed.append(_unreversed(names, call.step_index, call.tool, record, "succeeded"))
    canceled: list[str] = []
    for p in cp.pending_actions:
        o = seen[p.action_record_name]
        if o.state is ActionState.SUCCEEDED:
            unreversed.append(_unreversed(names, p.step_index, p.effect, p.action_record_name, "succeeded"))
        elif o.state is ActionState.CANCELED:
            canceled.append(p.action_record_name)
    proposed: list[str] = []
    if settings.policy is not None and settings.policy.propose_compensations:
        undone = {u.step for u in unreversed}
        proposed = [s.name for s in run.spec.steps if s.effect is not None and s.effect.compensates in undone]
    prior = run.status.cancellation
    status = CancellationStatus(
        request_id=prior.request_id if prior else "unknown",
        scope=CancelScope.TASK,
        reason=prior.reason if prior else "",
        requested_at=prior.requested_at if prior else None,
        unreversed_effects=unreversed[:64],
        canceled_actions=canceled[:64],
        proposed_compensations=proposed[:64],
    )
    message = (
        f"{len(unreversed)} effect(s) happened and were not undone" if unreversed else "no effect happened"
    )
    ended = {c.name: _ended(c, (children or {})[c.name]) for c in running}
    commit = b.commit(
        E.CANCEL_FINISHED,
        checkpoint=cp.model_copy(
            update={"pending_actions": [], "children": [ended.get(c.name, c) for c in cp.children]}
        ),
        outcome=Outcome(reason="Canceled", message=f"{status.reason or 'canceled'}; {message}"),
        detail=f"{len(canceled)} undispatched action(s) canceled; {message}",
    )
    commit.status.cancellation = status
    return commit


_SETTLED = (ActionState.SUCCEEDED, ActionState.FAILED, ActionState.CANCELED)


def _unreversed(names: list[str], index: int, effect: str, record: str, state: str) -> UnreversedEffect:
    step = names[index] if index < len(names) else str(index)
    return UnreversedEffect(step=step, effect=effect, action_record=record, state=state)


# --- quarantine controls ---------------------------------------------------------------------


def _load(run: RunSnapshot, settings: Settings) -> Loaded | Quarantine:
    """The stored checkpoint, migrated and validated, with every sealed value still unsealable.

    A sealed value that cannot be unsealed (its key retired, the ciphertext tampered with, or no
    keyring here at all) quarantines the run: resuming would act without data the run relies on.
    """
    loaded = load_checkpoint(run.raw_checkpoint)
    if isinstance(loaded, Quarantine) or not loaded.checkpoint.sealed:
        return loaded
    if settings.keyring is None:
        names = ", ".join(sorted(loaded.checkpoint.sealed))
        return Quarantine(
            "Undecryptable", f"sealed fields ({names}) and this operator has no sealing keyring"
        )
    return verify_sealed(loaded.checkpoint, keyring=settings.keyring, run_uid=run.run_id) or loaded


def _quarantined(run: RunSnapshot, now: datetime, epoch: Fencing, settings: Settings) -> Decision:
    """A quarantined run moves only on a user's control: cancel, or retry (after an upgrade)."""
    spec, status = run.spec, run.status
    handled = status.cancellation.request_id if status.cancellation else None
    # Only the whole task can be canceled: narrower scopes need a readable checkpoint.
    pending = [
        k
        for k in sorted(spec.cancellations)
        if k != handled and spec.cancellations[k].scope is CancelScope.TASK
    ]
    if pending:
        request = spec.cancellations[pending[0]]
        commit = _untouched(run, now, epoch, E.CANCEL_REQUESTED, None, f"cancellation {pending[0]}")
        commit.status.cancellation = CancellationStatus(
            request_id=pending[0],
            scope=CancelScope.TASK,
            reason=request.reason,
            requested_at=request.requested_at,
        )
        return commit
    token = spec.retry_quarantine
    if token is None or token == status.quarantine_retried:
        return Idle(reason="quarantined: retry (spec.retryQuarantine) or cancel")
    loaded = _load(run, settings)
    if isinstance(loaded, Quarantine):
        return Idle(reason=f"quarantined: still unreadable: {loaded.message}")
    b = _Builder(run, loaded, now, epoch, settings)
    commit = b.commit(
        E.RELEASE_QUARANTINE,
        detail=f"retry {token}: checkpoint readable"
        + (f" (migrated from schemaVersion {loaded.migrated_from})" if loaded.migrated_from else ""),
    )
    commit.status.quarantine_retried = token
    return commit


def _cancel_unreadable(run: RunSnapshot, now: datetime, epoch: Fencing, q: Quarantine) -> Commit:
    # Nothing can be reconciled from an unreadable checkpoint; say so rather than assume anything.
    outcome = Outcome(
        reason="Canceled",
        message=f"canceled with an unreadable checkpoint ({q.reason}): in-flight actions of this run "
        "were not reconciled by it; see its ActionRecords",
    )
    commit = _untouched(run, now, epoch, E.CANCEL_FINISHED, outcome, q.reason)
    commit.status.cancellation = run.status.cancellation
    return commit


# --- building commits ------------------------------------------------------------------------


def _accept(run: RunSnapshot, now: datetime, epoch: Fencing, settings: Settings) -> Commit:
    cp = Checkpoint.model_validate(_initial_checkpoint(run, now, epoch, settings))
    return _Builder(run, Loaded(cp), now, epoch, settings).commit(E.ACCEPTED, detail="spec accepted")


def _initial_checkpoint(
    run: RunSnapshot, now: datetime, epoch: Fencing, settings: Settings
) -> dict[str, Any]:
    agent = run.spec.agent
    cp = Checkpoint(
        position=Position(state=S.PENDING.value, step=0, state_version=run.status.state_version),
        fencing=epoch,
        runtime_config=RuntimeConfig(
            model=agent.model if agent else None,
            prompt=agent.prompt if agent else None,
            tool_set=agent.tool_set if agent else None,
            operator=settings.operator_version,
        ),
        policy=PolicyRef(name=settings.policy_name, version=settings.policy_version)
        if settings.policy_name
        else None,
        timestamps=Timestamps(created_at=now, updated_at=now, entered_state_at=now),
    )
    return dump_checkpoint(cp)


def _quarantine(run: RunSnapshot, now: datetime, epoch: Fencing, q: Quarantine) -> Commit:
    # The checkpoint is left byte-for-byte as stored: a newer operator may still read it.
    outcome = Outcome(reason=q.reason, message=q.message[:4000])
    return _untouched(run, now, epoch, E.QUARANTINE, outcome, q.reason, q.message[:512])


def _untouched(
    run: RunSnapshot,
    now: datetime,
    epoch: Fencing,
    event: RunEvent,
    outcome: Outcome | None,
    history: str,
    detail: str = "",
) -> Commit:
    """A transition that leaves the stored checkpoint exactly as it is (it may be unreadable here)."""
    after = transition(MachinePosition(run.state, run.status.state_version), event)
    status = _status(
        run,
        after.state,
        after.state_version,
        event,
        now,
        epoch,
        waiting_for=None,
        outcome=outcome,
        detail=history,
    )
    raw = dict(run.raw_checkpoint) if run.raw_checkpoint is not None else None
    return Commit(event, status, raw, detail=detail or history)


class _Builder:
    """Assembles one commit: state machine, version, fencing, timestamps, conditions, history."""

    def __init__(
        self, run: RunSnapshot, loaded: Loaded, now: datetime, epoch: Fencing, settings: Settings
    ) -> None:
        self.run, self.cp, self.now, self.epoch = run, loaded.checkpoint, now, epoch
        self.operator_version = settings.operator_version
        self.migrated_from = loaded.migrated_from

    def commit(
        self,
        event: RunEvent,
        *,
        checkpoint: Checkpoint | None = None,
        waiting_for: str | None = None,
        outcome: Outcome | None = None,
        detail: str = "",
    ) -> Commit:
        run, now = self.run, self.now
        after = transition(MachinePosition(run.state, run.status.state_version), event)
        cp = checkpoint or self.cp
        changed = after.state is not run.state
        ts = cp.timestamps.model_copy(
            update={"updated_at": now, "entered_state_at": now if changed else cp.timestamps.entered_state_at}
        )
        if cp.position.step > self.cp.position.step:
            cp = cp.model_copy(update={"retry": RetryState()})  # attempts are counted per step
        runtime = cp.runtime_config
        if self.operator_version is not None:
            runtime = runtime.model_copy(update={"operator": self.operator_version})
        cp = cp.model_copy(
            update={
                "position": cp.position.model_copy(
                    update={"state": after.state.value, "state_version": after.state_version}
                ),
                "fencing": self.epoch,
                "timestamps": ts,
                "runtime_config": runtime,
            }
        )
        status = _status(
            run,
            after.state,
            after.state_version,
            event,
            now,
            self.epoch,
            waiting_for=waiting_for if after.state.waiting else None,
            outcome=outcome,
            detail=detail,
        )
        return Commit(event, status, dump_checkpoint(cp), detail, migrated_from=self.migrated_from)


def _status(
    run: RunSnapshot,
    state: RunState,
    version: int,
    event: RunEvent,
    now: datetime,
    epoch: Fencing,
    *,
    waiting_for: str | None,
    outcome: Outcome | None,
    detail: str,
) -> AgentRunStatus:
    old = run.status
    entry = HistoryEntry(
        state_version=version,
        event=event.value,
        from_state=old.state,
        to_state=state,
        at=now,
        holder=epoch.holder,
        epoch=epoch.lease_transitions,
        detail=detail[:512] or None,
    )
    return AgentRunStatus(
        state=state,
        state_version=version,
        state_since=now if state is not old.state or old.state_since is None else old.state_since,
        run_id=run.run_id,
        waiting_for=waiting_for,
        observed_generation=run.generation,
        outcome=outcome if outcome is not None else old.outcome,
        conditions=conditions_for(state, old.conditions, now, run.generation, outcome, waiting_for),
        history=[*old.history, entry][-HISTORY_LIMIT:],
        cancellation=old.cancellation,
        quarantine_retried=old.quarantine_retried,
    )


def conditions_for(
    state: RunState,
    previous: list[Condition],
    now: datetime,
    generation: int,
    outcome: Outcome | None,
    waiting_for: str | None,
) -> list[Condition]:
    """Waiting, Succeeded, Finished, Quarantined: kept current so ``kubectl wait`` is useful."""
    t, f, u = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN
    camel = "".join(p.capitalize() for p in state.value.split("_"))
    message = (outcome.message if outcome else "") or ""
    wanted = {
        "Waiting": (t, camel, waiting_for or "") if state.waiting else (f, camel, ""),
        "Succeeded": (t, "Completed", message)
        if state is S.COMPLETED
        else (f, outcome.reason if outcome else camel, message)
        if state.terminal
        else (u, camel, ""),
        "Finished": (t, camel, message) if state.terminal else (f, camel, ""),
        "Quarantined": (t, outcome.reason if outcome else camel, message)
        if state is S.QUARANTINED
        else (f, camel, ""),
    }
    before = {c.type: c for c in previous}
    out: list[Condition] = []
    for ctype, (status, reason, msg) in wanted.items():
        prior = before.get(ctype)
        since = prior.last_transition_time if prior is not None and prior.status == status else now
        out.append(
            Condition(
                type=ctype,
                status=status,
                reason=reason,
                message=msg[:32768],
                last_transition_time=since,
                observed_generation=generation,
            )
        )
    return out
