"""The notifier's pass looks only at the runs that could be due something new (issue 38: with
thousands of parked runs, a pass over every run on each watch event was most of the idle
operator's CPU). Counted in runs looked at, never in time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.unit.builders import KEYRING

from durable_agents.core.regions import DEFAULT_REGION
from durable_agents.shell.ground.kube import ObjectKey
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.observability.notifications import Notifier

NS = "team-a"
NOW = datetime.now(UTC)


def parked(name: str, version: str, policy: str | None = None) -> dict[str, Any]:
    """A run waiting for input with its own expiry (due an ``inputRequested`` notice)."""
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": version},
        "spec": {"taskType": "t", "objective": "o", **({"policyRef": {"name": policy}} if policy else {})},
        "status": {
            "state": "waiting_input",
            "stateSince": NOW.isoformat(),
            "runId": f"uid-{name}",
            "checkpoint": {
                "pendingInput": {
                    "requestId": f"{name}-ask",
                    "question": "go on?",
                    "expiresAt": (NOW + timedelta(hours=72)).isoformat(),
                }
            },
        },
    }


def notifying_policy(name: str, version: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "resourceVersion": str(version)},
        "spec": {
            "version": str(version),
            "notifications": [{"name": "hook", "url": "https://hooks.example/in", "events": ["runEnded"]}],
        },
    }


def notifier(holds: set[ObjectKey]) -> tuple[Notifier, PolicyCache]:
    policies = PolicyCache(None)  # type: ignore[arg-type]
    made = Notifier(
        None,  # type: ignore[arg-type]  # nothing here reaches the API
        policies,
        holds=lambda key: key in holds,
        region=DEFAULT_REGION,
        keyring=KEYRING,
        events=None,  # type: ignore[arg-type]
    )
    return made, policies


def looked(check: Notifier) -> int:
    before = check.looked
    asyncio.run(check.pass_once())
    return check.looked - before


def test_a_pass_with_nothing_changed_looks_at_no_run() -> None:
    check, _ = notifier(holds=set())
    for i in range(50):
        check.observe("ADDED", parked(f"r{i}", "1"))
    assert looked(check) == 50, "the first pass looks at each run once"
    assert looked(check) == 0, "nothing changed: an ungoverned parked run costs no look"
    check.observe("MODIFIED", parked("r7", "2"))  # a watch event (e.g. a finalizer added)
    assert looked(check) == 1, "only the run that changed is looked at again"
    assert looked(check) == 0


def test_a_policy_change_looks_at_every_run_again_and_a_shard_not_held_stays_due() -> None:
    """A new policy may govern runs that had none; a run governed by a notifying policy on a shard
    this replica does not hold is looked at on each pass (the shard may come to this replica)."""
    check, policies = notifier(holds=set())
    for i in range(20):
        check.observe("ADDED", parked(f"r{i}", "1", policy="notify"))
    assert looked(check) == 20
    assert looked(check) == 0, "no policy named notify is known: none governs them"
    policies.observe("ADDED", notifying_policy("notify"))
    assert looked(check) == 20, "the policies changed: every run is looked at again"
    assert check.due == {(NS, f"r{i}") for i in range(20)}, "not held here: still due"
    assert looked(check) == 20
