"""The on-call controls' rules without a cluster: the webhook's stamps and checks for
``spec.reconcileNow`` and ``spec.escalation``, what a stamp covers, the Escalated condition kept by
commits, and ``kubectl agentrun list``'s filters and columns (the cluster: e2e/test_controls.py)."""

from __future__ import annotations

import argparse
import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import (
    AgentRunSpec,
    AgentRunStatus,
    Condition,
    ConditionStatus,
    EscalationRequest,
    Identity,
)
from durable_agents.core.controls import (
    control_stamps,
    control_unproven,
    escalated_condition,
    pending,
    with_condition,
)
from durable_agents.core.key_use import keys_in_use
from durable_agents.core.sealing import Keyring
from durable_agents.kubectl.list import human_duration, refusal, selected, table
from durable_agents.shell.admission.controls import check_controls
from durable_agents.shell.runs.controls import answer_of

KEYS = Keyring(keys={"k1": bytes(range(32))}, active_key_id="k1")
CAROL = Identity(username="carol", groups=["oncall"])
NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def run(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "pay", "namespace": "ns", "uid": "u-1"},
        "spec": {"taskType": "t", "objective": "o", **spec},
        "status": {"runId": "r-1"},
    }


def stamped(old: dict[str, Any], **spec: Any) -> dict[str, Any]:
    new = run(**{**old["spec"], **spec})
    merged = control_stamps(new, old, CAROL, "2026-12-02T08:00:00.000000Z", KEYS)
    return run(**{**new["spec"], **merged})


def check(new: dict[str, Any], old: dict[str, Any], allowed: set[str], user: Identity = CAROL) -> str | None:
    async def refused_verb(_kube: Any, who: Identity, verb: str, *_: str) -> str | None:
        return None if verb in allowed else f"user {who.username!r} may not {verb}: needs verb {verb!r}"

    return asyncio.run(check_controls(None, new, old, user, KEYS, refused_verb))  # type: ignore[arg-type]


def test_a_new_request_is_stamped_for_who_asked_and_verified_by_the_operator() -> None:
    old = run()
    new = stamped(
        old, escalation={"token": "e1", "reason": "call the bank", "requestedBy": {"username": "eve"}}
    )
    request = AgentRunSpec.model_validate(new["spec"]).escalation
    assert request is not None
    assert request.requested_by == CAROL  # what the client wrote is overwritten
    assert control_unproven(KEYS, "r-1", "escalation", request) is None
    assert check(new, old, {"escalate"}) is None
    # The stamp covers the reason, the run and the field: changed, it no longer verifies.
    assert control_unproven(KEYS, "r-1", "escalation", request.model_copy(update={"reason": "x"})) is not None
    assert control_unproven(KEYS, "r-2", "escalation", request) is not None
    asked = stamped(old, reconcileNow={"token": "e1"})["spec"]["reconcileNow"]
    assert asked["stamp"] != new["spec"]["escalation"]["stamp"]


def test_each_control_needs_its_own_verb_and_is_never_rewritten() -> None:
    old = run()
    ask = stamped(old, reconcileNow={"token": "a1", "action": "act-1"})
    refused = check(ask, old, {"escalate", "patch"})
    assert refused is not None
    assert "needs verb 'reconcile'" in refused
    assert "spec.reconcileNow 'a1'" in refused
    assert check(ask, old, {"reconcile"}) is None
    changed = run(reconcileNow={**ask["spec"]["reconcileNow"], "action": "act-2"})
    assert "cannot be changed once made" in (check(changed, ask, {"reconcile"}) or "")
    assert "cannot be withdrawn" in (check(run(), ask, {"reconcile"}) or "")
    forged = run(
        escalation={"token": "e1", "reason": "r", "requestedBy": {"username": "carol"}, "stamp": "k1:AAAA"}
    )
    assert "is not stamped by the admission webhook" in (check(forged, old, {"escalate"}) or "")


def test_a_request_is_pending_until_its_token_is_acted_on() -> None:
    spec = AgentRunSpec.model_validate(run(escalation={"token": "e1", "reason": "r"})["spec"])
    assert pending(spec, AgentRunStatus(), "escalation") is not None
    done = AgentRunStatus.model_validate({"escalation": {"token": "e1", "escalatedAt": NOW.isoformat()}})
    assert pending(spec, done, "escalation") is None
    assert pending(spec, done, "reconcileNow") is None


