"""RegionFailover on a real API server, without the admission webhook: the CRD's own rules refuse a
failover to the same region and any change of a request once made; it is cluster-scoped, found
by its short name's resource, and its status is written through the status subresource only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import FAILOVER_PLURAL, GROUP, VERSION, RegionFailover
from durable_agents_testkit.cluster import KubeEnv


def body(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RegionFailover",
        "metadata": {"name": name},
        "spec": {"from": "eu", "to": "us", **spec},
    }


@pytest.fixture
def name(kube: KubeEnv) -> Iterator[str]:
    """A fresh name; the object (cluster-scoped: no namespace takes it along) deleted afterwards."""
    made = f"failover-eu-to-us-{uuid.uuid4().hex[:8]}"
    yield made
    try:
        kube.custom().delete_cluster_custom_object(GROUP, VERSION, FAILOVER_PLURAL, made)
    except ApiException as err:
        if err.status != 404:
            raise


def refused(call: Any, *args: Any) -> str:
    with pytest.raises(ApiException) as err:
        call(*args)
    assert err.value.status == 422, err.value.body
    return str(err.value.body)


def test_a_failover_to_the_same_region_is_refused(kube: KubeEnv, name: str) -> None:
    create = kube.custom().create_cluster_custom_object
    message = refused(create, GROUP, VERSION, FAILOVER_PLURAL, body(name, to="eu"))
    assert "a failover moves runs to another region: from and to must differ" in message
    assert "spec.from" in refused(create, GROUP, VERSION, FAILOVER_PLURAL, body(name, **{"from": "EU"}))
    assert "spec.to" in refused(
        create, GROUP, VERSION, FAILOVER_PLURAL, {**body(name), "spec": {"from": "eu"}}
    )


def test_a_request_once_made_never_changes(kube: KubeEnv, name: str) -> None:
    custom = kube.custom()
    made = custom.create_cluster_custom_object(
        GROUP, VERSION, FAILOVER_PLURAL, body(name, reason="eu is down")
    )
    assert "namespace" not in made["metadata"]  # cluster-scoped
    assert RegionFailover.model_validate(made).spec.from_region == "eu"
    immutable = "a region failover request is immutable once made: create a new one to ask again"
    patch = custom.patch_cluster_custom_object
    for change in (
        {"to": "ap"},
        {"reason": "another"},
        {"requestedBy": {"username": "mallory"}},
        {"reason": None},
    ):
        assert immutable in refused(patch, GROUP, VERSION, FAILOVER_PLURAL, name, {"spec": change})
    # Labels and annotations stay writable; the status is written through its subresource only.
    patch(GROUP, VERSION, FAILOVER_PLURAL, name, {"metadata": {"labels": {"team": "sre"}}})
    ignored = patch(GROUP, VERSION, FAILOVER_PLURAL, name, {"status": {"phase": "Completed"}})
    assert "status" not in ignored
    status = {
        "status": {"phase": "Completed", "epoch": 4, "adopted": [{"namespace": "a", "name": "r", "epoch": 4}]}
    }
    written = custom.patch_cluster_custom_object_status(GROUP, VERSION, FAILOVER_PLURAL, name, status)
    assert written["status"]["adopted"] == [{"namespace": "a", "name": "r", "epoch": 4}]
    assert written["spec"] == made["spec"]


def test_the_status_lists_are_bounded(kube: KubeEnv, name: str) -> None:
    custom = kube.custom()
    custom.create_cluster_custom_object(GROUP, VERSION, FAILOVER_PLURAL, body(name))
    too_many = [{"namespace": "a", "name": f"r{i}", "epoch": 1} for i in range(1001)]
    message = refused(
        custom.patch_cluster_custom_object_status,
        GROUP,
        VERSION,
        FAILOVER_PLURAL,
        name,
        {"status": {"phase": "Completed", "adopted": too_many}},
    )
    assert "status.adopted" in message
    assert "must have at most 1000 items" in message
