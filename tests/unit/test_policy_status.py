"""An AgentPolicy's status, decided (core/policy_status.py) and counted (the writer's feeds):
Ready or Stalled with the reason, the version history (newest last, at most 32), the runs it
governs, and no write when nothing changed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_agents.api.v1alpha1 import POLICY_VERSIONS_LIMIT, PolicyRunCounts, PolicyVersionRecord
from durable_agents.core.policy_identity import content_digest
from durable_agents.core.policy_status import governing_policy, policy_status, run_bucket, versions_with
from durable_agents.shell.runs.policy_status import PolicyStatusWriter

NOW = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
SPEC = {"version": "v1", "approvalRequiredTiers": ["consequential"]}


def policy(spec: dict[str, Any], status: dict[str, Any] | None = None, generation: int = 1) -> dict[str, Any]:
    meta = {"name": "p", "namespace": "ns", "generation": generation, "resourceVersion": "1"}
    return {"metadata": meta, "spec": spec, **({"status": status} if status is not None else {})}


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_a_valid_policy_is_ready_with_its_identity_and_counts() -> None:
    counts = PolicyRunCounts(running=3, waiting_for_approval=2, stuck=1)
    status = policy_status(policy(SPEC, generation=4), counts, NOW)
    assert status is not None
    assert conditions(status) == {"Ready": ("True", "Valid"), "Stalled": ("False", "Valid")}
    assert status["observedGeneration"] == 4
    assert status["contentDigest"] == content_digest(SPEC)
    assert status["versions"] == [{"version": "v1", "contentDigest": content_digest(SPEC)}]
    assert status["runs"] == {"running": 3, "waitingForApproval": 2, "stuck": 1}


def test_what_it_wrote_is_not_written_again_and_a_change_is() -> None:
    counts = PolicyRunCounts(running=1)
    status = policy_status(policy(SPEC), counts, NOW)
    assert status is not None
    later = NOW + timedelta(minutes=5)
    assert policy_status(policy(SPEC, status), counts, later) is None  # its own write: no loop
    moved = policy_status(policy(SPEC, status), PolicyRunCounts(running=2), later)
    assert moved is not None
    assert moved["runs"]["running"] == 2
    # a condition whose status did not change keeps its transition time
    assert [c["lastTransitionTime"] for c in moved["conditions"]] == [
        c["lastTransitionTime"] for c in status["conditions"]
    ]


def test_an_invalid_spec_is_stalled_naming_the_field() -> None:
    counts = PolicyRunCounts(running=2, waiting_for_approval=1)
    status = policy_status(policy({"version": "v1", "tiers": {"http.post": "harmless"}}), counts, NOW)
    assert status is not None
    assert conditions(status) == {"Ready": ("False", "InvalidSpec"), "Stalled": ("True", "InvalidSpec")}
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert "spec.tiers.http.post" in stalled["message"]
    assert status["versions"] == []  # an unusable spec is no version of the policy
    assert status["runs"] == {"running": 0, "waitingForApproval": 0, "stuck": 3}  # all wait for it


def test_a_version_seen_with_other_content_is_stalled_and_the_history_keeps_the_first() -> None:
    old = {"version": "v1", "contentDigest": content_digest({"approvalRequiredTiers": []})}
    status = policy_status(policy(SPEC, {"versions": [old]}), PolicyRunCounts(), NOW)
    assert status is not None
    assert conditions(status) == {"Ready": ("False", "VersionReused"), "Stalled": ("True", "VersionReused")}
    assert status["versions"] == [old]  # a version names one content: the first (policy_integrity)


def test_the_history_keeps_the_newest_32_and_a_return_moves_to_the_end() -> None:
    history: list[PolicyVersionRecord] = []
    for i in range(40):
        history = versions_with(history, f"v{i}", content_digest({"n": i}))
    assert len(history) == POLICY_VERSIONS_LIMIT
    assert history[0].version == "v8"
    assert history[-1].version == "v39"
    back = versions_with(history, "v20", content_digest({"n": 20}))
    assert back[-1].version == "v20"
    assert len(back) == POLICY_VERSIONS_LIMIT
    assert [h.version for h in back].count("v20") == 1


def stuck(reason: str) -> dict[str, Any]:
    return {"type": "Stuck", "status": "True", "reason": reason, "lastTransitionTime": "2026-12-03T10:00:00Z"}


def test_which_policy_governs_a_run_and_where_it_counts() -> None:
    assert governing_policy("ns", {"policyRef": {"name": "strict"}}) == ("ns", "strict")
    assert governing_policy("ns", {}) is None
    assert run_bucket({"state": "ready"}) == "running"
    assert run_bucket({"state": "waiting_input"}) == "running"
    assert run_bucket({"state": "waiting_approval"}) == "waitingForApproval"
    assert run_bucket({"state": "waiting_approval", "conditions": [stuck("NoApprover")]}) == "stuck"
    assert run_bucket({"state": "waiting_input", "conditions": [stuck("WaitWithoutExpiry")]}) == "running"
    assert run_bucket({"waitingFor": "agentpolicy:strict"}) == "stuck"
    for ended in ("completed", "failed", "canceled", "expired", "quarantined"):
        assert run_bucket({"state": ended}) is None


def run(name: str, policy_name: str | None, status: dict[str, Any]) -> dict[str, Any]:
    spec = {"policyRef": {"name": policy_name}} if policy_name else {}
    return {"metadata": {"namespace": "ns", "name": name}, "spec": spec, "status": status}


def test_the_writer_counts_runs_as_they_move_and_marks_only_their_policies() -> None:
    writer = PolicyStatusWriter(kube=None, synced=asyncio.Event())  # type: ignore[arg-type]
    writer.observe_run(None, run("a", "p", {"state": "ready"}))
    writer.observe_run(None, run("b", "p", {"state": "waiting_approval"}))
    writer.observe_run(None, run("c", None, {"state": "ready"}))  # governed by none
    assert writer.dirty == {("ns", "p")}
    assert dict(writer.counts[("ns", "p")]) == {"running": 1, "waitingForApproval": 1}
    writer.dirty.clear()
    writer.observe_run("MODIFIED", run("a", "p", {"state": "ready", "stateVersion": 3}))  # same bucket
    assert writer.dirty == set()
    writer.observe_run("MODIFIED", run("b", "p", {"state": "completed"}))
    writer.observe_run("DELETED", run("a", "p", {"state": "ready"}))
    assert writer.dirty == {("ns", "p")}
    assert +writer.counts[("ns", "p")] == {}
    assert writer.governed == {}
