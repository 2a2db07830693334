"""Effects go through the ledger: each one's intent (an ActionRecord) and its reconciled outcome,
and the rule by which the dispatcher sends only an intent its run's checkpoint holds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from durable_agents.api.v1alpha1 import ActionRecordSpec, ActionState, ActionTier, RunReference
from durable_agents.core.checkpoint import (
    Checkpoint,
    ExternalEvidenceRef,
    PendingAction,
    Quarantine,
    ToolCallRecord,
)
from durable_agents.core.digest import canonical_digest
from durable_agents.core.engine.commits import CommitBuilder
from durable_agents.core.engine.currency import intent_outdated
from durable_agents.core.engine.decisions import Decision, Idle, NeedActions
from durable_agents.core.engine.loading import load_stored
from durable_agents.core.engine.snapshot import ActionObservation, RunSnapshot, Settings
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents.core.planner import PerformEffect, Planner, PlannerError, PlanningContext
from durable_agents.core.policy_resolution import POLICY_REQUIRED, policy_required_message
from durable_agents.core.statemachine import RunEvent

# An action in one of these states has its final answer: the run can take it into account.
SETTLED = (ActionState.SUCCEEDED, ActionState.FAILED, ActionState.CANCELED)

TakeResponse = Callable[[Checkpoint, PendingAction, "ActionObservation"], Checkpoint]
"""What a planner takes into its own part of the checkpoint from an action that succeeded, in the
commit that records the outcome (the model planner: the response, for the model's next turn)."""


def action_spec(
    run: RunSnapshot, index: int, step: PerformEffect, settings: Settings, attempt: int = 0
) -> ActionRecordSpec:
    """The immutable intent of one effect step: the same on every recomputation of one attempt.

    A retry after a definite failure is a new action with its own key (the failed one was not applied).
    """
    key = idempotency_key(run.run_id, index, step.name, attempt)
    compensates = None
    if step.compensates is not None:
        names = [spec_step.name for spec_step in run.spec.steps]
        if step.compensates in names:
            target = names.index(step.compensates)
            compensates = action_record_name(idempotency_key(run.run_id, target, step.compensates))
    return ActionRecordSpec(
        idempotency_key=key,
        run_ref=RunReference(name=run.name, uid=run.uid),
        service_account_name=run.spec.service_account_name,
        step_index=index,
        effect=step.effect,
        tier=step.tier or settings.tiers.get(step.effect, ActionTier.CONSEQUENTIAL),
        target=step.target or None,
        arguments=step.arguments or None,
        compensates=compensates,
    )


def reconcile_actions(
    builder: CommitBuilder,
    run: RunSnapshot,
    planner: Planner,
    settings: Settings,
    actions: Mapping[str, ActionObservation] | None,
    *,
    cancel: bool,
    take: TakeResponse | None = None,
) -> Decision:
    """Take the first settled pending action into the checkpoint; wait while none has settled.

    ``cancel``: when the shell is asked for the actions' states, it cancels undispatched intents too.
    ``take``: what the planner keeps of a succeeded action's response, committed with its outcome.
    """
    cp = builder.cp
    if actions is None:
        return NeedActions(pending_specs(run, cp, planner, settings), cancel=cancel)
    for pending in cp.pending_actions:
        seen = actions.get(pending.action_record_name)
        if seen is None or seen.state not in SETTLED:
            continue
        return _settled(builder, run, pending, seen, take)
    # Still in flight or unknown: the run waits (no expiry: an unknown outcome is never assumed).
    return Idle(wake_at=run.spec.deadline, reason="action in flight")


def _settled(
    builder: CommitBuilder,
    run: RunSnapshot,
    pending: PendingAction,
    seen: ActionObservation,
    take: TakeResponse | None,
) -> Decision:
    """Reconciled: resume from a checkpoint committed after reconciliation, with the authoritative
    outcome as an evidence reference (the raw response body is never in the checkpoint's records;
    a planner that gives it to a model keeps it, sealed and bounded, in its own part: ``take``)."""
    cp = builder.cp
    ref = ExternalEvidenceRef(
        id=f"action-{pending.step_index}-{pending.action_record_name[4:16]}",
        step_index=pending.step_index,
        recorded_at=builder.now,
        uri=f"actionrecord://{run.namespace}/{pending.action_record_name}",
        content_digest=canonical_digest(dict(seen.outcome or {})),
    )
    ok = seen.state is ActionState.SUCCEEDED
    call = ToolCallRecord(
        id=f"call-{pending.step_index}-{pending.action_record_name[4:16]}",
        tool=pending.effect,
        step_index=pending.step_index,
        started_at=builder.now,
        finished_at=builder.now,
        outcome="succeeded" if ok else "failed",
        result_ref=ref.id,
        error=None if ok else f"{seen.reason or seen.state.value}: {seen.message or ''}"[:1024],
        attempt=cp.retry.attempts,
    )
    remaining = [other for other in cp.pending_actions if other is not pending]
    step = cp.position.step + 1 if ok and not remaining else cp.position.step
    settled = cp.model_copy(
        update={
            "pending_actions": remaining,
            "evidence": [*cp.evidence, ref],
            "tool_calls": [*cp.tool_calls, call],
            "position": cp.position.model_copy(update={"step": step}),
        }
    )
    if ok and not remaining and take is not None:  # a failure is the attempt's (resume validation)
        settled = take(settled, pending, seen)
    return builder.commit(
        RunEvent.EXTERNAL_RECEIVED, checkpoint=settled, detail=f"action {pending.effect} {seen.state.value}"
    )


def pending_specs(
    run: RunSnapshot, cp: Checkpoint, planner: Planner, settings: Settings
) -> dict[str, ActionRecordSpec | None]:
    """Each pending action's intent, recomputed (so a record lost from the ledger can be recreated)."""
    return {
        pending.action_record_name: _rebuild_spec(run, cp, planner, settings, pending)
        for pending in cp.pending_actions
    }


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


def intent_digest(spec: ActionRecordSpec) -> str:
    """SHA-256 (RFC 8785 canonical JSON) of what an intent asks for: the effect, its target and
    arguments, and the ServiceAccount it acts as."""
    return canonical_digest(
        {
            "effect": spec.effect,
            "target": spec.target or {},
            "arguments": spec.arguments or {},
            "serviceAccountName": spec.service_account_name,
        }
    )


INTENT_CONFLICT = "IntentConflict"


def conflicting_record(record: Mapping[str, Any], expected: ActionRecordSpec) -> ActionObservation | None:
    """The ledger's record under this intent's key asks for something else (a run's status
    restored from before the key was used for another call: the key is run, step and attempt, not
    the arguments): its outcome is not this intent's. Seen as a failed action, so nothing is
    recorded as done that was not, and a retry uses a new key. None when the record is this intent."""
    try:
        found = ActionRecordSpec.model_validate(record.get("spec") or {})
    except ValueError:
        found = None
    if found is not None and intent_digest(found) == intent_digest(expected):
        return None
    return ActionObservation(
        ActionState.FAILED,
        reason=INTENT_CONFLICT,
        message=(
            f"the ledger's record for key {expected.idempotency_key!r} asks for another effect, target "
            "or arguments than this step's intent (its run's status was restored from an earlier "
            "point?): its outcome is not this action's, and this intent was not sent"
        ),
    )


@dataclass(frozen=True)
class PolicyUnknown:
    """The run names an AgentPolicy that is missing or not usable (a version reused with other
    content): nothing is sent without it."""

    reason: str
    message: str


@dataclass(frozen=True)
class Unverified:
    """The run's checkpoint cannot be read or verified here (quarantined, or written by a newer
    operator), or its policy is unknown: the intent is neither sent nor refused yet."""

    problem: Quarantine | PolicyUnknown


NOT_IN_CHECKPOINT = "NotInCheckpoint"
POLICY_CHANGED = "PolicyChanged"


@dataclass(frozen=True)
class Refused:
    """The intent is not the run's, or not one its policy allows now: never to be dispatched."""

    message: str
    reason: str = NOT_IN_CHECKPOINT


def intent_refusal(
    run: RunSnapshot | None,
    name: str,
    record: ActionRecordSpec,
    planner: Planner | None,
    settings: Settings,
) -> Refused | Unverified | None:
    """Whether the ledger may send the ActionRecord ``name`` (None: it may).

    Only if its run (``record.runRef``) exists and the run's committed, verified checkpoint holds
    exactly this intent: a pending action with the same idempotency key and record name, whose
    intent, recomputed from the run's spec and checkpoint as the engine built it
    (:func:`pending_specs`), has the same :func:`intent_digest`, as the run's ServiceAccount.
    """
    if run is None:
        return Refused(f"its run {record.run_ref.name!r} does not exist")
    if record.service_account_name != run.spec.service_account_name:
        return Refused(
            f"it acts as ServiceAccount {record.service_account_name!r}, but run {run.name!r} "
            f"runs as {run.spec.service_account_name!r}"
        )
    loaded = load_stored(run, settings)
    if isinstance(loaded, Quarantine):
        return Unverified(loaded)
    cp = loaded.checkpoint
    pending = next((p for p in cp.pending_actions if p.idempotency_key == record.idempotency_key), None)
    if (
        pending is None
        or pending.action_record_name != name
        or action_record_name(pending.idempotency_key) != name
    ):
        return Refused(
            f"run {run.name!r}'s checkpoint holds no pending action with key "
            f"{record.idempotency_key!r} recorded as {name!r}"
        )
    expected = pending_specs(run, cp, planner, settings).get(name) if planner is not None else None
    if expected is None:
        return Refused(f"run {run.name!r} does not intend {record.idempotency_key!r} at its current step")
    if settings.policy is None and settings.policy_required and expected.tier is not ActionTier.READ_ONLY:
        # The engine commits no such intent for an ungoverned run: this one was forged (or the
        # policy it was committed under no longer resolves): nothing is sent.
        return Refused(policy_required_message(record.effect, expected.tier.value), reason=POLICY_REQUIRED)
    wanted, asked = intent_digest(expected), intent_digest(record)
    if wanted != asked:
        return Refused(
            f"the requested effect (digest {asked}) differs from the intent run {run.name!r} "
            f"committed (digest {wanted})"
        )
    # Committed under a policy the run's approval no longer satisfies (changed after the write's
    # own check): not sent; the attempt fails as not applied, a retry asks for approval again.
    outdated = intent_outdated(cp, pending, expected, settings)
    return Refused(outdated, reason=POLICY_CHANGED) if outdated is not None else None
