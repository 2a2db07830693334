"""The health table: what kstatus (``sigs.k8s.io/cli-utils``, as Flux and kpt read health) and the
chart's Argo CD health checks (Lua) must say of every AgentRun state and AgentPolicy condition,
and the two judges, run over real objects (tests/unit/test_health_table.py,
e2e/test_health.py).

kstatus is ours over the pinned library (hack/kstatus, built by hack/build.sh); the Lua runs in
Lua 5.1 (``lupa.lua51``), the language of Argo CD's gopher-lua, with the object as the global
``obj``, as Argo CD runs it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_agents.api.v1alpha1.states import RunState

REPO = Path(__file__).resolve().parents[2]
ARGOCD_DIR = REPO / "charts" / "durable-agents" / "files" / "argocd"
LUA = {"AgentRun": ARGOCD_DIR / "agentrun.lua", "AgentPolicy": ARGOCD_DIR / "agentpolicy.lua"}

CURRENT, IN_PROGRESS, FAILED = "Current", "InProgress", "Failed"
HEALTHY, PROGRESSING, SUSPENDED, DEGRADED = "Healthy", "Progressing", "Suspended", "Degraded"


@dataclass(frozen=True)
class Health:
    kstatus: str
    argocd: str


# Every run state (api/v1alpha1/states.py) -> the health both tools must read.
RUN_HEALTH: dict[RunState, Health] = {
    RunState.PENDING: Health(IN_PROGRESS, PROGRESSING),
    RunState.READY: Health(IN_PROGRESS, PROGRESSING),
    RunState.WAITING_INPUT: Health(IN_PROGRESS, SUSPENDED),
    RunState.WAITING_APPROVAL: Health(IN_PROGRESS, SUSPENDED),
    RunState.WAITING_EXTERNAL: Health(IN_PROGRESS, SUSPENDED),
    RunState.WAITING_RETRY: Health(IN_PROGRESS, PROGRESSING),
    RunState.RESUME_VALIDATION: Health(IN_PROGRESS, PROGRESSING),
    RunState.CANCEL_REQUESTED: Health(IN_PROGRESS, PROGRESSING),
    RunState.QUARANTINED: Health(FAILED, DEGRADED),
    RunState.COMPLETED: Health(CURRENT, HEALTHY),
    RunState.FAILED: Health(FAILED, DEGRADED),
    RunState.CANCELED: Health(FAILED, DEGRADED),
    RunState.EXPIRED: Health(FAILED, DEGRADED),
}
# The reasons a run in each state carries (outcome reasons; the wait's reason), each a row.
RUN_REASONS: dict[RunState, tuple[str | None, ...]] = {
    RunState.PENDING: (None, "PolicyMissing"),
    RunState.QUARANTINED: ("IntegrityFailed", "Undecryptable", "ServiceAccountNotAuthorized"),
    RunState.COMPLETED: ("Completed",),
    RunState.FAILED: ("RetriesExhausted", "Forbidden", "ApprovalRejected", "PlannerError", "ChildRunFailed"),
    RunState.CANCELED: ("Canceled",),
    RunState.EXPIRED: ("InputExpired", "ExternalEventExpired", "ApprovalExpired", "DeadlineExceeded"),
}
# Neither a state nor a condition the operator wrote: what each judge makes of it.
NO_STATUS = Health(CURRENT, PROGRESSING)  # kstatus's own rule: no conditions, no observedGeneration
GENERATION_NOT_OBSERVED = Health(IN_PROGRESS, PROGRESSING)

# AgentPolicy: its conditions -> health.
POLICY_READY = Health(CURRENT, HEALTHY)
POLICY_STALLED = Health(FAILED, DEGRADED)
POLICY_STALLED_REASONS = ("InvalidSpec", "VersionReused")


@dataclass(frozen=True)
class Judged:
    status: str
    message: str
    reason: str = ""


def kstatus_binary() -> Path:
    from durable_agents_testkit.localcluster.controlplane import ensure_binaries

    return ensure_binaries(controller_manager=False, extra=["kstatus"]) / "kstatus"


def kstatus(objects: Sequence[Mapping[str, Any]], binary: Path | None = None) -> list[Judged]:
    """kstatus.Compute over each object, in order."""
    answer = subprocess.run(
        [str(binary or kstatus_binary())],
        input=json.dumps(list(objects)),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if answer.returncode != 0:
        raise AssertionError(f"kstatus failed ({answer.returncode}): {answer.stderr}")
    out = []
    for obj, result in zip(objects, json.loads(answer.stdout), strict=True):
        if result.get("error"):
            raise AssertionError(f"kstatus could not read {obj.get('metadata')}: {result['error']}")
        out.append(Judged(result["status"], result.get("message", ""), result.get("reason", "")))
    return out


class ArgoCD:
    """The chart's Argo CD health checks, run as Argo CD runs them (Lua 5.1, ``obj`` global)."""

    def __init__(self) -> None:
        from lupa.lua51 import LuaRuntime  # type: ignore[import-untyped]  # lupa ships no type hints

        self.lua = LuaRuntime(unpack_returned_tuples=True)
        self.checks = {kind: path.read_text() for kind, path in LUA.items()}

    def health(self, obj: Mapping[str, Any]) -> Judged:
        script = self.checks[str(obj["kind"])]
        self.lua.globals().obj = self._table(json.loads(json.dumps(obj)))
        hs = self.lua.execute(script)
        return Judged(str(hs["status"]), str(hs["message"] or ""))

    def _table(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return self.lua.table_from({k: self._table(v) for k, v in value.items()})
        if isinstance(value, list):
            return self.lua.table_from([self._table(v) for v in value])
        return value