def test_the_escalated_condition_keeps_the_others() -> None:
    waiting = Condition(type="Waiting", status=ConditionStatus.TRUE, reason="W", last_transition_time=NOW)
    stuck = Condition(
        type="Stuck", status=ConditionStatus.TRUE, reason="NoApprover", last_transition_time=NOW
    )
    request = EscalationRequest(token="e1", reason="call the bank", requested_by=CAROL)
    first = with_condition([waiting, stuck], escalated_condition(request, NOW, 1))
    assert [c.type for c in first] == ["Waiting", "Stuck", "Escalated"]
    assert first[2].message == "escalated by carol: call the bank"
    again = with_condition(first, escalated_condition(request, NOW + timedelta(hours=1), 1))
    assert [c.type for c in again] == ["Waiting", "Stuck", "Escalated"]
    assert again[2].last_transition_time == NOW  # still True: no new transition


def listed(name: str, state: str, since: datetime, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"region": "eu"},
        "status": {"state": state, "stateSince": since.isoformat(), **status},
    }


def args(**given: Any) -> argparse.Namespace:
    defaults = {
        "state": None,
        "region": None,
        "waiting_longer_than": None,
        "stuck": False,
        "escalated": False,
    }
    return argparse.Namespace(**{**defaults, **given})


def test_list_filters_and_sorts_the_queue_oldest_first() -> None:
    stuck = [{"type": "Stuck", "status": "True", "reason": "NoApprover"}]
    runs = [
        listed("young", "waiting_approval", NOW - timedelta(minutes=2)),
        listed("old", "waiting_approval", NOW - timedelta(hours=3), conditions=stuck),
        listed("done", "completed", NOW - timedelta(days=2)),
    ]
    names = [r["metadata"]["name"] for r in selected(runs, args(), NOW)]
    assert names == ["done", "old", "young"]
    waiting = selected(runs, args(waiting_longer_than=timedelta(minutes=10)), NOW)
    assert [r["metadata"]["name"] for r in waiting] == ["old"]
    assert [r["metadata"]["name"] for r in selected(runs, args(stuck=True), NOW)] == ["old"]
    assert selected(runs, args(escalated=True), NOW) == []
    assert selected(runs, args(region="us"), NOW) == []
    assert [r["metadata"]["name"] for r in selected(runs, args(state=["completed"]), NOW)] == ["done"]
    lines = table(
        selected(runs, args(stuck=True), NOW), all_namespaces=True, wide=False, now=NOW
    ).splitlines()
    assert lines[0].split() == [
        "NAMESPACE",
        "NAME",
        "STATE",
        "WAITING",
        "FOR",
        "AGE",
        "IN",
        "STATE",
        "REGION",
        "STUCK",
    ]
    assert lines[1].split() == ["ns", "old", "waiting_approval", "-", "3h", "eu", "NoApprover"]


def test_ages_print_as_kubectl_prints_them() -> None:
    shown = [
        human_duration(timedelta(seconds=s)) for s in (5, 119, 130, 900, 3 * 3600 + 60, 30 * 3600, 3 * 86400)
    ]
    assert shown == ["5s", "119s", "2m10s", "15m", "3h1m", "30h", "3d"]


def test_a_refused_list_names_the_missing_verb() -> None:
    err = ApiException(status=403, reason="Forbidden")
    err.body = '{"message": "agentruns.durable-agents.io is forbidden: User \\"bob\\" cannot list resource"}'
    said = refusal(err, "list", "agentruns", "x")
    assert said.startswith("error: user 'bob' may not list agentruns in namespace 'x': needs verb 'list'")


def test_what_the_system_said_is_read_from_the_record_before_and_after_asking() -> None:
    unknown = {"status": {"state": "outcome_unknown", "attempts": 1, "reason": "HTTP503"}}
    assert answer_of(unknown, {"status": {"state": "succeeded", "attempts": 1}})[0] == "Applied"
    assert answer_of(unknown, unknown) == ("Unknown", "HTTP503")
    sent_again = {"status": {"state": "succeeded", "attempts": 2}}  # not applied, sent again, applied
    assert answer_of(unknown, sent_again) == (
        "NotApplied",
        "not applied: sent again with the same key (now succeeded)",
    )


def test_a_control_stamp_keeps_its_key_in_use_until_acted_on() -> None:
    spec = {"escalation": {"token": "e1", "reason": "r", "stamp": "old:AAAA"}}
    waiting = {"spec": spec, "status": {"state": "waiting_input"}}
    assert "spec.escalation stamp" in keys_in_use(waiting).get("old", [])
    acted_on = {"spec": spec, "status": {"state": "waiting_input", "escalation": {"token": "e1"}}}
    assert "old" not in keys_in_use(acted_on)
