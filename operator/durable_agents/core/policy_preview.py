"""What a new version of a policy would do to a live run: asked of the engine itself, purely.

A GitOps pipeline wants to know, before it merges a policy, what the new version does to the runs
waiting now (``kubectl apply --dry-run=server``, ``kubectl agentrun policy diff``). The answer is
not a second copy of the engine's rules: :func:`preview_run` hands the run, as the engine sees it,
to the engine's own rules under the proposed settings and names what they decide:

- a run waiting for approval: what happens once its request is approved (the decision already
  given, if any) under the new version: the approval stays valid and the intent is committed with
  it; a new approval is asked (the policy moved, or the evidence changed and the policy says
  reapprove); the evidence is refreshed and the run goes on; the request expires; or the action no
  longer needs an approval at all (its tier changed); or the run is refused (fails);
- a run with a committed intent not sent yet: the dispatcher refuses it under the new version
  (an approval it lacks or that no longer binds), so its retry asks for approval;
- any other run: no decision taken under the current version is pending, nothing to predict.

Same inputs, same answer: the preview reads no clock, no cluster and no sealed value beyond what
the engine itself reads; the evidence a run relies on is given as read now (``fresh_evidence``:
absent, it is taken as unchanged).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import (
    Checkpoint,
    Fencing,
    KubernetesEvidenceRef,
    Loaded,
    load_checkpoint,
)
from durable_agents.core.engine.actions import POLICY_CHANGED, Refused, intent_refusal, pending_specs
from durable_agents.core.engine.approvals import await_decision
from durable_agents.core.engine.commits import CommitBuilder
from durable_agents.core.engine.decisions import Commit, Decision, NeedEvidence
from durable_agents.core.engine.loading import load_stored
from durable_agents.core.engine.plan import plan
from durable_agents.core.engine.snapshot import RunSnapshot, Settings
from durable_agents.core.engine.validation import resume_validation
from durable_agents.core.planner import Planner
from durable_agents.core.statemachine import RunEvent

PREVIEW_EPOCH = Fencing(holder="policy-preview", lease_transitions=0)
"""The fencing token the preview's (never written) commits carry."""

PREVIEW_APPROVER = "(preview: approved as asked)"


class Prediction(StrEnum):
    """What the proposed version does to one run (the words of ``policy diff -o json``)."""

    STAYS_VALID = "staysValid"
    NEEDS_REAPPROVAL = "needsReapproval"
    NEEDS_REFRESHED_EVIDENCE = "needsRefreshedEvidence"
    EXPIRES = "expires"
    NO_LONGER_NEEDS_APPROVAL = "noLongerNeedsApproval"
    NEWLY_NEEDS_APPROVAL = "newlyNeedsApproval"
    REFUSED = "refused"
    UNAFFECTED = "unaffected"


@dataclass(frozen=True)
class RunPreview:
    namespace: str
    name: str
    state: str
    prediction: Prediction
    detail: str
    request_id: str | None = None
    """The approval request (waiting for approval) or action record (an intent) it is about."""

    def wire(self) -> dict[str, str | None]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state,
            "prediction": self.prediction.value,
            "detail": self.detail,
            "requestId": self.request_id,
        }


def preview_run(
    run: RunSnapshot,
    *,
    now: datetime,
    planner: Planner,
    current: Settings,
    proposed: Settings,
    fresh_evidence: Mapping[str, KubernetesEvidenceRef | None] | None = None,
) -> RunPreview:
    """What ``proposed`` (the new version's settings) would do to ``run``, which lives under
    ``current`` now: the engine's own rules, asked with the proposed settings."""

    def said(prediction: Prediction, detail: str, request_id: str | None = None) -> RunPreview:
        return RunPreview(run.namespace, run.name, run.state.value, prediction, detail, request_id)

    if run.raw_checkpoint is None or run.state not in (RunState.WAITING_APPROVAL, RunState.WAITING_EXTERNAL):
        return said(Prediction.UNAFFECTED, f"{run.state.value}: no decision of the policy is pending")
    loaded = load_stored(run, current)
    if not isinstance(loaded, Loaded):
        return said(Prediction.UNAFFECTED, f"its checkpoint is not verified here ({loaded.reason})")
    cp = loaded.checkpoint
    if run.state is RunState.WAITING_EXTERNAL:
        return _intents(run, cp, planner, current, proposed, said)
    request = run.status.approval_request
    request_id = request.request_id if request is not None else None
    prediction, detail = _after_approval(run, cp, now, planner, proposed, fresh_evidence)
    return said(prediction, detail, request_id)


