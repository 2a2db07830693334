"""Retention rules (durable_agents.core.retention): what is due, what blocks a deletion, what a
run being deleted needs next, and the compact record (never a sealed value)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from durable_agents.api.crdgen import KINDS
from durable_agents.api.v1alpha1 import AgentPolicySpec, AgentRunRecord, CancelRequest, Retention
from durable_agents.core.authority import cancellation_unproven
from durable_agents.core.retention import (
    DELETION_REQUEST_ID,
    FINALIZER,
    Next,
    blockers,
    build_record,
    deletion_cancellation,
    due_at,
    label_value,
    next_step,
    owned_by,
    record_name,
    records_of,
    retention_of,
    ttl_of,
)
from durable_agents.core.sealing import Keyring

KEYS = Keyring(keys={"k1": bytes(range(32))}, active_key_id="k1")
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SEALED = "sealed:v1:QUJDREVGR0g="


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def run(state: str = "completed", *, since: datetime = T0, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "r1", "namespace": "ns", "uid": "uid-1234567890", **meta},
        "spec": {
            "taskType": "pay",
            "objective": "pay",
            "policyRef": {"name": "ops"},
            "steps": [{"name": "pay", "effect": {"effect": "http.post", "arguments": {"x": SEALED}}}],
            "answers": {"confirm": SEALED},
            "createdBy": {"username": "alice"},
        },
        "status": {"state": state, "stateSince": iso(since), "runId": "uid-1234567890"},
    }


def action(state: str, *, step: int = 0, run_name: str = "r1", uid: str = "uid-1234567890") -> dict[str, Any]:
    return {
        "metadata": {"name": f"act-{step}-{state}"},
        "spec": {
            "idempotencyKey": f"{uid}/{step}/pay/0",
            "runRef": {"name": run_name, "uid": uid},
            "stepIndex": step,
            "effect": "http.post",
            "tier": "reversible",
            "arguments": {"amount": SEALED},
        },
        "status": {"state": state, "attempts": 1, "finishedAt": iso(T0), "outcome": {"body": SEALED}},
    }


def policy(**retention: Any) -> dict[str, Any]:
    return {"spec": {"version": "v1", "retention": retention}}


# --- what is due ---------------------------------------------------------------------------------


def test_a_finished_run_is_due_ttl_after_its_terminal_state() -> None:
    ttl = ttl_of(retention_of(policy(ttlAfterFinished="1h30m")))
    assert ttl == timedelta(minutes=90)
    assert due_at(run("completed"), ttl) == T0 + timedelta(minutes=90)
    assert due_at(run("canceled"), ttl) == T0 + timedelta(minutes=90)


def test_no_ttl_keeps_runs_forever_and_records_by_default() -> None:
    for unset in (None, {"spec": {"version": "v1"}}, policy()):
        retention = retention_of(unset)
        assert ttl_of(retention) is None
        assert retention.keep_record is True
        assert due_at(run("completed"), ttl_of(retention)) is None


def test_a_run_not_finished_or_a_child_is_never_due_by_itself() -> None:
    ttl = timedelta(seconds=1)
    for state in ("waiting_input", "waiting_external", "cancel_requested", "quarantined", "pending"):
        assert due_at(run(state), ttl) is None
    child = run("completed")
    child["spec"]["parentRef"] = {"name": "parent", "uid": "p"}
    assert due_at(child, ttl) is None


def test_the_ttl_is_bounded_to_a_year() -> None:
    assert ttl_of(Retention(ttl_after_finished="8760h")) == timedelta(days=365)
    assert ttl_of(Retention(ttl_after_finished="8761h")) is None  # the API refuses it (CEL)
    with pytest.raises(ValidationError):
        Retention.model_validate({"ttlAfterFinished": "one day"})
    schema = next(k for k in KINDS if k.kind == "AgentPolicy").crd()
    spec = schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    ttl = spec["properties"]["retention"]["properties"]["ttlAfterFinished"]
    assert ttl["x-kubernetes-validations"][0]["rule"] == "duration(self) <= duration('8760h')"
    assert AgentPolicySpec(version="v1").retention == Retention()


# --- what blocks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["intent", "dispatching", "outcome_unknown"])
def test_an_unsettled_action_blocks_the_deletion(state: str) -> None:
    assert blockers([action("succeeded"), action(state, step=1)], []) == [f"action act-1-{state} is {state}"]


def test_settled_actions_and_finished_children_do_not_block() -> None:
    records = [action(s, step=i) for i, s in enumerate(("succeeded", "failed", "canceled"))]
    assert blockers(records, [run("completed"), run("failed")]) == []


def test_a_running_child_blocks_the_deletion() -> None:
    child = run("waiting_input", name="r1-sub")
    assert blockers([], [child]) == ["child r1-sub is waiting_input"]


def test_records_and_children_of_a_run_are_matched_by_name_and_identity() -> None:
    mine, other_uid, other_run = (
        action("succeeded"),
        action("failed", uid="old"),
        action("failed", run_name="r2"),
    )
    assert records_of(run(), [mine, other_uid, other_run]) == [mine]
    parent = run()
    child = run(name="r1-sub", ownerReferences=[{"uid": "uid-1234567890"}])
    stranger = run(name="r1-x", ownerReferences=[{"uid": "someone-else"}])
    assert owned_by(child, parent)
    assert not owned_by(stranger, parent)


# --- a run being deleted ---------------------------------------------------------------------------


def test_every_parked_run_gets_the_finalizer_and_a_deleted_one_without_it_is_left_alone() -> None:
    for parked in ("waiting_input", "waiting_approval", "waiting_external", "waiting_retry", "quarantined"):
        assert next_step(run(parked), []) is Next.ADD_FINALIZER
    assert next_step(run("completed"), []) is Next.ADD_FINALIZER
    # Not while a worker commits (its write would be refused for the finalizer's and retried).
    for busy in ("pending", "ready", "resume_validation", "cancel_requested"):
        assert next_step(run(busy), []) is Next.NOTHING
    assert next_step(run("completed", finalizers=[FINALIZER]), []) is Next.NOTHING
    assert next_step(run("waiting_input", deletionTimestamp=iso(T0)), []) is Next.NOTHING


def test_a_deleted_live_run_is_canceled_first_then_waits_until_settled() -> None:
    deleted = run("waiting_input", finalizers=[FINALIZER], deletionTimestamp=iso(T0))
    assert next_step(deleted, []) is Next.CANCEL
    deleted["spec"]["cancellations"] = {DELETION_REQUEST_ID: {"scope": "task"}}
    assert next_step(deleted, []) is Next.WAIT
    deleted["status"]["state"] = "canceled"
    assert next_step(deleted, ["action act-0 is outcome_unknown"]) is Next.WAIT
    assert next_step(deleted, []) is Next.FINALIZE


def test_a_deleted_run_that_never_started_or_is_quarantined_is_finalized_once_settled() -> None:
    for state in ("pending", "quarantined"):
        deleted = run(state, finalizers=[FINALIZER], deletionTimestamp=iso(T0))
        assert next_step(deleted, []) is Next.FINALIZE
        assert next_step(deleted, ["action x is dispatching"]) is Next.WAIT


def test_the_deletion_cancellation_is_stamped_so_the_engine_acts_on_it() -> None:
    live = run("waiting_input")
    entry = deletion_cancellation(live, KEYS, "durable-agents-operator", T0)
    assert entry["scope"] == "task"
    assert entry["requestedBy"] == {"username": "durable-agents-operator"}
    request = CancelRequest.model_validate(entry)
    assert cancellation_unproven(KEYS, "uid-1234567890", DELETION_REQUEST_ID, request) is None
    assert cancellation_unproven(KEYS, "another-run", DELETION_REQUEST_ID, request) is not None


# --- the compact record ----------------------------------------------------------------------------


def finished_run() -> dict[str, Any]:
    out = run("canceled", finalizers=[FINALIZER], creationTimestamp=iso(T0 - timedelta(hours=1)))
    out["status"].update(
        outcome={"reason": "Canceled", "message": "1 effect(s) happened and were not undone"},
        history=[
            {"stateVersion": 1, "event": "accepted", "from": "pending", "to": "ready", "at": iso(T0)},
            {
                "stateVersion": 2,
                "event": "cancel_finished",
                "from": "cancel_requested",
                "to": "canceled",
                "at": iso(T0),
            },
        ],
        cancellation={
            "requestId": "deleted",
            "scope": "task",
            "unreversedEffects": [
                {"step": "pay", "effect": "http.post", "actionRecord": "act-0", "state": "succeeded"}
            ],
        },
        checkpoint={
            "schemaVersion": 3,
            "policy": {"name": "ops", "version": "v7"},
            "evidence": [
                {
                    "id": "ev-1",
                    "source": "kubernetes",
                    "stepIndex": 0,
                    "contentDigest": "sha256:" + "a" * 64,
                    "name": "settings",
                    "kind": "ConfigMap",
                },
            ],
            "approvals": [
                {
                    "requestId": "pay",
                    "digest": "sha256:" + "b" * 64,
                    "stepIndex": 0,
                    "policyVersion": "v7",
                    "decision": "approve",
                    "decidedBy": "bob",
                    "decidedAt": iso(T0),
                },
            ],
            "pendingInput": {"requestId": "confirm", "question": SEALED, "expiresAt": iso(T0)},
            "children": [{"name": "r1-sub", "stepIndex": 1, "outcome": "completed"}],
        },
    )
    out["spec"]["approvals"] = {
        "pay": {
            "digest": "sha256:" + "b" * 64,
            "decision": "approve",
            "approver": {"username": "bob@example.com"},
        }
    }
    return out


def test_the_record_keeps_outcome_history_digests_and_the_ledger() -> None:
    body = build_record(
        finished_run(), [action("succeeded"), action("failed", step=1)], why="deleted", now=T0
    )
    record = AgentRunRecord.model_validate(body)
    spec = record.spec
    assert body["metadata"] == {
        "name": "r1-uid-1234",
        "namespace": "ns",
        "labels": {"durable-agents.io/run": "r1"},
    }
    assert spec.run.name == "r1"
    assert spec.run.run_id == "uid-1234567890"
    assert spec.run.task_type == "pay"
    assert spec.run.policy == "ops"
    assert spec.run.policy_version == "v7"
    assert spec.run.created_by == "alice"
    assert spec.state == "canceled"
    assert spec.outcome is not None
    assert spec.outcome.reason == "Canceled"
    assert spec.finished_at == T0
    assert spec.why == "deleted"
    assert [h.event for h in spec.history] == ["accepted", "cancel_finished"]
    assert spec.cancellation is not None
    assert [(e.step, e.state) for e in spec.cancellation.unreversed_effects] == [("pay", "succeeded")]
    assert [(e.id, e.content_digest) for e in spec.evidence] == [("ev-1", "sha256:" + "a" * 64)]
    assert [(a.request_id, a.decision, a.approver) for a in spec.approvals] == [
        ("pay", "approve", "bob@example.com")
    ]
    assert [(e.idempotency_key, e.state, e.finished_at) for e in spec.ledger] == [
        ("uid-1234567890/0/pay/0", "succeeded", T0),
        ("uid-1234567890/1/pay/0", "failed", T0),
    ]
    assert [(c.name, c.outcome) for c in spec.children] == [("r1-sub", "completed")]


def test_the_record_holds_no_sealed_value_argument_or_response() -> None:
    body = build_record(finished_run(), [action("succeeded")], why="retention", now=T0)
    text = json.dumps(body)
    assert "sealed:" not in text
    assert "arguments" not in text
    assert 'outcome": {"body' not in text
    assert "question" not in text


def test_the_record_is_bounded_and_says_when_it_cut() -> None:
    records = [action("succeeded", step=i) for i in range(300)]
    for i, record in enumerate(records):
        record["spec"]["idempotencyKey"] = f"k-{i:04d}"
    body = build_record(finished_run(), records, why="retention", now=T0)
    assert len(body["spec"]["ledger"]) == 256
    assert body["spec"]["truncated"] is True


def test_a_run_recreated_under_the_same_name_gets_its_own_record() -> None:
    first, second = run(), run(uid="ffffffff-0000")
    assert record_name(first) != record_name(second)
    long = run(name="x" * 253)
    assert len(record_name(long)) <= 253


def test_selectors_use_the_label_values_the_run_s_objects_carry() -> None:
    from durable_agents.core.engine.children import label_value as labelled_as

    for name in ("r1", "x" * 63, "a-" * 40, "run." + "y" * 200):
        assert label_value(name) == labelled_as(name)
        assert len(label_value(name)) <= 63
