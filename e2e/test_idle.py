"""Parked runs cost nothing: no Lease, no periodic API requests; and each expires on time."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.audit import audit_offset, count_by, read_audit
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.governance import PERMISSIVE_DEFAULT
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.runs import Runs

OPERATOR_USER = "durable-agents-operator"
PARKED = 200
EXPIRES_IN = 100  # seconds: long enough for the idle minute, short enough for the suite


LEASE = 15  # seconds: the chart's default


def parked_spec() -> dict[str, Any]:
    return {
        "taskType": "parked",
        "objective": "ask a question nobody answers",
        "steps": [
            {"name": "confirm", "ask": {"question": "anyone there?", "expiresIn": f"{EXPIRES_IN}s"}},
            {"name": "done", "complete": {"result": "answered"}},
        ],
    }


@pytest.mark.local_plane("audit")
def test_parked_runs_cost_no_lease_and_no_requests_and_expire_on_time(
    plane: LocalControlPlane, start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    audit = plane.audit_log_path
    offset = audit_offset(audit)  # what earlier tests logged is not read again
    start_operator("idle", LEASE)
    started = datetime.now(UTC)
    names = [runs.create(parked_spec(), name=f"parked-{i:03d}") for i in range(PARKED)]

    def all_parked() -> bool:
        states = [(r.get("status") or {}).get("state") for r in runs.all()]
        return states.count("waiting_input") == PARKED

    eventually(all_parked, Within.RUN, f"{PARKED} runs to park in waiting_input", interval=0.5)
    parked_at = datetime.now(UTC)
    eventually(lambda: runs.leases() == [], Within.COMMIT, "parked runs to hold no Lease")
    # The namespace's default policy counts the runs it governs (its status, written after a change):
    # once it counts every parked run, nothing changes any more and the idle minute can begin.

    def default_counts_them() -> bool:
        policy = runs.custom.get_namespaced_custom_object(
            GROUP, VERSION, runs.namespace, "agentpolicies", PERMISSIVE_DEFAULT
        )
        counted = ((policy.get("status") or {}).get("runs")) or {}
        return sum(int(n) for n in counted.values()) == PARKED

    eventually(default_counts_them, Within.COMMIT, f"the default policy's status to count the {PARKED} runs")

    # Writes while parking (2 transitions each, accepted and input_requested, in one write).
    parking = read_audit(audit, offset=offset, user=OPERATOR_USER, since=started, until=parked_at)
    writes = count_by([e for e in parking if e.is_write])
    transitions = 2 * PARKED
    status_writes = writes["update agentruns/status"]
    lease_writes = writes["create leases"] + writes["delete leases"]
    print(
        f"\nparking {PARKED} runs: {transitions} transitions, {status_writes} status writes, "
        f"{lease_writes} lease writes, {writes['create events']} events; "
        f"business writes per transition {(status_writes + lease_writes) / transitions:.2f} "
        f"(status only {status_writes / transitions:.2f}); all writes: {dict(writes)}"
    )
    assert status_writes == PARKED, "one status write per run: accepted and the question together"

    # One idle minute: count every request the operator makes.
    window_start = datetime.now(UTC)
    time.sleep(60)  # the measurement window itself, not a wait for a condition
    window_end = datetime.now(UTC)
    idle = read_audit(audit, offset=offset, user=OPERATOR_USER, since=window_start, until=window_end)
    print(f"idle minute with {PARKED} parked runs: {len(idle)} requests {dict(count_by(idle))}")
    # The region's upkeep is the only activity, whatever the number of runs: the replica's liveness
    # (this one leads: the region Lease) renewed every half lease, the Leases listed once a poll;
    # shard Leases are written only when they change hands.
    upkeep = [e for e in idle if e.resource == "leases"]
    on_runs = [e for e in idle if e.resource != "leases"]
    assert [e for e in on_runs if e.is_write] == [], "no periodic writes on parked runs"
    assert len(on_runs) <= 5, "no polling of parked runs"
    upkeep_writes = [e for e in upkeep if e.is_write]
    print(
        f"Lease upkeep in the idle minute at a {LEASE}s Lease: {len(upkeep_writes)} writes"
        f" {dict(count_by(upkeep_writes))}"
    )
    assert [e.name for e in upkeep_writes if e.name.startswith("durable-agents-shard-")] == [], (
        "no shard Lease upkeep"
    )
    assert len(upkeep_writes) <= 10, "quiet upkeep: at most 10 Lease writes a minute by an idle replica"
    assert {(e.verb, e.namespace) for e in upkeep if e.is_write} <= {("patch", runs.namespace)}
    assert runs.leases() == [], "no Lease per run"

    # Nobody answers: each run expires at its expiry, without any worker having waited for it.
    def all_expired() -> list[dict[str, Any]] | None:
        items = runs.all()
        done = [r for r in items if (r.get("status") or {}).get("state") == "expired"]
        return done if len(done) == PARKED else None

    expired = eventually(all_expired, EXPIRES_IN + 60.0, f"{PARKED} runs to expire", interval=1)
    lateness = []
    for run in expired:
        history = run["status"]["history"]
        asked = next(h for h in history if h["event"] == "input_requested")
        expiry = next(h for h in history if h["event"] == "wait_expired")
        due = datetime.fromisoformat(asked["at"]).timestamp() + EXPIRES_IN
        late = datetime.fromisoformat(expiry["at"]).timestamp() - due
        assert late >= 0, f"{run['metadata']['name']} expired {-late:.2f}s early"
        lateness.append(late)
        assert run["status"]["outcome"]["reason"] == "InputExpired"
    print(
        f"expiry lateness over {PARKED} runs: p50 {statistics.median(lateness):.2f}s max {max(lateness):.2f}s"
    )
    assert max(lateness) < 10, "each run expires on time"
    assert sorted(r["metadata"]["name"] for r in expired) == names

    # An expiry costs what any transition costs: one status write, and no Lease left behind.
    eventually(lambda: runs.leases() == [], Within.COMMIT, "the expired runs' Leases to be released")

    def expiry_writes() -> Counter[str] | None:
        expiring = read_audit(audit, offset=offset, user=OPERATOR_USER, since=window_end)
        writes = count_by([e for e in expiring if e.is_write])
        return writes if writes["update agentruns/status"] >= PARKED else None

    writes = eventually(expiry_writes, Within.MOMENT, f"{PARKED} expiries in the audit log")
    print(f"expiring {PARKED} runs: all writes {dict(writes)}")
    assert writes["update agentruns/status"] == PARKED, "exactly one status write per expiry"
