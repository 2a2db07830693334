"""Approvals: an effect the policy says needs one waits for a decision bound to its exact digest,
and the approval is checked again, after the wait, before the run acts on it.

Only a decision the operator's admission webhook stamped counts (:mod:`durable_agents.core.authority`).
One it cannot verify is never recorded as a decision: it is refused once (status
``refusedRequests``, condition ``RequestRefused``, an Event) and, since its request ID is taken
for good (``spec.approvals`` is append-only), the run asks again under a new request ID.

Under a quorum (the policy's ``approvers.quorum``/``quorumByTier``, recorded with the request in
the checkpoint), each decision has its own key (``<request ID>.<k>``); the request is approved once
that many distinct people's verified approvals are in, rejected by any one verified rejection
(:func:`durable_agents.core.approvals.tally`), and until then the approvals so far are shown on the
request without a transition. There, a decision that cannot be verified is refused in place: its
key blocks nobody, and the verified approvals of others stand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from durable_agents.api.v1alpha1 import (
    ActionRecordSpec,
    AgentPolicySpec,
    AgentRunStatus,
    ApprovalDecision,
    ApprovalRequest,
    ApprovalVote,
    ChangeResponse,
    Condition,
    ConditionStatus,
    DefinitionChangeResponse,
    ExpiryAction,
    ModelProposal,
    Outcome,
)
from durable_agents.core.approvals import Tally, approval_digest, decision_keys, tally
from durable_agents.core.authority import Unproven, decision_unproven
from durable_agents.core.checkpoint import ApprovalRecord, Checkpoint, KubernetesEvidenceRef
from durable_agents.core.definitions import DEFINITION_CHANGED, DefinitionChange, definition_change
from durable_agents.core.durations import parse_duration
from durable_agents.core.engine.actions import action_spec
from durable_agents.core.engine.commits import (
    CommitBuilder,
    already_refused,
    note_status,
    refusal_of,
    refuse,
    refuse_in,
)
from durable_agents.core.engine.currency import policy_moved
from durable_agents.core.engine.decisions import Commit, Decision, Idle, NeedEvidence
from durable_agents.core.engine.rejections import after_rejection
from durable_agents.core.engine.snapshot import RunSnapshot, Settings
from durable_agents.core.planner import PerformEffect, Planner, PlannerError, PlanningContext
from durable_agents.core.statemachine import RunEvent

FOUR_EYES = "FourEyes"


def _approvals_of_step(cp: Checkpoint, index: int) -> list[ApprovalRecord]:
    return [approval for approval in cp.approvals if approval.step_index == index]


def changed_definition(run: RunSnapshot, settings: Settings) -> DefinitionChange | None:
    """What the policy says of a change of the Agent a run pinned (None: none, or no policy)."""
    response = (
        settings.policy.freshness.definition_changed if settings.policy else DefinitionChangeResponse.KEEP
    )
    return definition_change(run.pinned, settings.definition_now, response)


def kept_definition(builder: CommitBuilder, settings: Settings) -> Decision | None:
    """A change of the run's Agent the policy keeps the pinned definition through: said once in
    the DefinitionChanged condition (for `kubectl agentrun why`), nothing else changes."""
    run = builder.run
    change = changed_definition(run, settings)
    if change is None or change.response is not DefinitionChangeResponse.KEEP:
        return None
    shown = next((c for c in run.status.conditions if c.type == DEFINITION_CHANGED), None)
    if shown is not None and shown.message == change.message:
        return None
    status = run.status.model_copy(deep=True)
    status.conditions = [c for c in status.conditions if c.type != DEFINITION_CHANGED] + [
        Condition(
            type=DEFINITION_CHANGED,
            status=ConditionStatus.TRUE,
            reason="PinnedDefinitionKept",
            message=change.message,
            last_transition_time=builder.now,
        )
    ]
    return note_status(run, status, change.message)


def definition_rule(builder: CommitBuilder, settings: Settings) -> Decision | None:
    """Out of a wait: a change of the run's Agent that the policy fails the run for; a kept one is
    noted (:func:`kept_definition`); reapprove applies to approvals only."""
    change = changed_definition(builder.run, settings)
    if change is not None and change.response is DefinitionChangeResponse.FAIL:
        return builder.commit(
            RunEvent.ATTEMPT_FAILED, outcome=Outcome(reason="DefinitionChanged", message=change.message)
        )
    return kept_definition(builder, settings)


def approved_for(
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
        service_account=run.spec.service_account_name,
        policy_version=last.policy_version,
        run_uid=run.run_id,
        request_id=last.request_id,
        tool=step.tool,
        definition=cp.definition.current() if cp.definition else None,
    )
    return last if digest == last.digest else None


def _proposal(cp: Checkpoint, index: int, step: PerformEffect) -> ModelProposal | None:
    """What the model proposed and said, for a call the model planner proposed (its words are
    shown to the approver as its own, sealed as the checkpoint holds them; never authority)."""
    pending = cp.agent.pending if cp.agent is not None else None
    if step.tool is None or pending is None or pending.step_index != index:
        return None
    return ModelProposal(
        tool=pending.tool, call_id=pending.call_id, turn=pending.index, reason=pending.reason
    )


def request_approval(
    builder: CommitBuilder,
    run: RunSnapshot,
    spec: ActionRecordSpec,
    step: PerformEffect,
    settings: Settings,
    *,
    reason: str,
    cp: Checkpoint | None = None,
    event: RunEvent = RunEvent.APPROVAL_REQUESTED,
) -> Commit:
    """ONE commit writes the request (status + checkpoint) and enters waiting_approval."""
    cp = cp or builder.cp
    policy = settings.policy
    assert policy is not None
    index = spec.step_index
    request_id = f"{step.name}-{len(_approvals_of_step(cp, index)) + 1}"
    version = settings.policy_version or "unversioned"
    digest = approval_digest(
        effect=step.effect,
        arguments=spec.arguments,
        target=spec.target,
        service_account=run.spec.service_account_name,
        policy_version=version,
        run_uid=run.run_id,
        request_id=request_id,
        tool=step.tool,
        definition=cp.definition.current() if cp.definition else None,
    )
    expires = builder.now + parse_duration(policy.approval_expiry)
    rule = policy.approvers
    request = ApprovalRequest(
        request_id=request_id,
        digest=digest,
        step=step.name,
        effect=step.effect,
        tier=spec.tier,
        target=spec.target,
        arguments=spec.arguments,
        evidence=[ref.id for ref in cp.evidence],
        policy_version=version,
        policy_reason=f"policy {settings.policy_name}@{version} requires approval for {reason}",
        approver_role=f"{rule.verb} on {rule.resource}"
        + (" (not the run's creator)" if rule.four_eyes else ""),
        service_account=run.spec.service_account_name,
        expires_at=expires,
        allowed_decisions=[decision.value for decision in policy.allowed_decisions],
        proposal=_proposal(cp, index, step),
        approver_verb=rule.verb,
        approver_resource=rule.resource,
        four_eyes=rule.four_eyes,
        quorum=rule.quorum_by_tier.get(spec.tier.value, rule.quorum),
    )
    # Quorum and four-eyes go into the checkpoint (integrity-stamped, unlike the status): the
    # engine counts decisions by the rules the request was made under. Absent at one, unset.
    quorum = request.quorum
    record = ApprovalRecord(
        request_id=request_id,
        digest=digest,
        expires_at=expires,
        policy_version=version,
        step_index=index,
        quorum=quorum if quorum > 1 else None,
        four_eyes=True if rule.four_eyes else None,
    )
    commit = builder.commit(
        event,
        checkpoint=cp.model_copy(update={"approvals": [*cp.approvals, record]}),
        waiting_for=f"approval:{request_id}",
        detail=f"approval {request_id} for {step.effect}: {reason}",
    )
    commit.status.approval_request = request
    return commit


def await_decision(builder: CommitBuilder, run: RunSnapshot, settings: Settings) -> Decision:
    """In waiting_approval: count the decisions stamped for this exact request (its quorum of
    distinct approvers, or one rejection), refuse one that is not, or expire per policy."""
    cp = builder.cp
    request = run.status.approval_request
    pending = [approval for approval in cp.approvals if approval.decision is None]
    if request is None or not pending:
        return builder.commit(RunEvent.APPROVAL_DECIDED, detail="no pending approval request recorded")
    record = pending[-1]
    change = changed_definition(run, settings)
    if change is not None and change.response is not DefinitionChangeResponse.KEEP:
        # Decided in resume validation: the run fails, or a new request binds the new definition.
        return builder.commit(RunEvent.REVALIDATION_REQUIRED, detail=change.message)
    expired = builder.now >= record.expires_at
    verified: dict[str, ApprovalDecision] = {}
    unproven: dict[str, Unproven] = {}
    for key in decision_keys(run.spec.approvals, record.request_id):
        problem = _unproven_decision(run, record, key, run.spec.approvals[key], settings)
        if problem is None:
            verified[key] = run.spec.approvals[key]
        else:
            unproven[key] = problem
    # The creator is among the unproven under four-eyes (_unproven_decision): never counted.
    counted = tally(verified, record.request_id, quorum=record.quorum or 1, creator=None, four_eyes=False)
    if unproven and not expired:
        refused = _refused(builder, run, record, unproven, decided=counted.outcome is not None)
        if refused is not None:
            return refused
    if counted.outcome is not None:
        return _decided(builder, record, counted)
    if expired:
        policy = settings.policy
        if policy is not None and policy.freshness.approval_expired is ExpiryAction.REAPPROVE:
            return builder.commit(
                RunEvent.REVALIDATION_REQUIRED, detail=f"approval request {record.request_id} expired"
            )
        return builder.commit(
            RunEvent.WAIT_EXPIRED,
            outcome=Outcome(reason="ApprovalExpired", message=f"nobody decided {record.request_id} in time"),
        )
    votes = [ApprovalVote(approver=v.approver, key=v.key, decided_at=v.decided_at) for v in counted.approvals]
    if votes != request.approved_by:  # only ever under a quorum: one approval decides otherwise
        return note_status(
            run, _shown_votes(run, votes), f"{record.request_id}: {len(votes)} of {counted.quorum}"
        )
    deadline = run.spec.deadline
    return Idle(
        wake_at=min(record.expires_at, deadline) if deadline else record.expires_at, reason="approval"
    )


def _shown_votes(run: RunSnapshot, votes: list[ApprovalVote]) -> AgentRunStatus:
    """The run's status with the approvals so far shown on its request (nothing else changed)."""
    status = run.status.model_copy(deep=True)
    assert status.approval_request is not None
    status.approval_request.approved_by = votes
    return status


