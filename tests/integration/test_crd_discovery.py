"""The kinds on a real API server are discoverable: ``kubectl get durable-agents`` lists an object
of every kind, each short name resolves to its kind and clashes with no other resource the API
server serves, and ``kubectl explain`` shows the fields' descriptions."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.api import crdgen
from durable_agents.api.v1alpha1 import FAILOVER_PLURAL, GROUP, VERSION
from durable_agents_testkit.cluster import KubeEnv

REPO = Path(__file__).resolve().parents[2]
CATEGORY = "durable-agents"


def _kubectl(kube: KubeEnv, *args: str) -> str:
    if kube.plane is None:
        pytest.skip("needs the local control plane's kubectl")
    done = kube.plane.kubectl(*args)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def _sample(name: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((REPO / "config" / "samples" / name).read_text())
    return body


def _samples(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((REPO / "config" / "samples" / name).read_text()) if doc]


def _objects(suffix: str) -> dict[str, dict[str, Any]]:
    """One valid object of every kind, by kind."""
    record = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentRunRecord",
        "metadata": {"name": f"record-{suffix}"},
        "spec": {
            "run": {"name": "gone", "uid": "u-1", "taskType": "demo"},
            "state": "completed",
            "recordedAt": "2026-01-01T00:00:00Z",
            "why": "deleted",
        },
    }
    failover = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RegionFailover",
        "metadata": {"name": f"failover-{suffix}"},
        "spec": {"from": "eu", "to": "us"},
    }
    # Not a default: a cluster-wide baseline would govern the runs of every other test here.
    cluster_policy = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ClusterAgentPolicy",
        "metadata": {"name": f"cluster-policy-{suffix}"},
        "spec": {"version": "1"},
    }
    found = {
        "AgentRun": _sample("agentrun-read-ask-complete.yaml"),
        "ClusterAgentPolicy": cluster_policy,
        "ActionRecord": _sample("actionrecord-example.yaml"),
        "AgentPolicy": _sample("agentpolicy-default.yaml"),
        "AgentSchedule": _sample("agentschedule-nightly.yaml"),
        "AgentRunRecord": record,
        "RegionFailover": failover,
        # The refunds Agent and its ModelConfig (config/samples/agent-refunds.yaml, minus its run).
        **{doc["kind"]: doc for doc in _samples("agent-refunds.yaml") if doc["kind"] != "AgentRun"},
    }
    assert set(found) == {k.kind for k in crdgen.KINDS}, "a kind without an object in this test"
    return found


@pytest.fixture
def made(kube: KubeEnv, namespace: str) -> Iterator[dict[str, str]]:
    """One object of every kind (the cluster-scoped one deleted afterwards): kind -> name."""
    custom = kube.custom()
    suffix = uuid.uuid4().hex[:8]
    kinds = {k.kind: k for k in crdgen.KINDS}
    names: dict[str, str] = {}
    for kind, body in _objects(suffix).items():
        plural = kinds[kind].plural
        if kinds[kind].scope == "Cluster":
            custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
        else:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
        names[kind] = body["metadata"]["name"]
    yield names
    for plural, kind in ((FAILOVER_PLURAL, "RegionFailover"), ("clusteragentpolicies", "ClusterAgentPolicy")):
        try:
            custom.delete_cluster_custom_object(GROUP, VERSION, plural, names[kind])
        except ApiException as err:
            if err.status != 404:
                raise


def test_kubectl_get_the_category_lists_every_kind(
    kube: KubeEnv, namespace: str, made: dict[str, str]
) -> None:
    listed = set(_kubectl(kube, "get", CATEGORY, "-n", namespace, "-o", "name").split())
    for kind in crdgen.KINDS:
        expected = f"{kind.singular}.{GROUP}/{made[kind.kind]}"
        assert expected in listed, f"kubectl get {CATEGORY} does not list {expected}: {sorted(listed)}"


def test_each_short_name_resolves_to_its_kind(kube: KubeEnv, namespace: str, made: dict[str, str]) -> None:
    for kind in crdgen.KINDS:
        for short in kind.short_names:
            shown = _kubectl(kube, "get", short, made[kind.kind], "-n", namespace, "-o", "name").split()
            assert shown == [f"{kind.singular}.{GROUP}/{made[kind.kind]}"], (short, shown)


def _served_resources(api: client.ApiClient) -> list[tuple[str, dict[str, Any]]]:
    """(group/version, resource) of every resource the API server serves, as discovery lists it."""
    paths = ["/api/v1"] + [
        f"/apis/{v.group_version}"
        for group in client.ApisApi(api).get_api_versions().groups
        for v in group.versions
    ]
    out = []
    for path in paths:
        method, url, headers, _, _ = api.param_serialize(
            method="GET",
            resource_path=path,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = api.rest_client.request(method, url, headers=headers)
        response.read()
        assert response.status == 200, (path, response.status)
        found = json.loads(response.data)
        out += [(path, r) for r in found["resources"] if "/" not in r["name"]]  # not subresources
    return out


def test_discovery_serves_names_and_category_without_clashes(kube: KubeEnv) -> None:
    served = _served_resources(kube.api)
    ours = {r["name"]: r for path, r in served if path == f"/apis/{GROUP}/{VERSION}"}
    for kind in crdgen.KINDS:
        resource = ours[kind.plural]
        assert resource["kind"] == kind.kind
        assert sorted(resource.get("shortNames", [])) == sorted(kind.short_names), kind.kind
        assert resource.get("categories") == [CATEGORY], kind.kind
    # No short name of ours is a name or short name of any other resource (core kinds included).
    others = {
        name
        for path, r in served
        if path != f"/apis/{GROUP}/{VERSION}"
        for name in [r["name"], r.get("singularName", ""), *r.get("shortNames", [])]
    }
    assert len(others) > 50, "discovery listed too few resources to check against"
    mine = [short for kind in crdgen.KINDS for short in kind.short_names]
    assert len(mine) == len(set(mine)), f"a short name used twice: {mine}"
    assert sorted(set(mine) & others) == []


def test_kubectl_explain_shows_the_field_descriptions(kube: KubeEnv) -> None:
    policy = _kubectl(kube, "explain", "agentpolicy.spec")
    assert "recorded in every run it governs" in policy  # spec.version
    assert "wait for a person's approval" in " ".join(policy.split())  # spec.approvalRequiredTiers
    run = " ".join(_kubectl(kube, "explain", "ar.spec.serviceAccountName").split())
    assert "The ServiceAccount the run acts as" in run
