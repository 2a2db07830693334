"""Objects someone else made under the names the operator uses: never adopted, deleted or taken over.

- A child run created first by another user under a step's child name (owned by the parent, the
  step's exact spec, a made-up stamp) is not adopted: the parent's step fails ``ForeignChild``
  and the parent never completes as if its child had run. The operator's own child is adopted,
  also when the operator dies right before or right after creating it.
- A Lease created by another user under a run's Lease name (expired, no owner reference to the
  run, or another owner) is neither deleted nor taken over: the run does not advance and says why
  (condition ``LeaseConflict``, Event); once the Lease is gone the run completes.

The operator runs as its own user with the chart's RBAC; the other user may create AgentRuns and
Leases in the namespace, nothing more.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION, ChildStep
from durable_agents.core.engine import RunSnapshot, child_body, child_run_name
from durable_agents.core.engine.children import CHILD_STAMP_ANNOTATION, PARENT_STEP_ANNOTATION
from durable_agents.core.planner import StartChild
from durable_agents.shell.leases import RUN_LABEL, lease_name
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
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


def spec(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"taskType": "foreign", "objective": "meet objects someone else made", "steps": list(steps)}


def grant(
    kube: KubeEnv, namespace: str, name: str, subject: dict[str, Any], rules: list[dict[str, Any]]
) -> None:
    rbac = client.RbacAuthorizationV1Api(kube.api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [subject],
        },
    )


def grant_children(kube: KubeEnv, namespace: str) -> None:
    """The runs' ServiceAccount may start child runs (they are made AS that account)."""
    rules = [{"apiGroups": [GROUP], "resources": ["agentruns"], "verbs": ["get", "create", "patch"]}]
    subject = {"kind": "ServiceAccount", "name": "default", "namespace": namespace}
    grant(kube, namespace, "start-children", subject, rules)


def other_user(kube: KubeEnv, namespace: str) -> client.ApiClient:
    """Another user, who may create AgentRuns and create or delete Leases in the namespace."""
    rules = [
        {"apiGroups": [GROUP], "resources": ["agentruns"], "verbs": ["get", "create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "delete"]},
    ]
    subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OTHER_USER}
    grant(kube, namespace, "other-user", subject, rules)
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


def events(runs: Runs, name: str, reason: str) -> list[Any]:
    return [e for e in runs.events(name) if e.reason == reason]


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
    warned = eventually(lambda: events(runs, parent, "ForeignChild"), Within.COMMIT, "a ForeignChild Event")
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
    assert events(runs, parent, "ForeignChild") == []


# --- leases ------------------------------------------------------------------------------------


def lease_unchanged(runs: Runs, lease: client.V1Lease) -> None:
    now = client.CoordinationV1Api(runs.kube.api).read_namespaced_lease(lease.metadata.name, runs.namespace)
    assert now.metadata.uid == lease.metadata.uid, "the foreign Lease was deleted"
    assert now.metadata.resource_version == lease.metadata.resource_version, (
        "the foreign Lease was taken over"
    )
    assert now.spec.holder_identity == OTHER_USER


def test_a_foreign_lease_under_a_runs_lease_name_is_left_alone_until_it_is_gone(
    kube: KubeEnv, namespace: str, runs: Runs, start_operator: Callable[..., OperatorProcess]
) -> None:
    """No owner reference, no label: expired, the operator would have taken it over before."""
    leases = client.CoordinationV1Api(other_user(kube, namespace))
    name = "squatted"
    foreign = as_soon_as_allowed(
        lambda: leases.create_namespaced_lease(
            namespace, {"metadata": {"name": lease_name(name)}, "spec": EXPIRED}
        ),
        "the other user to create the Lease",
    )
    op = start_operator("op", LEASE)
    runs.create(spec(DONE), name=name)

    def says_why() -> dict[str, Any] | None:
        run = runs.get(name)
        return run if "LeaseConflict" in conditions(run) else None

    blocked = eventually(says_why, Within.COMMIT, "the run to say why it does not advance")
    condition = conditions(blocked)["LeaseConflict"]
    assert (condition["status"], condition["reason"]) == ("True", "ForeignLease")
    assert f"{namespace}/{lease_name(name)}" in condition["message"]
    assert "no owner reference" in condition["message"]
    assert blocked["status"].get("stateVersion", 0) == 0, "the run did not advance"
    warned = eventually(lambda: events(runs, name, "LeaseConflict"), Within.COMMIT, "a LeaseConflict Event")
    assert lease_name(name) in warned[0].message
    # It looks again (it polls: an unlabelled Lease's deletion is not watched), and still leaves it.
    eventually(
        lambda: op.log_tail(400).count("still waits: the foreign Lease") >= 2,
        Within.TAKEOVER,
        "the operator to look at the run again",
    )
    lease_unchanged(runs, foreign)
    assert runs.get(name)["status"].get("stateVersion", 0) == 0

    leases.delete_namespaced_lease(lease_name(name), namespace)
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    assert "LeaseConflict" not in conditions(done), "the next commit drops the stale condition"
    assert_history_is_gapless(done)
    eventually(lambda: runs.leases() == [], Within.COMMIT, "the run's own Lease to be released")


def test_a_lease_owned_by_another_object_is_not_reaped_nor_taken_over(
    kube: KubeEnv, namespace: str, runs: Runs, start_operator: Callable[..., OperatorProcess]
) -> None:
    """Labelled for the run and expired, but owned by another AgentRun: while the run is parked the
    reaper leaves it; when the run has work again it waits, says why, and goes on once it is gone."""
    other = other_user(kube, namespace)
    leases = client.CoordinationV1Api(other)
    op = start_operator("op", LEASE)
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
    name = runs.create(spec({"name": "confirm", "ask": {"question": "go on?"}}, DONE), name="parked")
    runs.wait_state(name, "waiting_input", timeout=Within.COMMIT)
    eventually(lambda: runs.leases() == [], Within.COMMIT, "the parked run to hold no Lease")
    owned_by_decoy = {
        "metadata": {
            "name": lease_name(name),
            "labels": {RUN_LABEL: name},
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "AgentRun",
                    "name": "decoy",
                    "uid": decoy["metadata"]["uid"],
                }
            ],
        },
        "spec": EXPIRED,
    }
    foreign = leases.create_namespaced_lease(namespace, owned_by_decoy)
    # Someone touches the parked run: the worker looks at it, finds it idle, and reaps nothing.
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentruns", name, {"metadata": {"annotations": {"touched": "1"}}}
    )
    eventually(
        lambda: f"leaving the foreign Lease {lease_name(name)}" in op.log_tail(400),
        Within.COMMIT,
        "the worker to look at the idle run",
    )
    lease_unchanged(runs, foreign)

    runs.patch_spec(name, {"answers": {"confirm": "yes"}})

    def says_why() -> dict[str, Any] | None:
        run = runs.get(name)
        return run if "LeaseConflict" in conditions(run) else None

    blocked = eventually(says_why, Within.COMMIT, "the run to say why it does not advance")
    assert "its owner is another object" in conditions(blocked)["LeaseConflict"]["message"]
    assert blocked["status"]["state"] == "waiting_input", "the run did not advance"
    eventually(lambda: events(runs, name, "LeaseConflict"), Within.COMMIT, "a LeaseConflict Event")
    lease_unchanged(runs, foreign)

    leases.delete_namespaced_lease(lease_name(name), namespace)
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    assert "LeaseConflict" not in conditions(done)
    assert_history_is_gapless(done)