def _refused(
    builder: CommitBuilder,
    run: RunSnapshot,
    record: ApprovalRecord,
    unproven: Mapping[str, Unproven],
    *,
    decided: bool,
) -> Decision | None:
    """Decisions that cannot be taken. Under a quorum, each is refused once in place (no
    transition): its key blocks nobody (the next decision takes the next key) and the verified
    decisions of others stand. When one approval decides: a verified decision decides (None);
    else the first is refused once and the run asks again under a new request ID (as ever)."""
    if record.quorum is not None:
        key = next((key for key in unproven if not already_refused(run.status, "approvals", key)), None)
        return None if key is None else refuse(run, refusal_of("approvals", key, unproven[key], builder.now))
    if decided:
        return None
    key, problem = next(iter(unproven.items()))
    # Never acted on, never recorded as decided: the run asks again (resume validation).
    commit = builder.commit(
        RunEvent.REVALIDATION_REQUIRED,
        detail=f"decision on {record.request_id} refused ({problem.reason}): a new request follows",
    )
    return refuse_in(commit, refusal_of("approvals", key, problem, builder.now))


def _decided(builder: CommitBuilder, record: ApprovalRecord, counted: Tally) -> Commit:
    """The request decided: one rejection, or the quorum's last approval (who approved, recorded)."""
    vote = counted.rejection or counted.approvals[-1]
    approvers = [v.approver for v in counted.approvals] if record.quorum is not None else None
    decided = record.model_copy(
        update={
            "decision": counted.outcome,
            "decided_by": vote.approver,
            "decided_at": vote.decided_at or builder.now,
            "approved_by": approvers if counted.outcome == "approved" else None,
        }
    )
    cp = builder.cp
    approvals = [decided if a.request_id == record.request_id else a for a in cp.approvals]
    by = vote.approver if counted.rejection else ", ".join(v.approver for v in counted.approvals)
    commit = builder.commit(
        RunEvent.APPROVAL_DECIDED,
        checkpoint=cp.model_copy(update={"approvals": approvals}),
        detail=f"{vote.decision} {record.request_id} by {by}",
    )
    commit.status.approval_request = None
    return commit


