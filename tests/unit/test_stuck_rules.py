"""Stuck detection's pure core: each cause, what it says would unstick the run, and clearing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from tests.unit.builders import T0, drive, expect, new_run, patch_spec, wait_for_event

from durable_agents.api.v1alpha1 import AgentRunSpec, AgentRunStatus, Condition, ConditionStatus
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core import stuck as core
from durable_agents.core.engine.commits import CARRIED_CONDITIONS
from durable_agents.core.regions import DEFAULT_REGION
from durable_agents.core.statemachine import RunEvent
from durable_agents.shell.effects.mcp import NO_QUERY
from durable_agents.shell.ground.kube import ObjectKey
from durable_agents.shell.runs.stuck import StuckCheck
from durable_agents.shell.runs.stuck_view import parsed, slim

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NS, RUN = "team-a", "pay-1"


def spec(**extra: Any) -> AgentRunSpec:
    return AgentRunSpec.model_validate({"taskType": "pay", "objective": "pay", **extra})


def status(state: str, **extra: Any) -> AgentRunStatus:
    return AgentRunStatus.model_validate({"state": state, "stateVersion": 3, **extra})


def approval(expires: datetime = NOW + timedelta(hours=72)) -> dict[str, Any]:
    return {
        "requestId": "pay-1-apr",
        "digest": "sha256:" + "0" * 64,
        "step": "pay",
        "effect": "http.post",
        "tier": "consequential",
        "policyReason": "consequential needs approval",
        "approverRole": "approve on agentruns",
        "expiresAt": expires.isoformat(),
        "allowedDecisions": ["approve", "reject"],
    }


def judge(s: AgentRunSpec, st: AgentRunStatus, **facts: Any) -> core.Stuck | None:
    return core.stuck(NS, RUN, s, st, core.Facts(now=NOW, **facts))


def test_quarantined_says_how_to_retry() -> None:
    st = status("quarantined", outcome={"reason": "InternalError", "message": "boom"})
    verdict = judge(spec(), st)
    assert verdict is not None
    assert verdict.reason == core.QUARANTINED
    assert "InternalError: boom" in verdict.message
    assert f"kubectl agentrun retry {RUN} -n {NS}" in verdict.message


def test_policy_missing_names_the_policy_to_create() -> None:
    s = spec(policyRef={"name": "payments"})
    verdict = judge(s, status("waiting_approval", approvalRequest=approval()), policy_present=False)
    assert verdict is not None
    assert verdict.reason == core.POLICY_MISSING
    assert "AgentPolicy 'payments'" in verdict.message
    assert f"kubectl apply -n {NS}" in verdict.message
    assert judge(s, status("waiting_approval", approvalRequest=approval()), policy_present=True) is None
    assert core.needs_policy(s, status("pending"))
    assert not core.needs_policy(s, status("completed"))


def test_no_approver_says_which_verb_to_grant() -> None:
    st = status("waiting_approval", approvalRequest=approval())
    rule = core.ApproverRule("sign-off", "agentruns")
    verdict = judge(spec(), st, approver=rule, approver_held=False)
    assert verdict is not None
    assert verdict.reason == core.NO_APPROVER
    assert "--verb=sign-off --resource=agentruns.durable-agents.io" in verdict.message
    assert f"kubectl create rolebinding agentrun-approvers -n {NS}" in verdict.message
    assert judge(spec(), st, approver=rule, approver_held=True) is None
    assert judge(spec(), st, approver_held=None) is None, "unknown (RBAC unreadable): never a guess"
    assert not core.needs_approver(status("waiting_input"))


def test_unreconcilable_outcome_names_the_reconcile_command() -> None:
    st = status("waiting_external", waitingFor="action:act-1")
    unknown = [core.UnknownAction("act-1", NO_QUERY)]
    verdict = judge(spec(), st, unknown_actions=unknown)
    assert verdict is not None
    assert verdict.reason == core.UNRECONCILABLE_OUTCOME
    assert (
        f"kubectl agentrun reconcile {RUN} -n {NS} --action act-1 --applied|--not-applied" in verdict.message
    )
    # An unknown outcome that can still be asked (a timeout, the system away) is not stuck.
    assert judge(spec(), st, unknown_actions=[core.UnknownAction("act-1", "Timeout")]) is None
    assert NO_QUERY in core.NO_QUERY_REASONS


def test_wait_without_expiry_past_the_threshold() -> None:
    since = NOW - timedelta(hours=25)
    st = status("waiting_external", waitingFor="child:pay-1-sub", stateSince=since.isoformat())
    verdict = judge(spec(), st)
    assert verdict is not None
    assert verdict.reason == core.WAIT_WITHOUT_EXPIRY
    assert f"kubectl agentrun why pay-1-sub -n {NS}" in verdict.message
    assert f"kubectl agentrun cancel {RUN} -n {NS}" in verdict.message
    assert judge(spec(), st, threshold=timedelta(hours=26)) is None, "not yet past the threshold"
    deadline = (NOW + timedelta(days=1)).isoformat()
    assert judge(spec(deadline=deadline), st) is None, "the deadline ends the wait"
    # The message does not change from pass to pass (the condition is written once).
    later = core.stuck(NS, RUN, spec(), st, core.Facts(now=NOW + timedelta(hours=1)))
    assert later == verdict


def test_a_wait_with_its_own_expiry_is_never_stuck_by_age() -> None:
    since = (NOW - timedelta(days=3)).isoformat()
    expiry = {"expiresAt": (NOW + timedelta(hours=1)).isoformat()}
    for state, checkpoint in (
        ("waiting_input", {"pendingInput": expiry}),
        ("waiting_external", {"pendingExternal": expiry}),
        ("waiting_retry", {"retry": {"retryAt": expiry["expiresAt"]}}),
    ):
        st = status(state, stateSince=since, checkpoint={"schemaVersion": 3, **checkpoint})
        assert judge(spec(), st) is None, state
    st = status("waiting_approval", stateSince=since, approvalRequest=approval())
    assert judge(spec(), st, approver_held=True) is None


@pytest.mark.parametrize("state", ["completed", "failed", "canceled", "expired"])
def test_an_ended_run_is_not_stuck(state: str) -> None:
    assert judge(spec(policyRef={"name": "gone"}), status(state), policy_present=False) is None


def condition(state: ConditionStatus, reason: str, message: str = "m") -> Condition:
    return Condition(type=core.STUCK, status=state, reason=reason, message=message, last_transition_time=NOW)


def test_condition_set_once_then_cleared() -> None:
    verdict = core.Stuck(core.QUARANTINED, "retry it")
    later = NOW + timedelta(minutes=1)
    first = core.conditions_with([], verdict, NOW, 1)
    assert first is not None
    assert core.is_stuck(first)
    stuck = core.stuck_condition(first)
    assert stuck is not None
    assert (stuck.reason, stuck.message) == (core.QUARANTINED, "retry it")
    assert core.conditions_with(first, verdict, later, 1) is None, "unchanged: no write"
    moved = core.conditions_with(first, core.Stuck(core.NO_APPROVER, "grant"), later, 1)
    assert moved is not None
    reasoned = core.stuck_condition(moved)
    assert reasoned is not None
    assert (reasoned.reason, reasoned.last_transition_time) == (core.NO_APPROVER, NOW), "still stuck since"
    cleared = core.conditions_with(first, None, later, 1)
    assert cleared is not None
    assert not core.is_stuck(cleared)
    gone = core.stuck_condition(cleared)
    assert gone is not None
    assert gone.status is ConditionStatus.FALSE
    assert gone.reason == core.NOT_STUCK
    assert core.conditions_with(cleared, None, later, 1) is None, "already False: no write"
    assert core.conditions_with([], None, NOW, 1) is None, "never stuck: no condition at all"


def test_other_conditions_are_kept() -> None:
    waiting = Condition(
        type="Waiting", status=ConditionStatus.TRUE, reason="WaitingInput", last_transition_time=NOW
    )
    out = core.conditions_with([waiting], core.Stuck(core.QUARANTINED, "x"), NOW, 1)
    assert out is not None
    assert [c.type for c in out] == ["Waiting", core.STUCK]


def test_commits_carry_the_stuck_condition() -> None:
    assert core.STUCK in CARRIED_CONDITIONS, "a transition keeps what the stuck check wrote"


# --- who holds the approver verb -----------------------------------------------------------------

GROUP = "durable-agents.io"


def role(name: str, verbs: list[str], *, kind_ns: str | None = NS, **rule: Any) -> dict[str, Any]:
    base = {"apiGroups": [GROUP], "resources": ["agentruns"], "verbs": verbs, **rule}
    return {"metadata": {"name": name, "namespace": kind_ns}, "rules": [base]}


def binding(
    name: str, kind: str, role_name: str, subjects: bool = True, ns: str | None = NS
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": core.RBAC_GROUP, "kind": kind, "name": role_name},
        "subjects": [{"kind": "User", "name": "alice"}] if subjects else [],
    }


def held(**lists: Any) -> bool:
    given: dict[str, Any] = {
        "roles": [],
        "cluster_roles": [],
        "role_bindings": [],
        "cluster_role_bindings": [],
    }
    return core.approver_held(core.ApproverRule(), NS, RUN, group=GROUP, **{**given, **lists})


def test_a_bound_role_granting_the_verb_is_an_approver() -> None:
    assert held(roles=[role("approver", ["approve"])], role_bindings=[binding("b", "Role", "approver")])
    cluster = role("approver", ["get", "approve"], kind_ns=None)
    assert held(cluster_roles=[cluster], role_bindings=[binding("b", "ClusterRole", "approver")])
    crb = binding("b", "ClusterRole", "approver", ns=None)
    assert held(cluster_roles=[cluster], cluster_role_bindings=[crb])
    named = role("approver", ["approve"], resourceNames=[RUN])
    assert held(roles=[named], role_bindings=[binding("b", "Role", "approver")])


def test_no_approver_without_a_bound_grant_of_the_named_verb() -> None:
    assert not held()
    assert not held(roles=[role("approver", ["approve"])]), "a Role bound to nobody"
    bound_to_nobody = binding("b", "Role", "approver", subjects=False)
    assert not held(roles=[role("approver", ["approve"])], role_bindings=[bound_to_nobody])
    assert not held(roles=[role("editor", ["get", "patch"])], role_bindings=[binding("b", "Role", "editor")])
    other_ns = role("approver", ["approve"], kind_ns="team-b")
    assert not held(roles=[other_ns], role_bindings=[binding("b", "Role", "approver", ns="team-b")])
    admin = {
        "metadata": {"name": "cluster-admin"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
    }
    crb = binding("admins", "ClusterRole", "cluster-admin", ns=None)
    assert not held(cluster_roles=[admin], cluster_role_bindings=[crb]), (
        "a superuser is not a designated approver"
    )
    other_run = role("approver", ["approve"], resourceNames=["another-run"])
    assert not held(roles=[other_run], role_bindings=[binding("b", "Role", "approver")])


def test_a_transition_keeps_the_stuck_condition_the_check_wrote() -> None:
    """The check alone sets and clears it: a commit in between must not erase it (or the check
    would find the run newly stuck, and post another Event, on its next pass)."""
    steps = [wait_for_event("go"), {"name": "done", "complete": {"result": "ok"}}]
    obj, _, _ = drive(new_run(steps=steps), T0)
    assert obj["status"]["state"] == "waiting_external"
    mark = condition(ConditionStatus.TRUE, core.WAIT_WITHOUT_EXPIRY).wire()
    obj["status"]["conditions"].append(mark)
    obj = patch_spec(obj, events={"window-open": "now"})
    _, commit = expect(obj, T0, RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION)
    assert mark in commit.wire_status()["conditions"]


def test_the_checks_slim_copy_judges_as_the_whole_run() -> None:
    """The check keeps a slim copy of each run (no checkpoint body, no history): it must keep
    what the verdict reads (the wait's expiry) and drop the rest (a sealed question)."""
    since = (NOW - timedelta(days=3)).isoformat()
    checkpoint = {
        "schemaVersion": 3,
        "pendingInput": {"requestId": "ask", "question": "sealed" * 100, "expiresAt": NOW.isoformat()},
        "evidence": [{"id": "x"}],
    }
    body: dict[str, Any] = {
        "metadata": {"name": RUN, "namespace": NS, "uid": "u", "resourceVersion": "7"},
        "spec": {"taskType": "t", "objective": "o", "steps": [{"name": "ask", "ask": {"question": "q"}}]},
        "status": {"state": "waiting_input", "stateSince": since, "history": [], "checkpoint": checkpoint},
    }
    kept = slim(body)
    assert kept["status"]["checkpoint"] == {"pendingInput": {"expiresAt": NOW.isoformat()}}
    assert "history" not in kept["status"]
    assert "steps" not in kept["spec"]
    whole, thin = parsed(body), parsed(kept)
    assert whole is not None
    assert thin is not None
    assert judge(*whole) is None
    assert judge(*thin) is None, "its expiry is kept: not a wait without expiry"
    del body["status"]["checkpoint"]["pendingInput"]
    thin = parsed(slim(body))
    assert thin is not None
    verdict = judge(*thin)
    assert verdict is not None
    assert verdict.reason == core.WAIT_WITHOUT_EXPIRY


def test_a_pass_judges_each_run_as_last_delivered_even_if_it_changed_during_the_pass() -> None:
    """The watch delivers while a pass awaits (an API read for another run): the run changed
    meanwhile is judged as it is now, never from a copy taken when the pass began (which, kept,
    would hide its new state until its next change, maybe never)."""

    def body(name: str, state: str, version: str) -> dict[str, Any]:
        meta = {"name": name, "namespace": NS, "uid": name, "resourceVersion": version}
        return {"metadata": meta, "spec": {"taskType": "t", "objective": "o"}, "status": {"state": state}}

    check = StuckCheck(
        None,  # type: ignore[arg-type]
        holds=lambda key: True,
        region=DEFAULT_REGION,
        keyring=None,
        policies=SimpleNamespace(get=lambda key: None, policies={}),  # type: ignore[arg-type]
        events=None,  # type: ignore[arg-type]
    )
    check.observe_run(None, body("a", "waiting_input", "1"))
    check.observe_run(None, body("b", "ready", "1"))
    updated: list[ObjectKey] = []

    async def facts(key: ObjectKey, *_: Any) -> core.Facts:
        if key[1] == "a":  # while the pass awaits for run a, run b is quarantined
            check.observe_run("MODIFIED", body("b", "quarantined", "2"))
        return core.Facts(now=NOW)

    async def update(key: ObjectKey, now: datetime) -> None:
        updated.append(key)

    check.facts = facts  # type: ignore[method-assign,assignment]
    check._update = update  # type: ignore[method-assign]
    counts = asyncio.run(check.check_once())
    assert counts[core.QUARANTINED] == 1
    assert updated == [(NS, "b")]
