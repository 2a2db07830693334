"""The webhook's shared serving certificate and configurations on a real API server: replicas that
start together agree on one Secret, a Secret made for other names is renewed in place with its CA
kept, and the webhook configurations reach the webhook through a Service, are left alone when they
are already right (no write per replica) and are put back when someone breaks their caBundle."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import pytest
from kubernetes import client

from durable_agents.shell import admission
from durable_agents.shell.kube import Kube
from durable_agents.shell.webhook_certs import (
    TLS_CERT,
    WebhookCertificates,
    material_of,
    renewal_reason,
    renewed,
    service_names,
)
from durable_agents_testkit.cluster import KubeEnv

SERVICE, SECRET = "durable-agents-webhook", "durable-agents-webhook-tls"


def stored(kube: KubeEnv, namespace: str) -> client.V1Secret:
    return client.CoreV1Api(kube.api).read_namespaced_secret(SECRET, namespace)


async def test_replicas_starting_together_agree_on_one_certificate(kube: KubeEnv, namespace: str) -> None:
    replicas = [WebhookCertificates(Kube(kube.api), namespace, SECRET, SERVICE) for _ in range(3)]
    materials = await asyncio.gather(*(r.current() for r in replicas))
    assert materials[0] == materials[1] == materials[2]
    secret = stored(kube, namespace)
    assert material_of(secret.data) == materials[0]
    assert secret.metadata.labels["app.kubernetes.io/managed-by"] == "durable-agents"
    # A replica that starts later serves the same, and writes nothing.
    version = secret.metadata.resource_version
    assert await replicas[0].current() == materials[0]
    assert stored(kube, namespace).metadata.resource_version == version


async def test_a_certificate_for_other_names_is_renewed_with_its_ca_kept(
    kube: KubeEnv, namespace: str
) -> None:
    old = renewed(None, service_names("renamed-service", namespace))
    client.CoreV1Api(kube.api).create_namespaced_secret(
        namespace, {"metadata": {"name": SECRET}, "data": old.as_secret_data()}
    )
    keeper = WebhookCertificates(Kube(kube.api), namespace, SECRET, SERVICE)
    fresh = await keeper.current()
    assert fresh.ca == old.ca
    assert fresh.serving != old.serving
    assert renewal_reason(fresh, keeper.names) is None
    assert material_of(stored(kube, namespace).data) == fresh


async def test_a_secret_someone_broke_is_replaced(kube: KubeEnv, namespace: str) -> None:
    client.CoreV1Api(kube.api).create_namespaced_secret(
        namespace, {"metadata": {"name": SECRET}, "data": {TLS_CERT: base64.b64encode(b"junk").decode()}}
    )
    fresh = await WebhookCertificates(Kube(kube.api), namespace, SECRET, SERVICE).current()
    assert material_of(stored(kube, namespace).data) == fresh


@pytest.fixture
def configuration_name(kube: KubeEnv, namespace: str) -> Iterator[str]:
    name = f"test-webhooks-{namespace}"
    yield name
    api = client.AdmissionregistrationV1Api(kube.api)
    api.delete_mutating_webhook_configuration(name)
    api.delete_validating_webhook_configuration(name)


async def test_configurations_call_the_service_and_are_kept_current(
    kube: KubeEnv, namespace: str, configuration_name: str
) -> None:
    material = renewed(None, service_names(SERVICE, namespace))
    mutating, validating = admission.webhook_configurations(
        name=configuration_name,
        service=(namespace, SERVICE, 443),
        ca_pem=material.bundle_pem,
        namespace=namespace,
    )
    ours = Kube(kube.api)
    await admission.install_webhooks(ours, mutating, validating)
    api = client.AdmissionregistrationV1Api(kube.api)
    installed = api.read_validating_webhook_configuration(configuration_name)
    approve = next(w for w in installed.webhooks if w.name.startswith("approve."))
    assert approve.failure_policy == "Fail"
    called = approve.client_config.service
    assert (called.namespace, called.name) == (namespace, SERVICE)
    assert approve.client_config.url is None
    assert base64.b64decode(approve.client_config.ca_bundle) == material.bundle_pem

    # Every replica installs the same at start-up: already right, so nothing is written.
    version = installed.metadata.resource_version
    await admission.install_webhooks(ours, mutating, validating)
    assert api.read_validating_webhook_configuration(configuration_name).metadata.resource_version == version

    # Someone breaks the caBundle: the next install puts it back.
    broken = api.read_validating_webhook_configuration(configuration_name)
    other = renewed(None, service_names(SERVICE, namespace)).bundle_pem
    for hook in broken.webhooks:
        hook.client_config.ca_bundle = base64.b64encode(other).decode()
    api.replace_validating_webhook_configuration(configuration_name, broken)
    await admission.install_webhooks(ours, mutating, validating)
    restored = api.read_validating_webhook_configuration(configuration_name)
    assert {base64.b64decode(w.client_config.ca_bundle) for w in restored.webhooks} == {material.bundle_pem}


def test_a_webhook_has_exactly_one_way_to_be_reached() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        admission.webhook_configurations(name="x", ca_pem=b"", namespace=None)
