"""Resume validation: after any wait, or on meeting a new deployment, check what must still hold
before the run acts again (facts may have changed while it was not running)."""

from __future__ import annotations

from collections.abc import Mapping

from durable_agents.api.v1alpha1 import Outcome, UnavailableResponse
from durable_agents.core.checkpoint import KubernetesEvidenceRef
from durable_agents.core.engine.approvals import decided_approval_of_step, revalidate_approval
from durable_agents.core.engine.cancellation import cancellation_of_step, skip_step
from durable_agents.core.engine.children import child_failure, failed_child_of_step
from durable_agents.core.engine.commits import CommitBuilder
from durable_agents.core.engine.decisions import Decision
from durable_agents.core.engine.retries import attempt_failed, failed_call_of_step
from durable_agents.core.engine.runtime import unavailable_runtime
from durable_agents.core.engine.snapshot import RunSnapshot, Settings
from durable_agents.core.engine.waits import recorded_wait
from durable_agents.core.planner import Planner
from durable_agents.core.statemachine import RunEvent


def resume_validation(
    builder: CommitBuilder,
    run: RunSnapshot,
    planner: Planner,
    settings: Settings,
    fresh_evidence: Mapping[str, KubernetesEvidenceRef | None] | None,
) -> Decision:
    """Leaving a wait, or meeting a new deployment: check what must still hold before acting."""
    cp = builder.cp
    canceled = cancellation_of_step(cp)
    if canceled is not None:
        return builder.commit(
            RunEvent.REVALIDATED,
            checkpoint=skip_step(cp),
            detail=f"step {cp.position.step} abandoned: {canceled.scope} cancellation {canceled.request_id}",
        )
    rewait = recorded_wait(builder)
    if rewait is not None:
        return rewait
    unavailable = unavailable_runtime(cp, settings)
    if unavailable:
        policy = settings.policy
        if policy is None or policy.runtime.on_unavailable is UnavailableResponse.FAIL:
            return builder.commit(
                RunEvent.ATTEMPT_FAILED,
                outcome=Outcome(
                    reason="RuntimeConfigUnavailable",
                    message=f"the run's {unavailable} is no longer available (policy {settings.policy_name})",
                ),
            )
    failed = failed_call_of_step(cp)
    if failed is not None:
        return attempt_failed(
            builder,
            settings,
            "ActionFailed",
            f"{failed.tool}: {failed.error or 'failed'}",
            f"step {cp.position.step}",
        )
    child = failed_child_of_step(cp)
    if child is not None:
        outcome = child_failure(run.namespace, child)
        return builder.commit(RunEvent.ATTEMPT_FAILED, outcome=outcome, detail=outcome.message)
    decided = decided_approval_of_step(cp)
    if decided is not None:
        return revalidate_approval(builder, run, planner, settings, decided, fresh_evidence)
    # Material facts: the deadline (checked before), the runtime configuration and the checkpoint.
    note = f"; {unavailable} unavailable, continuing per policy" if unavailable else ""
    return builder.commit(RunEvent.REVALIDATED, detail=f"checkpoint valid, deadline not passed{note}")
