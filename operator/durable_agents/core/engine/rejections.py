"""What a verified rejection does (the policy's ``rejection``): the run ends, or the model is told.

Under ``end`` (the default), and for any step the model did not propose (a scripted step), the run
fails with ``ApprovalRejected`` as it always has. Under ``replan``, a call the model proposed is
closed with a tool result saying it was rejected and why (the approver's reason, sealed in the
turn's result like every other input of the model), the run moves past that step and the model is
asked again: its next request carries the reason, and what it proposes then is a new step, so a new
request with a new request ID and a new digest. The rejection stays in the run's approvals (and its
history); their count is the run's rejection count, capped by ``maxRejections``: the rejection
after the cap ends the run as ``end`` does. The agent limits (turns, model calls) still apply.

The reason given to the model is the one the operator's stamp proves (a decision the engine took,
read again and verified now); a decision whose stamp no longer verifies gives the model no text.
The transition is one commit (the settled turn and the new position together): a crash before it
decides the same again; after it, the model's request is rebuilt from the checkpoint.
"""

from __future__ import annotations

from typing import Any, Final

from durable_agents.api.v1alpha1 import Outcome, RejectionResponse, RejectionRule
from durable_agents.core.agent.planner import ModelPlanner
from durable_agents.core.agent_facts import settle_last
from durable_agents.core.approvals import decision_keys
from durable_agents.core.authority import decision_unproven
from durable_agents.core.checkpoint import ApprovalRecord, Checkpoint
from durable_agents.core.engine.commits import CommitBuilder
from durable_agents.core.engine.decisions import Commit
from durable_agents.core.engine.snapshot import RunSnapshot, Settings
from durable_agents.core.planner import Planner
from durable_agents.core.statemachine import RunEvent

REJECTED = "ApprovalRejected"
TOLD_THE_MODEL: Final = (
    "A person who approves this run's actions rejected this call: it was not executed. Propose "
    "something they can approve, or answer without it."
)


def rejection_count(cp: Checkpoint) -> int:
    """The run's rejections so far: its approval records decided ``rejected`` (each stays)."""
    return sum(1 for record in cp.approvals if record.decision == "rejected")


def verified_reason(run: RunSnapshot, record: ApprovalRecord, settings: Settings) -> str | None:
    """The reason of the rejection ``record`` holds, from a decision in the spec that decides its
    request, names its digest and its approver and whose stamp verifies now; else None."""
    for key in decision_keys(run.spec.approvals, record.request_id):
        decision = run.spec.approvals[key]
        if (
            decision.decision == "reject"
            and decision.approver is not None
            and decision.approver.username == record.decided_by
            and decision.digest == record.digest
            and decision_unproven(settings.keyring, run.run_id, key, decision) is None
        ):
            return decision.reason or None
    return None


def rejection_result(reason: str | None, left: int) -> dict[str, Any]:
    """What the model is told as the rejected call's result (fixed text, and the person's reason)."""
    told: dict[str, Any] = {"status": "rejected", "message": TOLD_THE_MODEL, "rejectionsLeft": left}
    if reason is not None:
        told["reason"] = reason
    return told


def after_rejection(
    builder: CommitBuilder, run: RunSnapshot, planner: Planner, settings: Settings, record: ApprovalRecord
) -> Commit:
    """``record`` was rejected (a verified decision): end the run, or replan (see the module)."""
    rule = settings.policy.rejection if settings.policy is not None else RejectionRule()
    cp = builder.cp
    facts = cp.agent
    pending = facts.pending if facts is not None else None
    if (
        rule.response is not RejectionResponse.REPLAN
        or not isinstance(planner, ModelPlanner)
        or facts is None
        or pending is None
        or pending.step_index != record.step_index
    ):
        return _end(builder, record)
    count = rejection_count(cp)
    if count > rule.max_rejections:
        cap = f"; the policy's cap of {rule.max_rejections} rejections per run was reached"
        return _end(builder, record, cap)
    inputs = planner.inputs
    result = rejection_result(verified_reason(run, record, settings), rule.max_rejections - count)
    facts = settle_last(facts, inputs.data_key, entropy=inputs.entropy, outcome="refused", result=result)
    position = cp.position.model_copy(update={"step": pending.step_index + 1})
    return builder.commit(
        RunEvent.REVALIDATED,
        checkpoint=cp.model_copy(update={"agent": facts, "position": position}),
        detail=(
            f"{record.decided_by} rejected {record.request_id} (rejection {count} of at most "
            f"{rule.max_rejections}): the model is told the reason and asked again"
        )[:256],
    )


def _end(builder: CommitBuilder, record: ApprovalRecord, why: str = "") -> Commit:
    """The run ends as a rejection always ended it (``ApprovalRejected``)."""
    return builder.commit(
        RunEvent.ATTEMPT_FAILED,
        outcome=Outcome(reason=REJECTED, message=f"{record.decided_by} rejected {record.request_id}{why}"),
    )


__all__ = ["after_rejection", "rejection_count", "rejection_result", "verified_reason"]
