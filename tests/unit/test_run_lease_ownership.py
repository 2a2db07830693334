"""Run Leases: which Lease is the operator's to take over or delete, and how a run says it is not."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.shell.ownership.leases import LEASE_CONFLICT, LeaseRecord, conflict_status, lease_name

pytestmark = pytest.mark.unit

RUN, RUN_UID = "pay-1", "run-uid-1"
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def lease(**meta: Any) -> dict[str, Any]:
    """A Lease as the API server returns it (the shape the Lease watch hands the worker)."""
    return {
        "metadata": {
            "name": lease_name(RUN),
            "namespace": "team-a",
            "uid": "lease-uid-1",
            "resourceVersion": "5",
            "labels": {RUN_LABEL: RUN},
            "ownerReferences": [
                {"apiVersion": "durable-agents.io/v1alpha1", "kind": "AgentRun", "name": RUN, "uid": RUN_UID}
            ],
            **meta,
        },
        "spec": {
            "holderIdentity": "gone-worker",
            "leaseDurationSeconds": 2,
            "renewTime": "2029-01-01T00:00:00Z",
        },
    }


def test_a_lease_the_operator_made_for_the_run_is_its_own() -> None:
    record = LeaseRecord.from_dict(lease())
    assert record.foreign_because(RUN, RUN_UID) is None
    assert (record.uid, record.run_label, record.owner_uids) == ("lease-uid-1", RUN, (RUN_UID,))
    assert record.expired(T0), "expired, so the old code would have taken it over or reaped it"


@pytest.mark.parametrize(
    ("meta", "because"),
    [
        ({"ownerReferences": None}, "it has no owner reference to the run"),
        (
            {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "other-uid"}]},
            "its owner is another object (uid other-uid)",
        ),
        ({"labels": None}, f"its label {RUN_LABEL} does not name the run"),
        ({"labels": {RUN_LABEL: "another-run"}}, f"its label {RUN_LABEL} does not name the run"),
        ({"name": "agentrun-somewhere-else"}, f"it is not named {lease_name(RUN)!r}"),
    ],
    ids=["no-owner", "another-owner", "no-label", "another-label", "another-name"],
)
def test_a_lease_not_made_for_the_run_is_foreign(meta: dict[str, Any], because: str) -> None:
    assert LeaseRecord.from_dict(lease(**meta)).foreign_because(RUN, RUN_UID) == because


def test_the_same_name_for_a_recreated_run_is_foreign() -> None:
    """A run deleted and created again under its name has a new uid: the old Lease is not its own."""
    assert LeaseRecord.from_dict(lease()).foreign_because(RUN, "run-uid-2") is not None


def test_a_conflict_is_a_condition_written_once_and_kept_beside_the_others() -> None:
    run = {
        "metadata": {"name": RUN, "generation": 2},
        "status": {
            "state": "ready",
            "stateVersion": 4,
            "conditions": [
                {
                    "type": "Finished",
                    "status": "False",
                    "reason": "Ready",
                    "lastTransitionTime": "2030-01-01T11:00:00Z",
                }
            ],
            "checkpoint": {"schemaVersion": 2},
        },
    }
    status = conflict_status(run, "Lease team-a/agentrun-pay-1 was not created by the operator", T0)
    assert status is not None
    assert (status["state"], status["stateVersion"], status["checkpoint"]) == (
        "ready",
        4,
        {"schemaVersion": 2},
    )
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Finished"] == run["status"]["conditions"][0]
    conflict = by_type[LEASE_CONFLICT]
    assert (conflict["status"], conflict["reason"], conflict["observedGeneration"]) == (
        "True",
        "ForeignLease",
        2,
    )
    assert "agentrun-pay-1" in conflict["message"]
    # Said already: no second write. Another message (another Lease): written again, replaced.
    again = {**run, "status": status}
    assert conflict_status(again, conflict["message"], T0) is None
    other = conflict_status(again, "another message", T0)
    assert other is not None
    assert [c["message"] for c in other["conditions"] if c["type"] == LEASE_CONFLICT] == ["another message"]


def test_a_run_without_a_status_says_so_too() -> None:
    status = conflict_status({"metadata": {"name": RUN}}, "why", T0)
    assert status is not None
    assert [c["type"] for c in status["conditions"]] == [LEASE_CONFLICT]