def _after_approval(
    run: RunSnapshot,
    cp: Checkpoint,
    now: datetime,
    planner: Planner,
    proposed: Settings,
    fresh: Mapping[str, KubernetesEvidenceRef | None] | None,
) -> tuple[Prediction, str]:
    """A run waiting for approval, under ``proposed``: its wait first (expiry, a decision given),
    else its request approved as asked; then resume validation and, if that lets it on, its step."""
    first = await_decision(CommitBuilder(run, Loaded(cp), now, PREVIEW_EPOCH, proposed), run, proposed)
    if isinstance(first, Commit) and first.event is RunEvent.WAIT_EXPIRED:
        return Prediction.EXPIRES, first.status.outcome.message if first.status.outcome else "expired"
    if isinstance(first, Commit) and first.event is RunEvent.APPROVAL_DECIDED:
        decided = _checkpoint(first)
    elif isinstance(first, Commit):  # expired and asked again, or a decision refused: asked again
        decided = cp
    else:
        decided = _approved_as_asked(cp, now)
    resumed = _next(run, first if isinstance(first, Commit) else None, RunState.RESUME_VALIDATION)
    builder = CommitBuilder(resumed, Loaded(decided), now, PREVIEW_EPOCH, proposed)
    second = resume_validation(builder, resumed, planner, proposed, fresh)
    if isinstance(second, NeedEvidence):  # not read: taken as it was recorded
        unchanged = {ref.id: ref for ref in second.refs}
        second = resume_validation(builder, resumed, planner, proposed, {**unchanged, **(fresh or {})})
    return _classify_revalidation(resumed, second, now, planner, proposed)


def _classify_revalidation(
    resumed: RunSnapshot, decision: Decision, now: datetime, planner: Planner, proposed: Settings
) -> tuple[Prediction, str]:
    if not isinstance(decision, Commit):
        return Prediction.UNAFFECTED, f"resume validation waits ({type(decision).__name__})"
    if decision.event is RunEvent.REAPPROVAL_REQUIRED:
        request = decision.status.approval_request
        return Prediction.NEEDS_REAPPROVAL, request.policy_reason if request else decision.detail
    if decision.event is RunEvent.REFRESH_REQUIRED:
        return Prediction.NEEDS_REFRESHED_EVIDENCE, decision.detail
    if decision.event is not RunEvent.REVALIDATED:
        outcome = decision.status.outcome
        reason = f"{outcome.reason}: {outcome.message}" if outcome else decision.detail
        return Prediction.REFUSED, reason
    # Revalidated: the step is planned under the proposed settings (the intent, or a new request).
    ready = _next(resumed, decision, RunState.READY)
    builder = CommitBuilder(ready, Loaded(_checkpoint(decision)), now, PREVIEW_EPOCH, proposed)
    step = plan(builder, ready, planner, proposed, None, None)
    if not isinstance(step, Commit):
        return Prediction.UNAFFECTED, f"the approved step asks for {type(step).__name__}"
    if step.event is RunEvent.APPROVAL_REQUESTED:
        request = step.status.approval_request
        return Prediction.NEEDS_REAPPROVAL, request.policy_reason if request else step.detail
    if step.intents:
        pending = _checkpoint(step).pending_actions
        if pending and pending[-1].approval_request_id is None:
            return Prediction.NO_LONGER_NEEDS_APPROVAL, decision.detail
        return Prediction.STAYS_VALID, decision.detail
    outcome = step.status.outcome
    if step.state.terminal and outcome is not None and step.event is not RunEvent.SUCCEEDED:
        return Prediction.REFUSED, f"{outcome.reason}: {outcome.message}"
    return Prediction.STAYS_VALID, decision.detail


def _intents(
    run: RunSnapshot,
    cp: Checkpoint,
    planner: Planner,
    current: Settings,
    proposed: Settings,
    said: Callable[..., RunPreview],
) -> RunPreview:
    """A committed intent the dispatcher has not sent yet is checked again before it is sent,
    under the policy as it is then: the dispatcher's own check (:func:`intent_refusal`) of the
    record as committed under ``current``, asked under ``proposed``."""
    committed = pending_specs(run, cp, planner, current)
    for pending in cp.pending_actions:
        name = pending.action_record_name
        record = committed.get(name)
        if record is None or intent_refusal(run, name, record, planner, current) is not None:
            continue
        refused = intent_refusal(run, name, record, planner, proposed)
        if isinstance(refused, Refused) and refused.reason == POLICY_CHANGED:
            why = (
                f"if not sent yet: the dispatcher refuses it ({refused.message}); its retry asks for approval"
            )
            return said(Prediction.NEWLY_NEEDS_APPROVAL, why, name)
        if isinstance(refused, Refused):
            return said(
                Prediction.REFUSED, f"if not sent yet: the dispatcher refuses it ({refused.message})", name
            )
    return said(Prediction.UNAFFECTED, "its committed intents are sent as they are")


def _approved_as_asked(cp: Checkpoint, now: datetime) -> Checkpoint:
    """The checkpoint as the engine records an approval of the pending request (the newest
    undecided one), with no other change."""
    pending = [a for a in cp.approvals if a.decision is None]
    if not pending:
        return cp
    last = pending[-1].model_copy(
        update={"decision": "approved", "decided_by": PREVIEW_APPROVER, "decided_at": now}
    )
    return cp.model_copy(
        update={"approvals": [last if a.request_id == last.request_id else a for a in cp.approvals]}
    )


def _checkpoint(commit: Commit) -> Checkpoint:
    loaded = load_checkpoint(commit.checkpoint)
    assert isinstance(loaded, Loaded), loaded
    return loaded.checkpoint


def _next(run: RunSnapshot, commit: Commit | None, state: RunState) -> RunSnapshot:
    """The run as the engine sees it after ``commit`` (or just moved to ``state``), not written."""
    if commit is not None:
        return replace(run, status=commit.status, raw_checkpoint=commit.checkpoint)
    status = run.status.model_copy(update={"state": state, "state_version": run.status.state_version + 1})
    return replace(run, status=status)
