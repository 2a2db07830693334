"""Run Leases on a real API server: the writes a worker makes to one Lease never race each other."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.shell.kube import Kube
from durable_agents.shell.leases import RunLeases
from durable_agents_testkit.cluster import KubeEnv

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
