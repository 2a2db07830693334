"""What the stuck check keeps of a run (:mod:`.stuck`): a slim copy of it, packed, and that copy
parsed when it is judged.

With every run of the cluster watched (100,000 parked runs on one replica, issue 38), the copy is
one compact JSON value per run, not a tree of small dicts: a parked run costs its bytes, decoded
only when it is judged (once per change, a parked run with an expiry is not judged again). What a
pass reads of every run on every pass, its resourceVersion and the region that owns it, is kept
beside it, not decoded.
"""

from __future__ import annotations

import sys
from typing import Any

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import AgentRunSpec, AgentRunStatus
from durable_agents.core.regions import owning_region_of
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground import fast_json

# What the check keeps of a run's checkpoint: where its wait's own expiry is recorded.
_CHECKPOINT_KEEP = {"pendingInput": ("expiresAt",), "pendingExternal": ("expiresAt",), "retry": ("retryAt",)}
_SPEC_KEEP = ("taskType", "objective", "policyRef", "deadline", "region", "createdBy", "parentRef")
STUCK = "Stuck"  # the only condition a verdict reads (core.stuck.stuck_condition)


def slim(body: dict[str, Any]) -> dict[str, Any]:
    """The part of a run the check judges from (a run's checkpoint and history can be large; of
    its conditions, the check reads its own alone)."""
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
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        status["conditions"] = [c for c in conditions if isinstance(c, dict) and c.get("type") == STUCK]
    return {
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion", "generation")},
        "spec": {k: spec[k] for k in _SPEC_KEEP if k in spec},
        "status": status,
    }


class Kept:
    """One run as the check keeps it: its slim copy packed, and what every pass reads unpacked."""

    __slots__ = ("packed", "region", "uid", "version")

    def __init__(self, body: dict[str, Any], keyring: Keyring | None) -> None:
        meta = body.get("metadata") or {}
        self.version: str | None = meta.get("resourceVersion")
        self.uid: str | None = meta.get("uid")
        self.region = sys.intern(owning_region_of(body, keyring))  # the keyring never changes
        self.packed = fast_json.packed(slim(body))

    def body(self) -> dict[str, Any]:
        """The slim copy, decoded anew (the caller may keep or change it)."""
        decoded: dict[str, Any] = fast_json.loads(self.packed)
        return decoded


def parsed(body: dict[str, Any]) -> tuple[AgentRunSpec, AgentRunStatus] | None:
    try:
        return AgentRunSpec.model_validate(body.get("spec") or {}), AgentRunStatus.model_validate(
            body.get("status") or {}
        )
    except ValidationError:
        return None  # an unreadable run is the worker's to quarantine, not this check's to judge
