"""``spec.region`` on a real API server: a run's home region is a DNS label, set at creation (or
once, on a run created before regions existed) and never changed or removed afterwards; an
AgentPolicy may name the default region of the runs it governs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.cluster import KubeEnv

REPO = Path(__file__).resolve().parents[2]


def sample(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((REPO / "config" / "samples" / name).read_text())
    body["spec"].update(spec)
    return body


def create_run(kube: KubeEnv, ns: str, **spec: Any) -> dict[str, Any]:
    run: dict[str, Any] = kube.custom().create_namespaced_custom_object(
        GROUP, VERSION, ns, "agentruns", sample("agentrun-read-ask-complete.yaml", **spec)
    )
    return run


def patch_run(kube: KubeEnv, ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    run: dict[str, Any] = kube.custom().patch_namespaced_custom_object(
        GROUP, VERSION, ns, "agentruns", name, {"spec": spec}
    )
    return run


def refused(call: Any, *args: Any) -> str:
    with pytest.raises(ApiException) as err:
        call(*args)
    assert err.value.status == 422, err.value.body
    return str(err.value.body)


def test_a_run_keeps_the_region_it_was_created_with(kube: KubeEnv, namespace: str) -> None:
    run = create_run(kube, namespace, region="eu-west-1")
    name = run["metadata"]["name"]
    assert run["spec"]["region"] == "eu-west-1"

    message = refused(patch_run, kube, namespace, name, {"region": "us-east-1"})
    assert "spec.region" in message
    assert "region is immutable: a run changes region only by an authorised failover" in message

    message = refused(patch_run, kube, namespace, name, {"region": None})
    assert "spec.region" in message
    assert "region cannot be removed once set" in message

    # Writing the same region again is no change, and other fields stay writable.
    patched = patch_run(kube, namespace, name, {"region": "eu-west-1", "answers": {"req-1": "yes"}})
    assert patched["spec"]["region"] == "eu-west-1"


def test_a_run_created_without_a_region_may_be_given_one_once(kube: KubeEnv, namespace: str) -> None:
    """The admission webhook defaults the region at creation, so a run without one was created
    before regions existed (or without the webhook): it may be placed once, then it is fixed."""
    run = create_run(kube, namespace)
    name = run["metadata"]["name"]
    assert "region" not in run["spec"]
    assert patch_run(kube, namespace, name, {"region": "default"})["spec"]["region"] == "default"
    assert "region is immutable" in refused(patch_run, kube, namespace, name, {"region": "eu-west-1"})


@pytest.mark.parametrize(
    ("region", "expected"),
    [
        ("EU-West", "should match"),
        ("eu_west", "should match"),
        ("-eu", "should match"),
        ("", "should match"),
        ("x" * 64, "may not be more than 63"),
    ],
)
def test_a_region_that_is_not_a_dns_label_is_refused(
    kube: KubeEnv, namespace: str, region: str, expected: str
) -> None:
    body = sample("agentrun-read-ask-complete.yaml", region=region)
    message = refused(
        kube.custom().create_namespaced_custom_object, GROUP, VERSION, namespace, "agentruns", body
    )
    assert "spec.region" in message
    assert expected in message


def test_a_policy_names_the_default_region_of_its_runs(kube: KubeEnv, namespace: str) -> None:
    body = sample("agentpolicy-default.yaml", defaultRegion="eu-west-1")
    created = kube.custom().create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", body)
    assert created["spec"]["defaultRegion"] == "eu-west-1"
    # A policy is GitOps-owned and versioned: its default may change (it applies to new runs only).
    name = created["metadata"]["name"]
    patched = kube.custom().patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentpolicies", name, {"spec": {"defaultRegion": "us-east-1"}}
    )
    assert patched["spec"]["defaultRegion"] == "us-east-1"

    bad = sample("agentpolicy-default.yaml", defaultRegion="Not A Label")
    bad["metadata"]["name"] = "bad-region"
    message = refused(
        kube.custom().create_namespaced_custom_object, GROUP, VERSION, namespace, "agentpolicies", bad
    )
    assert "spec.defaultRegion" in message
