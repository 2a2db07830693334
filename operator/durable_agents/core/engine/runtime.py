"""The deployment a run meets: the operator version and the runtime configuration it recorded."""

from __future__ import annotations

from durable_agents.core.checkpoint import Checkpoint
from durable_agents.core.engine.commits import CommitBuilder
from durable_agents.core.engine.decisions import Commit
from durable_agents.core.engine.snapshot import Settings
from durable_agents.core.statemachine import RunEvent


def deployment_change(builder: CommitBuilder, settings: Settings) -> Commit | None:
    """Resume validation first if the checkpoint was committed by another operator version."""
    recorded = builder.cp.runtime_config.operator
    if settings.operator_version is None or recorded == settings.operator_version:
        return None
    return builder.commit(
        RunEvent.REVALIDATION_REQUIRED,
        detail=f"deployment changed: operator {recorded or 'unrecorded'} -> {settings.operator_version}",
    )


def unavailable_runtime(cp: Checkpoint, settings: Settings) -> str:
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
