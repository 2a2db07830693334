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

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from durable_agents.api.v1alpha1 import (
    HISTORY_LIMIT,
    ActionRecordSpec,
    ActionState,
    ActionTier,
    AgentPolicySpec,
    AgentRunSpec,
    AgentRunStatus,
    ApprovalRequest,
    ChangeResponse,
    Condition,
    ConditionStatus,
    ExpiryAction,
    HistoryEntry,
    ObjectReference,
    Outcome,
    RunReference,
    WaitExpiries,
)
from durable_agents.core.approvals import approval_digest
from durable_agents.core.checkpoint import (
    ApprovalRecord,
    Checkpoint,
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
    RuntimeConfig,
    Timestamps,
    ToolCallRecord,
    dump_checkpoint,
    load_checkpoint,
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
)
from durable_agents.core.statemachine import Position as MachinePosition
from durable_agents.core.statemachine import RunEvent, RunState, transition

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
    """The run waits on these actions: make sure each record exists, then report its state."""

    records: dict[str, ActionRecordSpec | None]


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

    @property
    def state(self) -> RunState:
        return self.status.state

    def wire_status(self) -> dict[str, Any]:
        out = self.status.wire()
        if self.checkpoint is not None:
            out["checkpoint"] = self.checkpoint
        return out


Decision = Idle | NeedRead | NeedActions | NeedEvidence | Commit


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
) -> Decision:
    """The next thing to do for ``run``; see the module docstring."""
    settings = settings or Settings()
    state = run.state
    if state.terminal or state is S.QUARANTINED:
        return Idle(reason=f"run is {state.value}")
    past_deadline = run.spec.deadline is not None and now >= run.spec.deadline
    if state is S.PENDING and run.raw_checkpoint is None and not past_deadline:
        return _accept(run, now, epoch, settings)

    loaded = (
        Loaded(Checkpoint.model_validate(_initial_checkpoint(run, now, epoch, settings)))
        if run.raw_checkpoint is None
        else load_checkpoint(run.raw_checkpoint)
    )
    if isinstance(loaded, Quarantine):
        return _quarantine(run, now, epoch, loaded)
    b = _Builder(run, loaded, now, epoch)

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

    if state in (S.WAITING_RETRY, S.CANCEL_REQUESTED):
        return Idle(reason=f"{state.value} is handled by a later component")

    if state is S.RESUME_VALIDATION:
        failed = _failed_call_of_step(cp)
        if failed is not None:
            return b.commit(
                E.ATTEMPT_FAILED,
                outcome=Outcome(reason="ActionFailed", message=f"{failed.tool}: {failed.error or 'failed'}"),
                detail=f"step {cp.position.step} failed",
            )
        decided = _decided_approval_of_step(cp)
        if decided is not None:
            return _revalidate_approval(b, run, planner, settings, decided, fresh_evidence)
        # Material facts: the deadline (checked above) and the checkpoint itself.
        return b.commit(E.REVALIDATED, detail="checkpoint valid, deadline not passed")

    if state is S.PENDING:  # a checkpoint exists but acceptance was not committed: accept again
        return b.commit(E.ACCEPTED)

    return _plan(b, run, planner, settings, read)


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
            return b.commit(
                E.ATTEMPT_FAILED,
                outcome=Outcome(reason=read.error_reason or "ReadFailed", message=read.error_message),
                detail=f"read {step.ref.kind}/{step.ref.name} failed",
            )
        call = ToolCallRecord(
            id=f"call-{index}-{step.name}",
            tool="kubernetes.read",
            step_index=index,
            started_at=now,
            finished_at=now,
            outcome="succeeded",
            result_ref=read.evidence.id,
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
        spec = action_spec(run, index, step, settings)
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
    assert isinstance(step, Finish)
    return b.commit(
        E.SUCCEEDED,
        checkpoint=cp.model_copy(update={"position": cp.position.model_copy(update={"step": index + 1})}),
        outcome=Outcome(reason="Completed", message=f"finished at step {step.name}", result=step.result),
    )


def action_spec(run: RunSnapshot, index: int, step: PerformEffect, settings: Settings) -> ActionRecordSpec:
    """The immutable intent of one effect step: the same on every recomputation."""
    key = idempotency_key(run.uid, index, step.name)
    compensates = None
    if step.compensates is not None:
        names = [s.name for s in run.spec.steps]
        if step.compensates in names:
            target = names.index(step.compensates)
            compensates = action_record_name(idempotency_key(run.uid, target, step.compensates))
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
        specs: dict[str, ActionRecordSpec | None] = {}
        for pending in cp.pending_actions:
            specs[pending.action_record_name] = _rebuild_spec(run, cp, planner, settings, pending)
        return NeedActions(specs)
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


def _rebuild_spec(
    run: RunSnapshot, cp: Checkpoint, planner: Planner, settings: Settings, pending: PendingAction
) -> ActionRecordSpec | None:
    try:
        step = planner.next_step(PlanningContext(run.spec, cp))
    except PlannerError:
        return None
    if not isinstance(step, PerformEffect):
        return None
    spec = action_spec(run, pending.step_index, step, settings)
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
        run_uid=run.uid,
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
        run_uid=run.uid,
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
    spec = action_spec(run, cp.position.step, step, settings)

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
    calls = [c for c in cp.tool_calls if c.step_index == cp.position.step]
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
    loaded = load_checkpoint(run.raw_checkpoint)
    if isinstance(loaded, Quarantine):
        return None
    status = run.status.wire()
    status["checkpoint"] = dump_checkpoint(loaded.checkpoint.model_copy(update={"fencing": epoch}))
    return status


# --- building commits ------------------------------------------------------------------------


def _accept(run: RunSnapshot, now: datetime, epoch: Fencing, settings: Settings) -> Commit:
    cp = Checkpoint.model_validate(_initial_checkpoint(run, now, epoch, settings))
    return _Builder(run, Loaded(cp), now, epoch).commit(E.ACCEPTED, detail="spec accepted")


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
        ),
        policy=PolicyRef(name=settings.policy_name, version=settings.policy_version)
        if settings.policy_name
        else None,
        timestamps=Timestamps(created_at=now, updated_at=now, entered_state_at=now),
    )
    return dump_checkpoint(cp)


