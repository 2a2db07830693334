"""A run no policy governs (issue 32): read-only work only. Its first action that is not read-only
(consequential, reversible or of unknown tier) ends it PolicyRequired before any intent is
committed; a read-only one is still committed."""

from __future__ import annotations

import pytest
from tests.unit.builders import (
    T0,
    apply,
    at,
    checkpoint_of,
    commit_of,
    conditions,
    drive,
    effect,
    new_run,
    step,
)

from durable_agents.api.v1alpha1 import ActionTier
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import Commit, Settings
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit

UNGOVERNED = Settings(policy_required=True)
READ = {"name": "read", "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": "settings"}}}
DONE = {"name": "done", "complete": {}}


@pytest.mark.parametrize("tier", [None, ActionTier.CONSEQUENTIAL, ActionTier.REVERSIBLE])
def test_an_ungoverned_run_reads_then_ends_policy_required_at_its_first_action(
    tier: ActionTier | None,
) -> None:
    settings = UNGOVERNED if tier is None else Settings(policy_required=True, tiers={"http.post": tier})
    _, commits, idle = drive(new_run(steps=[READ, effect("pay"), DONE]), T0, settings=settings)
    assert [c.event for c in commits] == [RunEvent.ACCEPTED, RunEvent.STEP_COMPLETED, RunEvent.ATTEMPT_FAILED]
    failed = commits[-1]
    assert failed.state is RunState.FAILED
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "PolicyRequired"
    assert "spec.policyRef" in failed.status.outcome.message
    assert conditions(failed.status)["Succeeded"].reason == "PolicyRequired"
    assert not failed.intents, "nothing is sent"
    cp = checkpoint_of(failed)
    assert [call.tool for call in cp.tool_calls] == ["kubernetes.read"]
    assert cp.pending_actions == []
    assert cp.policy is None
    assert idle.wake_at is None


def _second_commit(settings: Settings) -> Commit:
    obj = new_run(steps=[effect("look"), DONE])
    obj = apply(obj, commit_of(step(obj, T0, settings=settings)))
    return commit_of(step(obj, at(1), settings=settings))


def test_a_read_only_action_of_an_ungoverned_run_is_still_committed() -> None:
    commit = _second_commit(Settings(policy_required=True, tiers={"http.post": ActionTier.READ_ONLY}))
    assert commit.event is RunEvent.EXTERNAL_AWAITED
    assert len(commit.intents) == 1


def test_without_policy_required_pure_callers_keep_the_old_behaviour() -> None:
    commit = _second_commit(Settings())
    assert commit.event is RunEvent.EXTERNAL_AWAITED
    assert len(commit.intents) == 1
    refused = _second_commit(UNGOVERNED).status.outcome
    assert refused is not None
    assert refused.reason == "PolicyRequired"
