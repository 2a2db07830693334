"""The model planner's sample (``config/samples/agentrun-model.yaml``) as the e2e tests install it.

Its objects go into a test's namespace: the prompt and evidence ConfigMaps, the key Secret (with
the reference model server's key), the Role and RoleBinding of the run's ServiceAccount and, unless
a test writes its own, the AgentPolicy. The run itself is the test's to create.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.localcluster.controlplane import find_repo_root

_REPO = find_repo_root() or Path(__file__).resolve().parents[2]
SAMPLE = _REPO / "config/samples/agentrun-model.yaml"
SCRIPT = _REPO / "config/samples/reference-model/refunds-script.yaml"
API_KEY = "sk-test-agent"


def sample() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(SAMPLE.read_text()) if doc]


def sample_of(kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(doc for doc in sample() if doc["kind"] == kind))


def script() -> dict[str, Any]:
    out: dict[str, Any] = yaml.safe_load(SCRIPT.read_text())
    return out


def install_sample(
    api: client.ApiClient, namespace: str, *, api_key: str = API_KEY, policy: bool = True
) -> None:
    """The sample's objects but its run, in ``namespace`` (the Secret holding ``api_key``)."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    for doc in sample():
        kind, body = doc["kind"], {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
        if kind == "ConfigMap":
            core.create_namespaced_config_map(namespace, body)
        elif kind == "Secret":
            body["stringData"] = {**body.get("stringData", {}), "apiKey": api_key}
            core.create_namespaced_secret(namespace, body)
        elif kind == "Role":
            rbac.create_namespaced_role(namespace, body)
        elif kind == "RoleBinding":
            body["subjects"] = [{**s, "namespace": namespace} for s in body["subjects"]]
            rbac.create_namespaced_role_binding(namespace, body)
        elif kind == "AgentPolicy" and policy:
            custom = client.CustomObjectsApi(api)
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", body)
