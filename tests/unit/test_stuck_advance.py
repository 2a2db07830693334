"""Stuck detection's new causes, pure: an eligible run its owner does not advance (NotAdvancing),
and the runs nobody alive owns (OwnerNotRenewing, NoRegionOwner), each with the fix it names."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import AgentRunSpec, AgentRunStatus
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core import stuck as core
from durable_agents.core import stuck_unowned as unowned

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NS, RUN = "team-a", "pay-1"
MINUTE = timedelta(minutes=1)


def judge(state: str, since: datetime | None, **facts: Any) -> core.Stuck | None:
    spec = AgentRunSpec.model_validate({"taskType": "t", "objective": "o"})
    status = AgentRunStatus.model_validate({"state": state, "stateVersion": 7})
    return core.stuck(NS, RUN, spec, status, core.Facts(now=NOW, unchanged_since=since, **facts))


@pytest.mark.parametrize("state", [s.value for s in core.ELIGIBLE_STATES])
def test_an_eligible_run_unadvanced_past_its_bound_is_not_advancing(state: str) -> None:
    assert judge(state, NOW - 9 * MINUTE) is None, "within the default bound (10 min)"
    verdict = judge(state, NOW - 10 * MINUTE)
    assert verdict is not None
    assert verdict.reason == core.NOT_ADVANCING
    assert f"it has been {state} at stateVersion 7 for longer than its bound (600s)" in verdict.message
    assert f"kubectl agentrun cancel {RUN} -n {NS}" in verdict.message
    assert "restart that replica" in verdict.message
    # The words do not change with the age: the condition is written once.
    assert judge(state, NOW - 60 * MINUTE) == verdict


def test_each_state_has_its_own_bound_and_unknown_progress_is_never_stuck() -> None:
    bounds = {**core.DEFAULT_BOUNDS, RunState.PENDING: timedelta(seconds=3)}
    assert judge("pending", NOW - timedelta(seconds=3), bounds=bounds) is not None
    assert judge("ready", NOW - timedelta(seconds=3), bounds=bounds) is None
    assert judge("pending", None, bounds=bounds) is None, "progress not seen: never stuck on a guess"


@pytest.mark.parametrize("state", ["waiting_input", "waiting_approval", "waiting_external", "quarantined"])
def test_a_waiting_run_is_not_judged_by_the_advance_bound(state: str) -> None:
    verdict = judge(state, NOW - timedelta(days=3), threshold=timedelta(days=30))
    assert verdict is None or verdict.reason != core.NOT_ADVANCING


def lease(holder: str, renewed: datetime | None) -> unowned.LeaseSeen:
    return unowned.LeaseSeen("durable-agents-shard-east-3", holder, renewed, timedelta(seconds=15))


def unowned_judge(
    members: int, shard: unowned.LeaseSeen | None, since: datetime | None = NOW - 11 * MINUTE
) -> core.Stuck | None:
    region = unowned.RegionSeen("east", members, shard)
    facts = unowned.UnownedFacts(now=NOW, lease_namespace="ops", region=region, unchanged_since=since)
    return unowned.stuck_unowned(NS, RUN, facts)


def test_a_shard_held_by_a_replica_that_stopped_renewing_names_that_replica() -> None:
    stale = lease("op-east-7f9c", NOW - timedelta(seconds=31))  # expired 16 s ago: over one duration
    verdict = unowned_judge(0, stale)
    assert verdict is not None
    assert verdict.reason == unowned.OWNER_NOT_RENEWING
    assert "held by 'op-east-7f9c', which stopped renewing its Leases" in verdict.message
    assert "kubectl delete pod -n ops op-east-7f9c" in verdict.message
    assert "more than one replica of region 'east'" in verdict.message
    assert unowned_judge(1, stale) == verdict, "live members that did not take it: still stuck"


def test_a_shard_still_valid_or_just_expired_or_released_is_not_owner_not_renewing() -> None:
    assert unowned_judge(1, lease("op", NOW - timedelta(seconds=5))) is None, "valid: a live owner"
    assert unowned_judge(1, lease("op", NOW - timedelta(seconds=20))) is None, "a survivor has a duration"
    just = lease("op", NOW - timedelta(seconds=20))
    verdict = unowned_judge(0, just)
    assert verdict is not None, "just expired, and no member left to take it over"
    assert verdict.reason == unowned.OWNER_NOT_RENEWING
    assert unowned_judge(0, lease("op", NOW - timedelta(seconds=5))) is None, "held, renewed: not unowned"
    assert unowned_judge(1, lease("", NOW - timedelta(hours=1))) is None, "released: a member takes it"


def test_a_region_without_a_live_member_has_no_owner() -> None:
    for shard in (None, lease("", NOW - timedelta(hours=1))):
        verdict = unowned_judge(0, shard)
        assert verdict is not None
        assert verdict.reason == unowned.NO_REGION_OWNER
        assert "no operator serves its region 'east'" in verdict.message
        assert "--set region=east" in verdict.message
        assert "RegionFailover" in verdict.message


def test_a_run_that_advanced_lately_is_not_called_unowned() -> None:
    assert unowned_judge(0, None, since=NOW - 9 * MINUTE) is None, "within the unowned bound"
    assert unowned_judge(0, None, since=None) is None


def test_an_outcome_unknown_past_its_bound_with_a_queryable_system_is_action_unanswered() -> None:
    late = core.UnknownAction("pay-1-pay-0", "QueryTimeout", NOW - 10 * MINUTE)
    verdict = judge("waiting_external", None, unknown_actions=(late,), threshold=timedelta(days=30))
    assert verdict is not None
    assert verdict.reason == core.ACTION_UNANSWERED
    assert "has not answered the operator's queries by key for longer than 600s" in verdict.message
    assert f"kubectl agentrun reconcile {RUN} -n {NS} --action pay-1-pay-0 --applied|--not-applied" in (
        verdict.message
    )
    recent = core.UnknownAction("pay-1-pay-0", "QueryTimeout", NOW - 9 * MINUTE)
    assert judge("waiting_external", None, unknown_actions=(recent,), threshold=timedelta(days=30)) is None


def test_a_waiting_child_whose_parent_is_gone_names_the_cancel() -> None:
    spec = AgentRunSpec.model_validate(
        {"taskType": "t", "objective": "o", "parentRef": {"name": "pay-0", "uid": "u-1"}}
    )
    waiting = AgentRunStatus.model_validate({"state": "waiting_input", "waitingFor": "input:ask"})
    facts = core.Facts(now=NOW, parent_present=False)
    verdict = core.stuck(NS, RUN, spec, waiting, facts)
    assert verdict is not None
    assert verdict.reason == core.PARENT_GONE
    assert "its parent run 'pay-0' (uid u-1), which is gone" in verdict.message
    assert f"kubectl agentrun cancel {RUN} -n {NS}" in verdict.message
    assert core.stuck(NS, RUN, spec, waiting, core.Facts(now=NOW, parent_present=True)) is None
    ready = AgentRunStatus.model_validate({"state": "ready"})
    assert core.stuck(NS, RUN, spec, ready, facts) is None, "a child at work finishes by itself"
