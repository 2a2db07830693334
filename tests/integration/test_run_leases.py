"""Run Leases on a real API server: the writes a worker makes to one Lease never race each other,
and a Lease is the operator's only if it made it for the run (owner reference, label, name)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ownership.leases import RunLeases, lease_name
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually, eventually_async
from durable_agents_testkit.rbac import grant, rule

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 25


def agent_run(kube: KubeEnv, namespace: str, name: str) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "config/samples/agentrun-read-ask-complete.yaml").read_text())
    body["metadata"]["name"] = name
    run: dict[str, Any] = kube.custom().create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentruns", body
    )
    return run


async def test_a_release_during_a_renewal_still_removes_the_lease(kube: KubeEnv, namespace: str) -> None:
    """A worker releases a run (it entered a wait) while its renewer is extending the same Lease.

    Both are compare-and-swap writes on the Lease's resourceVersion. Unserialized, the renewal can
    land first and the delete, still preconditioned on the old version, is refused (409): the
    Lease stays behind, naming a worker that no longer holds it. Repeated, because the order in
    which two concurrent requests reach the API server is up to the scheduler.
    """
    leases = RunLeases(Kube(kube.api), "worker-a", duration_seconds=15)
    left_behind = []
    for i in range(ROUNDS):
        run = agent_run(kube, namespace, f"race-{i}")
        hold = await leases.create(namespace, run["metadata"]["name"], run["metadata"]["uid"], 0)
        assert hold is not None
        renewed, _ = await asyncio.gather(leases.renew(hold), leases.release(hold))
        record = await leases.get(namespace, run["metadata"]["name"])
        if record is not None:
            left_behind.append((i, renewed, record.holder))
        assert hold.lost, "a released hold must not be used again"
        assert not await leases.renew(hold), "a released hold was renewed"
    assert left_behind == [], f"Leases left behind after release (round, renewed, holder): {left_behind}"


def lease_user(kube: KubeEnv, namespace: str) -> client.CoordinationV1Api:
    """Another user, who may create and delete Leases in the namespace (nothing else)."""
    grant(kube, namespace, "lease-maker", rule("coordination.k8s.io", "leases", "create", "delete"))
    return client.CoordinationV1Api(kube.user_client("lease-maker", []))


async def test_a_run_lease_is_owned_by_its_run_and_collected_with_it(kube: KubeEnv, namespace: str) -> None:
    leases = RunLeases(Kube(kube.api), "worker-a", duration_seconds=15)
    run = agent_run(kube, namespace, "owned")
    uid = run["metadata"]["uid"]
    hold = await leases.create(namespace, "owned", uid, 0)
    assert hold is not None
    stored = client.CoordinationV1Api(kube.api).read_namespaced_lease(lease_name("owned"), namespace)
    assert stored.metadata.labels == {RUN_LABEL: "owned"}
    assert [ref.to_dict() for ref in stored.metadata.owner_references] == [
        {
            "api_version": f"{GROUP}/{VERSION}",
            "kind": "AgentRun",
            "name": "owned",
            "uid": uid,
            "controller": False,
            "block_owner_deletion": False,
        }
    ]
    record = await leases.get(namespace, "owned")
    assert record is not None
    assert record.foreign_because("owned", uid) is None
    assert record.foreign_because("owned", "another-uid") is not None

    # The owner reference lets the garbage collector remove the Lease with its run (it notices a
    # new CRD on its discovery resync, up to 30 s after the session installed the CRDs).
    kube.custom().delete_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", "owned")

    async def gone() -> bool:
        return await leases.get(namespace, "owned") is None

    await eventually_async(gone, Within.TAKEOVER, "the garbage collector to remove a deleted run's Lease")


async def test_a_lease_someone_else_made_under_the_runs_lease_name_is_foreign(
    kube: KubeEnv, namespace: str
) -> None:
    """Made by another user: without an owner reference, or owned by another object, it is not
    the run's, whatever its name, label or holder say."""
    leases = RunLeases(Kube(kube.api), "worker-a", duration_seconds=15)
    other = lease_user(kube, namespace)
    run = agent_run(kube, namespace, "target")
    decoy = agent_run(kube, namespace, "decoy")
    spec = {
        "holderIdentity": "worker-a",
        "leaseDurationSeconds": 1,
        "renewTime": "2020-01-01T00:00:00.123456Z",
    }
    name = lease_name("target")
    foreign = {"metadata": {"name": name, "labels": {RUN_LABEL: "target"}}, "spec": spec}
    eventually(lambda: _create(other, namespace, foreign), Within.MOMENT, "the lease-maker's RBAC")
    record = await leases.get(namespace, "target")
    assert record is not None
    assert record.foreign_because("target", run["metadata"]["uid"]) == "it has no owner reference to the run"

    other.delete_namespaced_lease(name, namespace)
    owned_by_decoy = {
        "metadata": {
            "name": name,
            "labels": {RUN_LABEL: "target"},
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "AgentRun",
                    "name": "decoy",
                    "uid": decoy["metadata"]["uid"],
                }
            ],
        },
        "spec": spec,
    }
    _create(other, namespace, owned_by_decoy)
    record = await leases.get(namespace, "target")
    assert record is not None
    assert record.foreign_because("target", run["metadata"]["uid"]) == (
        f"its owner is another object (uid {decoy['metadata']['uid']})"
    )


def _create(api: client.CoordinationV1Api, namespace: str, body: dict[str, Any]) -> bool:
    try:
        api.create_namespaced_lease(namespace, body)
    except client.ApiException as err:
        if err.status == 403:  # the Role binding is not in the authorizer's cache yet
            return False
        raise
    return True