def _unproven_decision(
    run: RunSnapshot, record: ApprovalRecord, key: str, decision: ApprovalDecision, settings: Settings
) -> Unproven | None:
    """Why the decision under ``key`` cannot be taken for ``record``: its stamp, its digest, then
    four-eyes (the second line: the webhook refuses the creator, but may be off or misconfigured)."""
    problem = decision_unproven(settings.keyring, run.run_id, key, decision)
    if problem is not None:
        return problem
    if decision.approver is None:
        return Unproven("Unstamped", f"the decision on {key!r} names no approver")
    if decision.digest != record.digest:
        return Unproven(
            "DigestMismatch",
            f"the decision on {key!r} names digest {decision.digest}, the request binds {record.digest}",
        )
    policy = settings.policy
    four_eyes = bool(record.four_eyes) or (policy is not None and policy.approvers.four_eyes)
    creator = run.spec.created_by
    if four_eyes and creator is not None and creator.username == decision.approver.username:
        return Unproven(
            FOUR_EYES, f"{creator.username!r} created this run and may not decide it (four-eyes policy)"
        )
    return None


def decided_approval_of_step(cp: Checkpoint) -> ApprovalRecord | None:
    """The approval decided (or expired) during the wait, for the step about to act, not acted on."""
    records = _approvals_of_step(cp, cp.position.step)
    if not records:
        return None
    last = records[-1]
    acted = any(pending.approval_request_id == last.request_id for pending in cp.pending_actions) or any(
        call.step_index == cp.position.step for call in cp.tool_calls
    )
    return None if acted else last


