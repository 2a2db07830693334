"""The operator's direct requests (``shell/ground/kube.py``) against a real API server: each stands
for a generated client method on a hot path (an ActionRecord per effect, an Event per transition,
a model run's prompt and key read as its ServiceAccount) and must build the same request and give
the same answer, refusals included, as a dict instead of the client's models (issue 38)."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION, KeyReference
from durable_agents.shell.agent.credentials import Unresolvable, read_key
from durable_agents.shell.ground.kube import Kube, service_account_user
from durable_agents_testkit.cluster import KubeEnv

pytestmark = pytest.mark.integration


def _record(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ActionRecord",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runRef": {"name": "r", "uid": "u-1"},
            "stepIndex": 0,
            "effect": "http.post",
            "tier": "consequential",
            "idempotencyKey": f"u-1/0/{name}",
        },
    }


def test_an_object_is_created_and_listed_as_the_generated_methods_do(kube: KubeEnv, namespace: str) -> None:
    ours = Kube(kube.api)
    made = ours.create_namespaced_object(
        GROUP, VERSION, namespace, "actionrecords", _record(namespace, "ours")
    )
    theirs = kube.custom().create_namespaced_custom_object(
        GROUP, VERSION, namespace, "actionrecords", _record(namespace, "theirs")
    )
    assert type(made) is dict
    assert made["spec"] == {**theirs["spec"], "idempotencyKey": "u-1/0/ours"}
    assert made["metadata"]["name"] == "ours"
    assert made["metadata"]["resourceVersion"]
    listed = ours.list_namespaced_objects(GROUP, VERSION, namespace, "actionrecords")
    theirs_listed = kube.custom().list_namespaced_custom_object(GROUP, VERSION, namespace, "actionrecords")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["ours", "theirs"]
    assert listed["items"] == theirs_listed["items"]
    with pytest.raises(ApiException) as again:  # a second create of the name: 409, as the client's
        ours.create_namespaced_object(GROUP, VERSION, namespace, "actionrecords", _record(namespace, "ours"))
    assert again.value.status == 409
    bad = _record(namespace, "bad")
    del bad["spec"]["runRef"]
    with pytest.raises(ApiException) as refused:  # the schema's refusal, said by the API server
        ours.create_namespaced_object(GROUP, VERSION, namespace, "actionrecords", bad)
    assert refused.value.status == 422


def test_an_event_is_created(kube: KubeEnv, namespace: str) -> None:
    name = f"r.{uuid.uuid4().hex[:16]}"
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AgentRun",
            "name": "r",
            "namespace": namespace,
        },
        "reason": "Accepted",
        "message": "accepted",
        "type": "Normal",
    }
    Kube(kube.api).create_event(namespace, body)
    stored = client.CoreV1Api(kube.api).read_namespaced_event(name, namespace)
    assert (stored.reason, stored.message, stored.involved_object.name) == ("Accepted", "accepted", "r")


async def test_a_key_is_read_as_the_run_s_service_account_or_refused_naming_it(
    kube: KubeEnv, namespace: str
) -> None:
    core, rbac = client.CoreV1Api(kube.api), client.RbacAuthorizationV1Api(kube.api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "runner"}})
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "prompt"}, "data": {"system": "Be brief."}}
    )
    secret = {"metadata": {"name": "keys"}, "data": {"api": base64.b64encode(b"sk-test\n").decode()}}
    core.create_namespaced_secret(namespace, secret)
    ours = Kube(kube.api)
    try:
        with pytest.raises(Unresolvable, match=f"^ServiceAccount {namespace}/runner may not read ConfigMap"):
            await read_key(ours, namespace, "runner", "ConfigMap", KeyReference(name="prompt", key="system"))
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "reads"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "reads"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reads"},
                "subjects": [{"kind": "ServiceAccount", "name": "runner", "namespace": namespace}],
            },
        )
        user = service_account_user(namespace, "runner")
        read = ours.get_as("v1", "ConfigMap", "prompt", namespace, user)
        assert type(read) is dict
        assert read["data"] == {"system": "Be brief."}
        assert await read_key(
            ours, namespace, "runner", "ConfigMap", KeyReference(name="prompt", key="system")
        ) == ("Be brief.")
        assert (
            await read_key(ours, namespace, "runner", "Secret", KeyReference(name="keys", key="api"))
            == "sk-test"
        )
        with pytest.raises(Unresolvable, match=f"^Secret {namespace}/gone not found$"):
            await read_key(ours, namespace, "runner", "Secret", KeyReference(name="gone", key="api"))
        with pytest.raises(Unresolvable, match="has no key 'other'"):
            await read_key(ours, namespace, "runner", "Secret", KeyReference(name="keys", key="other"))
    finally:
        ours.executor.shutdown(wait=False)
    with pytest.raises(ValueError, match="a ConfigMap or a Secret, not a Pod"):
        await read_key(ours, namespace, "runner", "Pod", KeyReference(name="x", key="y"))
