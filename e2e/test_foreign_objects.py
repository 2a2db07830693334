"""Objects someone else made under the names the operator uses: never adopted, deleted or taken over.

- A child run created first by another user under a step's child name (owned by the parent, the
  step's exact spec, a made-up stamp) is not adopted: the parent's step fails ``ForeignChild``
  and the parent never completes as if its child had run. The operator's own child is adopted,
  also when the operator dies right before or right after creating it.
- Runs are covered by shard Leases: a Lease another user created under a run's (earlier
  releases') Lease name is neither deleted nor taken over, and is no claim on the run; a live
  per-run Lease that an earlier release made for the run is respected until it expires.

The operator runs as its own user with the chart's RBAC; the other user may create AgentRuns and
Leases in the namespace, nothing more.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION, ChildStep
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.core.engine import RunSnapshot, child_body, child_run_name
from durable_agents.core.engine.children import CHILD_STAMP_ANNOTATION, PARENT_STEP_ANNOTATION
from durable_agents.core.planner import StartChild
from durable_agents.shell.ownership.leases import lease_name
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule, service_account
from durable_agents_testkit.runs import Runs, assert_history_is_gapless

LEASE = 2
OTHER_USER = "mallory"
DONE = {"name": "done", "complete": {"result": "ok"}}
CHILD = {
    "name": "sub",
    "child": {"taskType": "sub", "objective": "do the sub-task", "steps": [{"name": "c", "complete": {}}]},
}
# A past renewTime with microseconds (MicroTime): expired long ago.
EXPIRED = {
    "holderIdentity": OTHER_USER,
    "leaseDurationSeconds": 1,
    "renewTime": "2020-01-01T00:00:00.123456Z",
}


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def spec(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"taskType": "foreign", "objective": "meet objects someone else made", "steps": list(steps)}


def grant_children(kube: KubeEnv, namespace: str) -> None:
    """The runs' ServiceAccount may start child runs (they are made AS that account)."""
    children = rule(GROUP, "agentruns", "get", "create", "patch")
    grant(kube, namespace, service_account("default", namespace), children, name="start-children")


def other_user(kube: KubeEnv, namespace: str) -> client.ApiClient:
    """Another user, who may create AgentRuns and create or delete Leases in the namespace."""
    rules = [
        rule(GROUP, "agentruns", "get", "create"),
        rule("coordination.k8s.io", "leases", "get", "create", "delete"),
    ]
    grant(kube, namespace, OTHER_USER, rules, name="other-user")
    return kube.user_client(OTHER_USER, [])


def as_soon_as_allowed(create: Callable[[], Any], what: str) -> Any:
    """Create once the new Role binding reaches the authorizer (403 until then)."""

    def attempt() -> Any:
        try:
            return create()
        except client.ApiException as err:
            if err.status == 403:
                return None
            raise

    return eventually(attempt, Within.MOMENT, what)


def conditions(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (run.get("status") or {}).get("conditions") or []}


def get_or_none(runs: Runs, name: str) -> dict[str, Any] | None:
    try:
        return runs.get(name)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


# --- child runs --------------------------------------------------------------------------------


def test_a_child_run_created_first_by_another_user_is_not_adopted(
    kube: KubeEnv, namespace: str, runs: Runs, start_operator: Callable[..., OperatorProcess]
) -> None:
    grant_children(kube, namespace)
    other = other_user(kube, namespace)
    parent = runs.create(spec(CHILD, DONE), name="parent")
    child = child_run_name(parent, "sub")
    # Exactly the child the operator would make: owned by the parent, its spec, a made-up stamp.
    snap = RunSnapshot.from_object(runs.get(parent))
    body = child_body(snap, StartChild("sub", ChildStep.model_validate(CHILD["child"])))
    body["metadata"]["annotations"] = {PARENT_STEP_ANNOTATION: "sub", CHILD_STAMP_ANNOTATION: "k1:AAAA"}
    assert body["metadata"]["ownerReferences"][0]["uid"] == snap.uid
    custom = client.CustomObjectsApi(other)
    created = as_soon_as_allowed(
        lambda: custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", body),
        "the other user to create the child run first",
    )

    start_operator("op", LEASE)
    failed = runs.wait_state(parent, "failed", "completed", timeout=Within.RUN)
    status = failed["status"]
    assert status["state"] == "failed", f"the parent adopted a run it did not make: {status}"
    assert status["outcome"]["reason"] == "ForeignChild", status["outcome"]
    assert f"{namespace}/{child}" in status["outcome"]["message"]
    assert conditions(failed)["Succeeded"]["reason"] == "ForeignChild"
    history = assert_history_is_gapless(failed)
    assert "succeeded" not in [h["event"] for h in history]
    cp = status["checkpoint"]
    assert cp["position"]["step"] == 0, "the parent did not go on past its child step"
    assert cp["children"] == [{"name": child, "stepIndex": 0, "outcome": "failed", "reason": "ForeignChild"}]
    warned = runs.wait_event(parent, "ForeignChild")
    assert f"{namespace}/{child}" in warned[0].message
    assert warned[0].type == "Warning"
    # The foreign run is left as its creator made it: not re-stamped, not replaced.
    foreign = runs.get(child)
    assert foreign["metadata"]["uid"] == created["metadata"]["uid"]
    assert foreign["metadata"]["annotations"][CHILD_STAMP_ANNOTATION] == "k1:AAAA"