def revalidate_approval(
    builder: CommitBuilder,
    run: RunSnapshot,
    planner: Planner,
    settings: Settings,
    record: ApprovalRecord,
    fresh: Mapping[str, KubernetesEvidenceRef | None] | None,
) -> Decision:
    """Before acting on an approval, check it still binds what will happen: the action's digest,
    the installed effect, the policy version and the evidence the approver was shown."""
    cp, policy = builder.cp, settings.policy
    change = changed_definition(run, settings)
    if change is not None and change.response is DefinitionChangeResponse.FAIL:
        return builder.commit(
            RunEvent.ATTEMPT_FAILED, outcome=Outcome(reason="DefinitionChanged", message=change.message)
        )
    if record.decision == "rejected":  # the run ends, or (replan) the model is told why
        return after_rejection(builder, run, planner, settings, record)
    try:
        step = planner.next_step(PlanningContext(run.spec, cp))
    except PlannerError as err:
        return builder.commit(RunEvent.ATTEMPT_FAILED, outcome=Outcome(reason=err.reason, message=str(err)))
    if not isinstance(step, PerformEffect) or policy is None:
        return builder.commit(RunEvent.REVALIDATED, detail="the approved step no longer needs approval")
    spec = action_spec(run, cp.position.step, step, settings, cp.retry.attempts)
    if spec.tier not in policy.approval_required_tiers:
        # The policy changed its tiers during the wait: the action is planned again as any other
        # of its tier (no approval asked, none used), never held for one nobody needs to give.
        return builder.commit(
            RunEvent.REVALIDATED, detail=f"a {spec.tier.value} effect no longer needs approval"
        )

    def reapprove(reason: str, checkpoint: Checkpoint | None = None) -> Commit:
        return request_approval(
            builder,
            run,
            spec,
            step,
            settings,
            reason=reason,
            cp=checkpoint,
            event=RunEvent.REAPPROVAL_REQUIRED,
        )

    if change is not None and change.response is DefinitionChangeResponse.REAPPROVE:
        assert cp.definition is not None
        assert settings.definition_now is not None
        moved_to = cp.definition.model_copy(update={"approved_under": settings.definition_now.digest})
        return reapprove(change.message, cp.model_copy(update={"definition": moved_to}))
    if record.decision is None:  # refused, or expired and the policy says: ask again
        refused = next(
            (r for r in run.status.refused_requests if (r.field, r.key) == ("approvals", record.request_id)),
            None,
        )
        if refused is not None:
            return reapprove(
                f"a new request (the decision on {record.request_id} was refused: {refused.reason})"
            )
        return reapprove("a new request (the last one expired)")
    if approved_for(cp, cp.position.step, run, spec, step) is None:
        return reapprove("the action changed since it was approved")
    if settings.available_effects is not None and step.effect not in settings.available_effects:
        return builder.commit(
            RunEvent.ATTEMPT_FAILED,
            outcome=Outcome(reason="EffectUnavailable", message=f"effect {step.effect!r} is not installed"),
        )
    moved = policy_moved(record.policy_version, settings)
    if moved is not None:
        return reapprove(moved)
    return _recheck_evidence(builder, record, policy, fresh, reapprove)


def _recheck_evidence(
    builder: CommitBuilder,
    record: ApprovalRecord,
    policy: AgentPolicySpec,
    fresh: Mapping[str, KubernetesEvidenceRef | None] | None,
    reapprove: Callable[[str, Checkpoint | None], Commit],
) -> Decision:
    """The evidence the approver was shown, read again: if it changed during the wait, the policy
    says whether to ask again, refresh it and go on, or go on as approved."""
    cp = builder.cp
    refs = tuple(ref for ref in cp.evidence if isinstance(ref, KubernetesEvidenceRef))
    if refs and fresh is None:
        return NeedEvidence(refs)
    seen = fresh or {}
    changed = [
        ref
        for ref in refs
        if (current := seen.get(ref.id)) is None
        or (current.resource_version, current.content_digest) != (ref.resource_version, ref.content_digest)
    ]
    if changed:
        names = ", ".join(f"{ref.kind}/{ref.name}" for ref in changed)
        refreshed = cp.model_copy(update={"evidence": [seen.get(ref.id) or ref for ref in cp.evidence]})
        response = policy.freshness.evidence_changed
        if response is ChangeResponse.REAPPROVE:
            return reapprove(f"evidence changed during the wait: {names}", refreshed)
        if response is ChangeResponse.REFRESH:
            return builder.commit(
                RunEvent.REFRESH_REQUIRED, checkpoint=refreshed, detail=f"evidence refreshed: {names}"
            )
    return builder.commit(RunEvent.REVALIDATED, detail=f"approval {record.request_id} still binds the action")
