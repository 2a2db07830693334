"""status.traceId on a real API server: written once, then the CRD's rule refuses any other value
(the run's one trace cannot be split by a status write, the operator's or anyone's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.cluster import KubeEnv

REPO = Path(__file__).resolve().parents[2]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def write_status(kube: KubeEnv, namespace: str, name: str, trace_id: str | None) -> dict[str, Any]:
    custom = kube.custom()
    run = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", name)
    run["status"] = {"state": "ready", "stateVersion": 1, "checkpoint": {"schemaVersion": 1}}
    if trace_id is not None:
        run["status"]["traceId"] = trace_id
    out: dict[str, Any] = custom.replace_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "agentruns", name, run
    )
    return out


def test_the_trace_id_is_kept_once_written(kube: KubeEnv, namespace: str) -> None:
    body = yaml.safe_load((REPO / "config/samples/agentrun-read-ask-complete.yaml").read_text())
    kube.custom().create_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", body)
    name = body["metadata"]["name"]

    assert write_status(kube, namespace, name, TRACE)["status"]["traceId"] == TRACE
    assert write_status(kube, namespace, name, TRACE)["status"]["traceId"] == TRACE  # the same: fine
    with pytest.raises(ApiException) as err:
        write_status(kube, namespace, name, "0af7651916cd43dd8448eb211c80319c")
    assert err.value.status == 422, err.value.body
    assert "traceId never changes" in str(err.value.body)
    with pytest.raises(ApiException) as err:
        write_status(kube, namespace, name, "NOT-HEX")
    assert err.value.status == 422, err.value.body
