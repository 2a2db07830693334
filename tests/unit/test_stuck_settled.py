"""The stuck check judges a parked run once, not on every pass (issue 38: with thousands of runs
parked, a pass re-derived every verdict every 10 s). Counted in verdicts derived, never in time:
a run is judged again when it changes, when an action of it is found with an unknown outcome, or
when the policies change; a run whose verdict depends on time passing is judged on every pass."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_agents.api.v1alpha1 import AgentRunSpec, AgentRunStatus
from durable_agents.core import stuck as core
from durable_agents.core.regions import DEFAULT_REGION
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.runs.stuck import StuckCheck

NS = "team-a"
NOW = datetime.now(UTC)


def run(name: str, version: str, *, expiry: bool = True, **status: Any) -> dict[str, Any]:
    checkpoint = {"pendingInput": {"expiresAt": (NOW + timedelta(hours=72)).isoformat()}} if expiry else {}
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": version},
        "spec": {"taskType": "t", "objective": "o"},
        "status": {
            "state": "waiting_input",
            "stateVersion": 3,
            "stateSince": (NOW - timedelta(minutes=5)).isoformat(),
            "checkpoint": checkpoint,
            **status,
        },
    }


def quarantined(name: str) -> dict[str, Any]:
    """A quarantined run whose Stuck condition already says so (nothing to write)."""
    body = run(name, "1", state="quarantined", outcome={"reason": "Tampered", "message": "bad stamp"})
    spec = AgentRunSpec.model_validate(body["spec"])
    verdict = core.stuck(NS, name, spec, AgentRunStatus.model_validate(body["status"]), core.Facts(now=NOW))
    assert verdict is not None
    condition = {"type": "Stuck", "status": "True", "reason": verdict.reason, "message": verdict.message}
    body["status"]["conditions"] = [{**condition, "lastTransitionTime": NOW.isoformat()}]
    return body


def check() -> tuple[StuckCheck, PolicyCache]:
    policies = PolicyCache(None)  # type: ignore[arg-type]
    made = StuckCheck(
        None,  # type: ignore[arg-type]  # nothing here reaches the API
        holds=lambda key: True,
        region=DEFAULT_REGION,
        keyring=None,
        policies=policies,
        events=None,  # type: ignore[arg-type]
    )
    return made, policies


def judged(stuck: StuckCheck) -> tuple[int, dict[str, int]]:
    before = stuck.judged
    counts = asyncio.run(stuck.check_once())
    return stuck.judged - before, counts


def test_a_parked_run_with_its_own_expiry_is_judged_once_until_it_changes() -> None:
    stuck, policies = check()
    for i in range(30):
        stuck.observe_run("ADDED", run(f"r{i}", "1"))
    stuck.observe_run("ADDED", quarantined("q"))
    assert judged(stuck)[0] == 31, "the first pass judges every run"
    derived, counts = judged(stuck)
    assert derived == 0, "nothing changed: no verdict derived again"
    assert counts[core.QUARANTINED] == 1, "a run judged for good still counts in the gauge"
    stuck.observe_run("MODIFIED", run("r3", "2"))
    assert judged(stuck)[0] == 1, "only the run that changed is judged again"
    policies.observe("ADDED", {"metadata": {"namespace": NS, "name": "p"}, "spec": {"version": "1"}})
    assert judged(stuck)[0] == 31, "a policy came or went: every run is judged again"
    assert judged(stuck)[0] == 0


def test_a_verdict_that_time_or_an_unknown_outcome_can_change_is_derived_on_every_pass() -> None:
    stuck, _ = check()
    stuck.observe_run("ADDED", run("no-expiry", "1", expiry=False))  # stuck once it waited a day
    stuck.observe_run("ADDED", run("with-expiry", "1"))
    assert judged(stuck)[0] == 2
    assert judged(stuck)[0] == 1, "a wait without expiry is judged again: time alone may make it stuck"
    action = {
        "metadata": {"namespace": NS, "name": "with-expiry-pay"},
        "spec": {"runRef": {"name": "with-expiry"}, "idempotencyKey": "k"},
        "status": {"state": "outcome_unknown", "reason": "timeout"},
    }
    stuck.observe_action("ADDED", action)
    assert stuck.unknown, "the action's outcome is unknown"
    assert judged(stuck)[0] == 2, "an action of it has an unknown outcome: judged again"
    assert judged(stuck)[0] == 2, "and on every pass while it is unknown (it may stay unanswered)"


def test_a_pass_over_many_runs_gives_the_event_loop_turns() -> None:
    """A pass is synchronous between awaits that need the API: over 100,000 runs it would hold the
    event loop (and every Lease renewal) for its whole length without the turns it gives."""
    stuck, _ = check()
    for i in range(1_200):
        stuck.observe_run("ADDED", run(f"r{i}", "1"))

    async def pass_beside_another_task() -> int:
        turns = 0

        async def other() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        beside = asyncio.create_task(other())
        await asyncio.sleep(0)
        before = turns
        await stuck.check_once()
        during = turns - before
        beside.cancel()
        return during

    assert asyncio.run(pass_beside_another_task()) >= 2, "the other task never ran during the pass"
