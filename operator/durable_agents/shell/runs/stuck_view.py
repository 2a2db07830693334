"""What the stuck check keeps of a run (:mod:`.stuck`): a slim copy of it, and that copy parsed."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import AgentRunSpec, AgentRunStatus

# What the check keeps of a run's checkpoint: where its wait's own expiry is recorded.
_CHECKPOINT_KEEP = {"pendingInput": ("expiresAt",), "pendingExternal": ("expiresAt",), "retry": ("retryAt",)}
_SPEC_KEEP = ("taskType", "objective", "policyRef", "deadline", "region", "createdBy", "parentRef")


def slim(body: dict[str, Any]) -> dict[str, Any]:
    """The part of a run the check judges from (a run's checkpoint and history can be large)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = {k: v for k, v in (body.get("status") or {}).items() if k not in ("checkpoint", "history")}
    checkpoint = (body.get("status") or {}).get("checkpoint")
    if isinstance(checkpoint, dict):
        status["checkpoint"] = {
            part: {k: checkpoint[part][k] for k in keys if k in checkpoint[part]}
            for part, keys in _CHECKPOINT_KEEP.items()
            if isinstance(checkpoint.get(part), dict)
        }
    return {
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion", "generation")},
        "spec": {k: spec[k] for k in _SPEC_KEEP if k in spec},
        "status": status,
    }


def parsed(body: dict[str, Any]) -> tuple[AgentRunSpec, AgentRunStatus] | None:
    try:
        return AgentRunSpec.model_validate(body.get("spec") or {}), AgentRunStatus.model_validate(
            body.get("status") or {}
        )
    except ValidationError:
        return None  # an unreadable run is the worker's to quarantine, not this check's to judge
