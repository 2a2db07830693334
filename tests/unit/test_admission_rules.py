"""The admission webhook's rules that need no API server: what it stamps, which rewrites of
requests it refuses, and which verb each new request needs (SubjectAccessReviews: e2e)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import AgentRunSpec, Identity
from durable_agents.core.authority import (
    cancellation_unproven,
    decision_unproven,
    retry_unproven,
    service_account_unproven,
)
from durable_agents.core.request_stamps import rewritten, run_id_of, stamps, verbs_needed
from durable_agents.core.sealing import Keyring

pytestmark = pytest.mark.unit

KEYS = Keyring(keys={"k1": bytes(range(32))}, active_key_id="k1")
BOB = Identity(username="bob", groups=["editors", "system:authenticated"])
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
DIGEST = "sha256:" + "c" * 64
FORGED_STAMP = "k1:" + "A" * 43 + "="


def run(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "r", "namespace": "team-a", "uid": "uid-1"},
        "spec": {"taskType": "t", "objective": "o", **spec},
        "status": {"runId": "run-id-1"},
    }


def merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """What kopf makes of the webhook's patch of ``spec``: a merge (None removes a key)."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def admitted(new: dict[str, Any], old: dict[str, Any] | None, operation: str = "UPDATE") -> AgentRunSpec:
    spec = merged(new["spec"], stamps(operation, new, old, BOB, NOW, KEYS))
    return AgentRunSpec.model_validate(spec)


def test_on_create_the_creator_is_stamped_for_the_service_account() -> None:
    new = run(
        serviceAccountName="deployer", createdBy={"username": "mallory", "uid": "x", "stamp": FORGED_STAMP}
    )
    spec = admitted(new, None, "CREATE")
    assert spec.created_by is not None
    assert (spec.created_by.username, spec.created_by.uid) == ("bob", None), (
        "nothing of the client's survives"
    )
    assert spec.created_by.stamped_at == NOW, "stamped with the time of the request that creates it"
    assert service_account_unproven(KEYS, "team-a", "r", spec, NOW) is None
    assert service_account_unproven(KEYS, "team-a", "other", spec, NOW) is not None


def test_a_new_decision_is_stamped_as_the_user_and_an_old_one_left_alone() -> None:
    old = run(
        approvals={"pay-1": {"digest": DIGEST, "decision": "reject", "approver": {"username": "carol"}}}
    )
    new = copy.deepcopy(old)
    new["spec"]["approvals"]["pay-2"] = {
        "digest": DIGEST,
        "decision": "approve",
        "approver": {"username": "mallory", "uid": "forged"},
        "stamp": FORGED_STAMP,
    }
    spec = admitted(new, old)
    decided = spec.approvals["pay-2"]
    assert decided.approver == BOB
    assert decided.decided_at == NOW
    assert decision_unproven(KEYS, "run-id-1", "pay-2", decided) is None, "bound to status.runId"
    assert decision_unproven(KEYS, "uid-1", "pay-2", decided) is not None
    assert spec.approvals["pay-1"].approver == Identity(username="carol")
    assert spec.approvals["pay-1"].stamp is None


def test_a_new_cancellation_is_stamped() -> None:
    old = run()
    new = run(cancellations={"c1": {"scope": "turn", "requestedBy": {"username": "mallory"}}})
    request = admitted(new, old).cancellations["c1"]
    assert request.requested_by == BOB
    assert cancellation_unproven(KEYS, "run-id-1", "c1", request) is None


def test_a_new_retry_token_is_stamped_and_an_unchanged_one_keeps_its_request() -> None:
    old = run()
    new = run(retryQuarantine="t1", retryQuarantineRequest={"requestedBy": {"username": "mallory"}})
    spec = admitted(new, old)
    assert spec.retry_quarantine_request is not None
    assert spec.retry_quarantine_request.requested_by == BOB
    assert retry_unproven(KEYS, "run-id-1", "t1", spec.retry_quarantine_request) is None

    stored = run(**{**new["spec"], **spec.wire()})
    stored["spec"]["retryQuarantineRequest"] = spec.retry_quarantine_request.wire()
    tampered = copy.deepcopy(stored)
    tampered["spec"]["retryQuarantineRequest"] = {
        "requestedBy": {"username": "mallory"},
        "stamp": FORGED_STAMP,
    }
    assert admitted(tampered, stored).retry_quarantine_request == spec.retry_quarantine_request