@pytest.mark.parametrize(
    ("kill_at", "created"),
    [("after:1", False), ("after:2", True)],
    ids=["killed-before-creating-the-child", "killed-right-after-creating-the-child"],
)
def test_the_operators_own_child_is_adopted_across_a_crash(
    kube: KubeEnv,
    namespace: str,
    runs: Runs,
    start_operator: Callable[..., OperatorProcess],
    kill_at: str,
    created: bool,
) -> None:
    """Writes: 1 accepted + the child's intent (external_awaited), one write at that semantic
    boundary; 2 the child's creation. Killed after 2, the parent never recorded anything about the
    created child: its stamp proves it ours."""
    grant_children(kube, namespace)
    victim = start_operator("victim", LEASE, DURABLE_AGENTS_TEST_KILL_AT=kill_at)
    parent = runs.create(spec(CHILD, DONE), name="parent")
    child = child_run_name(parent, "sub")
    assert victim.wait_killed(Within.RUN) == -signal.SIGKILL
    at_crash = runs.get(parent)
    assert (at_crash["status"]["state"], at_crash["status"]["stateVersion"]) == ("waiting_external", 2)
    assert at_crash["status"]["checkpoint"]["children"] == [{"name": child, "stepIndex": 0}]
    made = get_or_none(runs, child)
    assert (made is not None) is created, made
    if made is not None:
        assert made["metadata"]["annotations"][CHILD_STAMP_ANNOTATION], "created with the operator's stamp"
        assert "status" not in made or not made["status"].get("stateVersion"), "the child never ran"

    start_operator("rescuer", LEASE)
    done = runs.wait_state(parent, "completed", "failed", timeout=Within.RUN)
    assert done["status"]["state"] == "completed", done["status"].get("outcome")
    sub = runs.get(child)
    assert sub["status"]["state"] == "completed"
    if made is not None:
        assert sub["metadata"]["uid"] == made["metadata"]["uid"], "the child created before the crash"
    assert [h["event"] for h in assert_history_is_gapless(done)] == [
        "accepted",
        "external_awaited",
        "external_received",
        "revalidated",
        "succeeded",
    ]
    assert done["status"]["checkpoint"]["children"] == [
        {"name": child, "stepIndex": 0, "outcome": "completed", "reason": "Completed"}
    ]
    assert [e for e in runs.events(parent) if e.reason == "ForeignChild"] == []


# --- leases ------------------------------------------------------------------------------------


def lease_unchanged(runs: Runs, lease: client.V1Lease) -> None:
    now = client.CoordinationV1Api(runs.kube.api).read_namespaced_lease(lease.metadata.name, runs.namespace)
    assert now.metadata.uid == lease.metadata.uid, "the foreign Lease was deleted"
    assert now.metadata.resource_version == lease.metadata.resource_version, (
        "the foreign Lease was taken over"
    )


def test_foreign_leases_under_a_runs_old_lease_name_neither_block_it_nor_are_touched(
    kube: KubeEnv, namespace: str, runs: Runs, start_operator: Callable[..., OperatorProcess]
) -> None:
    """Runs are covered by shard Leases: a Lease under a run's (earlier releases') Lease name that
    the operator did not make for that run (no owner reference, or another owner, labelled or
    not, live or expired) is nobody's claim on the run. It runs, and the Leases stay as they were."""
    other = other_user(kube, namespace)
    leases = client.CoordinationV1Api(other)
    decoy = as_soon_as_allowed(
        lambda: client.CustomObjectsApi(other).create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "agentruns",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "AgentRun",
                "metadata": {"name": "decoy"},
                "spec": spec(DONE),
            },
        ),
        "the other user to create a run",
    )
    live = {"holderIdentity": OTHER_USER, "leaseDurationSeconds": 3600, "renewTime": now_micro()}
    squatted = leases.create_namespaced_lease(
        namespace, {"metadata": {"name": lease_name("squatted")}, "spec": live}
    )
    owned_by_decoy = leases.create_namespaced_lease(
        namespace,
        {
            "metadata": {
                "name": lease_name("decoyed"),
                "labels": {RUN_LABEL: "decoyed"},
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "AgentRun",
                        "name": "decoy",
                        "uid": decoy["metadata"]["uid"],
                    }
                ],
            },
            "spec": live,
        },
    )
    start_operator("op", LEASE)
    for name in ("squatted", "decoyed"):
        runs.create(spec({"name": "confirm", "ask": {"question": "go on?"}}, DONE), name=name)
        runs.wait_state(name, "waiting_input", timeout=Within.COMMIT)
        runs.patch_spec(name, {"answers": {"confirm": "yes"}})
        done = runs.wait_state(name, "completed", timeout=Within.RUN)
        assert "LeaseConflict" not in conditions(done)
        assert_history_is_gapless(done)
    lease_unchanged(runs, squatted)
    lease_unchanged(runs, owned_by_decoy)


def test_a_live_lease_of_an_earlier_release_is_respected_until_it_expires(
    runs: Runs, start_operator: Callable[..., OperatorProcess]
) -> None:
    """A rolling upgrade: a Pod of an earlier release (a Lease per run) still holds a run. This
    release does not advance the run until that Lease expires (or goes), then takes it on."""
    name = runs.create(spec(DONE), name="held-by-old")
    run = runs.get(name)
    duration = 6
    held = client.CoordinationV1Api(runs.kube.api).create_namespaced_lease(
        runs.namespace,
        {
            "metadata": {
                "name": lease_name(name),
                "labels": {RUN_LABEL: name},
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "AgentRun",
                        "name": name,
                        "uid": run["metadata"]["uid"],
                    }
                ],
            },
            "spec": {
                "holderIdentity": "old-release-pod",
                "leaseDurationSeconds": duration,
                "renewTime": now_micro(),
            },
        },
    )
    expires = held.spec.renew_time + timedelta(seconds=duration)
    start_operator("op", LEASE)
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    first = datetime.fromisoformat(done["status"]["history"][0]["at"])
    assert first >= expires, f"advanced at {first}, before the old release's Lease expired at {expires}"
