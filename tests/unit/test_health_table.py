"""The health table (durable_agents_testkit.health): kstatus itself (sigs.k8s.io/cli-utils, built
by hack/build.sh) and the chart's Argo CD health checks (Lua, run by lupa) read every AgentRun
state, with each of its reasons, and every AgentPolicy condition as the table says.

The objects here are built by the operator's own code (the engine's ``conditions_for``, the
pending run's ``noted_waiting``, the policy status writer's ``policy_status``): what the operator
writes. e2e/test_health.py runs the same judges over objects the operator wrote on a real API
server.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from durable_agents.api.v1alpha1 import Outcome, PolicyRunCounts
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine.commits import conditions_for, noted_waiting
from durable_agents.core.policy_identity import content_digest
from durable_agents.core.policy_status import policy_status
from durable_agents_testkit.health import (
    CURRENT,
    GENERATION_NOT_OBSERVED,
    LUA,
    NO_STATUS,
    POLICY_READY,
    POLICY_STALLED,
    REPO,
    RUN_HEALTH,
    RUN_REASONS,
    ArgoCD,
    Health,
    kstatus,
    kstatus_binary,
)

NOW = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
WAITING_FOR = {
    RunState.WAITING_INPUT: "input:question",
    RunState.WAITING_APPROVAL: "approval:send-mail",
    RunState.WAITING_EXTERNAL: "event:payment",
    RunState.WAITING_RETRY: "retry:send-mail",
    RunState.CANCEL_REQUESTED: "action:send-mail",
}


def run_object(state: RunState, reason: str | None, *, generation: int = 1) -> dict[str, Any]:
    """A run as the operator leaves it in ``state`` (observed at generation 1)."""
    meta = {
        "name": f"run-{state.value}-{reason or 'none'}".lower(),
        "namespace": "ns",
        "generation": generation,
    }
    if state is RunState.PENDING and reason == "PolicyMissing":
        status = noted_waiting({}, "agentpolicy:strict", 1, NOW)  # before any commit (PolicyWait)
    else:
        outcome = Outcome(reason=reason, message=f"the run's {reason}") if reason else None
        waiting_for = WAITING_FOR.get(state)
        conditions = conditions_for(state, [], NOW, 1, outcome, waiting_for)
        status = {
            "state": state.value,
            "observedGeneration": 1,
            "conditions": [c.wire() for c in conditions],
            **({"outcome": outcome.wire()} if outcome else {}),
            **({"waitingFor": waiting_for} if waiting_for else {}),
        }
    return {
        "apiVersion": "durable-agents.io/v1alpha1",
        "kind": "AgentRun",
        "metadata": meta,
        "status": status,
    }


RUN_ROWS = [(state, reason) for state in RunState for reason in RUN_REASONS.get(state, (None,))]

POLICY_SPEC = {"version": "v1", "approvalRequiredTiers": ["consequential"]}


def policy_object(
    spec: dict[str, Any], prior: dict[str, Any] | None = None, generation: int = 1
) -> dict[str, Any]:
    body = {
        "apiVersion": "durable-agents.io/v1alpha1",
        "kind": "AgentPolicy",
        "metadata": {"name": "strict", "namespace": "ns", "generation": generation},
        "spec": spec,
        **({"status": prior} if prior is not None else {}),
    }
    status = policy_status(body, PolicyRunCounts(running=2, waiting_for_approval=1), NOW)
    assert status is not None
    return {**body, "status": status}


POLICY_ROWS: list[tuple[str, dict[str, Any], Health, str]] = [
    ("ready", policy_object(POLICY_SPEC), POLICY_READY, "Valid"),
    (
        "invalid spec",
        policy_object({"version": "v1", "tiers": {"http.post": "harmless"}}),
        POLICY_STALLED,
        "InvalidSpec",
    ),
    (
        "version reused with other content",
        policy_object(
            POLICY_SPEC,
            {"versions": [{"version": "v1", "contentDigest": content_digest({"approvalRequiredTiers": []})}]},
        ),
        POLICY_STALLED,
        "VersionReused",
    ),
]


@pytest.fixture(scope="module")
def binary() -> Path:
    return kstatus_binary()


@pytest.fixture(scope="module")
def argocd() -> ArgoCD:
    return ArgoCD()


def test_the_table_names_every_run_state() -> None:
    assert set(RUN_HEALTH) == set(RunState)


@pytest.mark.parametrize(("state", "reason"), RUN_ROWS, ids=[f"{s.value}-{r}" for s, r in RUN_ROWS])
def test_every_run_state_reads_as_the_table_says(
    state: RunState, reason: str | None, binary: Path, argocd: ArgoCD
) -> None:
    obj = run_object(state, reason)
    expected = RUN_HEALTH[state]
    [judged] = kstatus([obj], binary)
    lua = argocd.health(obj)
    assert (judged.status, lua.status) == (expected.kstatus, expected.argocd), (judged, lua)
    if reason is not None and expected.kstatus != CURRENT:  # the reason reaches both tools
        assert judged.reason == reason, judged
        assert lua.message.startswith(f"{reason}:"), lua


def test_a_run_with_no_status_and_one_not_yet_observed(binary: Path, argocd: ArgoCD) -> None:
    fresh = {
        "apiVersion": "durable-agents.io/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "new", "generation": 1},
    }
    changed = run_object(RunState.COMPLETED, "Completed", generation=2)
    judged = kstatus([fresh, changed], binary)
    assert [j.status for j in judged] == [NO_STATUS.kstatus, GENERATION_NOT_OBSERVED.kstatus]
    assert [argocd.health(o).status for o in (fresh, changed)] == [
        NO_STATUS.argocd,
        GENERATION_NOT_OBSERVED.argocd,
    ]


@pytest.mark.parametrize(("label", "obj", "expected", "reason"), POLICY_ROWS, ids=[r[0] for r in POLICY_ROWS])
def test_every_policy_condition_reads_as_the_table_says(
    label: str, obj: dict[str, Any], expected: Health, reason: str, binary: Path, argocd: ArgoCD
) -> None:
    [judged] = kstatus([obj], binary)
    lua = argocd.health(obj)
    assert (judged.status, lua.status) == (expected.kstatus, expected.argocd), (label, judged, lua)
    conditions = {c["type"]: c for c in obj["status"]["conditions"]}
    assert conditions["Ready"]["reason"] == reason
    if expected is POLICY_STALLED:
        assert judged.reason == reason, judged
        assert lua.message.startswith(f"{reason}:"), lua


def test_a_policy_with_no_status_and_one_not_yet_observed(binary: Path, argocd: ArgoCD) -> None:
    bare = {
        "apiVersion": "durable-agents.io/v1alpha1",
        "kind": "AgentPolicy",
        "metadata": {"name": "p", "generation": 1},
    }
    ready = policy_object(POLICY_SPEC)
    changed = {**ready, "metadata": {**ready["metadata"], "generation": 2}}
    judged = kstatus([bare, changed], binary)
    assert [j.status for j in judged] == [NO_STATUS.kstatus, GENERATION_NOT_OBSERVED.kstatus]
    assert [argocd.health(o).status for o in (bare, changed)] == [
        NO_STATUS.argocd,
        GENERATION_NOT_OBSERVED.argocd,
    ]


def test_the_values_example_and_the_docs_carry_the_same_checks() -> None:
    example = yaml.safe_load((REPO / "charts/durable-agents/examples/argocd-values.yaml").read_text())
    cm = example["configs"]["cm"]
    for kind, path in LUA.items():
        assert cm[f"resource.customizations.health.durable-agents.io_{kind}"] == path.read_text(), kind
    page = (REPO / "docs/operate/health.md").read_text()
    for path in LUA.values():
        assert f'--8<-- "{path.relative_to(REPO)}"' in page, path