def test_what_the_schema_will_refuse_is_not_stamped() -> None:
    new = run(approvals={"pay-1": "approve please"}, cancellations={"c1": {"scope": "everything"}})
    assert stamps("UPDATE", new, run(), BOB, NOW, KEYS) == {}


def test_the_run_id_is_the_recorded_one_else_the_uid() -> None:
    assert run_id_of(run()) == "run-id-1"
    assert run_id_of({"metadata": {"uid": "uid-1"}}) == "uid-1"


GIVEN = run(
    answers={"confirm": "yes"},
    events={"window": "open"},
    approvals={"pay-1": {"digest": DIGEST, "decision": "approve", "approver": {"username": "carol"}}},
    cancellations={"c1": {"scope": "turn"}},
    retryQuarantine="t1",
    retryQuarantineRequest={"requestedBy": {"username": "bob"}, "stamp": FORGED_STAMP},
)


def without(field: str, key: str) -> dict[str, Any]:
    """A merge patch with null, a JSON patch remove, an apply that leaves it out: all the same."""
    new = copy.deepcopy(GIVEN)
    del new["spec"][field][key]
    return new


def changed(field: str, key: str, value: Any) -> dict[str, Any]:
    new = copy.deepcopy(GIVEN)
    new["spec"][field][key] = value
    return new


@pytest.mark.parametrize(
    ("new", "message"),
    [
        (without("answers", "confirm"), "spec.answers['confirm'] cannot be withdrawn"),
        (without("events", "window"), "spec.events['window'] cannot be withdrawn"),
        (without("approvals", "pay-1"), "spec.approvals['pay-1'] cannot be withdrawn"),
        (without("cancellations", "c1"), "spec.cancellations['c1'] cannot be withdrawn"),
        (changed("answers", "confirm", "no"), "spec.answers['confirm'] cannot be changed"),
        (
            changed(
                "approvals", "pay-1", {"digest": DIGEST, "decision": "approve", "approver": {"username": "x"}}
            ),
            "spec.approvals['pay-1'] cannot be changed",
        ),
        (changed("cancellations", "c1", {"scope": "task"}), "spec.cancellations['c1'] cannot be changed"),
        ({**GIVEN, "spec": {k: v for k, v in GIVEN["spec"].items() if k != "answers"}}, "answers['confirm']"),
        (
            {**GIVEN, "spec": {k: v for k, v in GIVEN["spec"].items() if k != "retryQuarantine"}},
            "spec.retryQuarantine cannot be withdrawn",
        ),
        (changed("retryQuarantineRequest", "stamp", "k1:AAAA"), "spec.retryQuarantineRequest is written by"),
    ],
    ids=[
        "answer-removed",
        "event-removed",
        "decision-removed",
        "cancellation-removed",
        "answer-replaced",
        "decision-replaced",
        "cancellation-replaced",
        "all-answers-removed",
        "retry-removed",
        "retry-request-rewritten",
    ],
)
def test_requests_are_append_only_whatever_the_patch(new: dict[str, Any], message: str) -> None:
    refused = rewritten(new, GIVEN)
    assert refused is not None
    assert message in refused


def test_adding_requests_and_a_new_retry_token_is_no_rewrite() -> None:
    new = copy.deepcopy(GIVEN)
    new["spec"]["answers"]["second"] = "also yes"
    new["spec"]["cancellations"]["c2"] = {"scope": "task"}
    new["spec"]["retryQuarantine"] = "t2"
    new["spec"]["retryQuarantineRequest"] = {"requestedBy": {"username": "bob"}}
    assert rewritten(new, GIVEN) is None
    assert rewritten(GIVEN, None) is None


def test_each_new_request_needs_its_verb() -> None:
    new = copy.deepcopy(GIVEN)
    new["spec"]["answers"]["second"] = "x"
    new["spec"]["events"]["deploy"] = "done"
    new["spec"]["cancellations"]["c2"] = {"scope": "task"}
    new["spec"]["approvals"]["pay-2"] = {"digest": DIGEST, "decision": "approve"}
    new["spec"]["retryQuarantine"] = "t2"
    assert verbs_needed(new, GIVEN) == {
        "answer": ["spec.answers['second']", "spec.events['deploy']"],
        "cancel": ["spec.cancellations['c2']"],
        "retry": ["spec.retryQuarantine 't2'"],
    }
    assert verbs_needed(GIVEN, GIVEN) == {}