def _quarantine(run: RunSnapshot, now: datetime, epoch: Fencing, q: Quarantine) -> Commit:
    # The checkpoint is left byte-for-byte as stored: a newer operator may still read it.
    after = transition(MachinePosition(run.state, run.status.state_version), E.QUARANTINE)
    status = _status(
        run,
        after.state,
        after.state_version,
        E.QUARANTINE,
        now,
        epoch,
        waiting_for=None,
        outcome=Outcome(reason=q.reason, message=q.message[:4000]),
        detail=q.reason,
    )
    raw = dict(run.raw_checkpoint) if run.raw_checkpoint is not None else None
    return Commit(E.QUARANTINE, status, raw, detail=q.message[:512])


class _Builder:
    """Assembles one commit: state machine, version, fencing, timestamps, conditions, history."""

    def __init__(self, run: RunSnapshot, loaded: Loaded, now: datetime, epoch: Fencing) -> None:
        self.run, self.cp, self.now, self.epoch = run, loaded.checkpoint, now, epoch

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
        cp = cp.model_copy(
            update={
                "position": cp.position.model_copy(
                    update={"state": after.state.value, "state_version": after.state_version}
                ),
                "fencing": self.epoch,
                "timestamps": ts,
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
        return Commit(event, status, dump_checkpoint(cp), detail)


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
        waiting_for=waiting_for,
        observed_generation=run.generation,
        outcome=outcome if outcome is not None else old.outcome,
        conditions=conditions_for(state, old.conditions, now, run.generation, outcome, waiting_for),
        history=[*old.history, entry][-HISTORY_LIMIT:],
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
