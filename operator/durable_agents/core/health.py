"""Health as GitOps tools read it: the kstatus conditions (``sigs.k8s.io/cli-utils/pkg/kstatus``,
what Flux and kpt decide health by; Argo CD's health checks in ``charts/durable-agents/health/``
read the same conditions).

kstatus reads ``Reconciling`` True as InProgress, ``Stalled`` True as Failed, then ``Ready``
True as Current; ``status.observedGeneration`` behind ``metadata.generation`` is InProgress. So
a run that still works or waits says ``Reconciling``; one that completed says ``Ready``; one that
failed, expired, was canceled or is quarantined says ``Stalled``, each with the reason. Pure.
"""

from __future__ import annotations

from durable_agents.api.v1alpha1 import ConditionStatus, Outcome
from durable_agents.api.v1alpha1.states import RunState

RECONCILING = "Reconciling"
READY = "Ready"
STALLED = "Stalled"
HEALTH_CONDITIONS = (RECONCILING, READY, STALLED)

# Ended without doing what it was made for, or stopped until a person acts: kstatus Failed.
STALLED_STATES = frozenset({RunState.FAILED, RunState.EXPIRED, RunState.CANCELED, RunState.QUARANTINED})
# What a run that cannot start yet waits for (status.waitingFor) -> the reason it reads as.
WAITING_REASONS = (("agentpolicy:", "PolicyMissing"),)

Wanted = tuple[ConditionStatus, str, str]  # status, reason, message


def camel(state: RunState) -> str:
    return "".join(part.capitalize() for part in state.value.split("_"))


def run_health(state: RunState, outcome: Outcome | None, waiting_for: str | None) -> dict[str, Wanted]:
    """The run's ``Reconciling``, ``Ready`` and ``Stalled`` conditions (status, reason, message)."""
    true, false = ConditionStatus.TRUE, ConditionStatus.FALSE
    name = camel(state)
    message = (outcome.message if outcome else "") or ""
    if state is RunState.COMPLETED:
        return {
            RECONCILING: (false, name, ""),
            READY: (true, name, message),
            STALLED: (false, name, ""),
        }
    if state in STALLED_STATES:
        reason = outcome.reason if outcome is not None and outcome.reason else name
        return {
            RECONCILING: (false, name, ""),
            READY: (false, reason, message),
            STALLED: (true, reason, message or f"the run is {state.value}"),
        }
    reason = name
    for prefix, waiting_reason in WAITING_REASONS:
        if waiting_for and waiting_for.startswith(prefix):
            reason = waiting_reason
    text = f"{state.value}: waiting for {waiting_for}" if waiting_for else state.value
    return {
        RECONCILING: (true, reason, text),
        READY: (false, reason, text),
        STALLED: (false, name, ""),
    }
