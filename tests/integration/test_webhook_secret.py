"""The webhook's shared serving certificate and configurations on a real API server: replicas that
start together agree on one Secret, a Secret made for other names is renewed in place with its CA
kept, and the webhook configurations reach the webhook through a Service, are left alone when they
are already right (no write per replica) and are put back when someone breaks their caBundle. With
cert-manager issuing (the chart's webhook.certManager), the operator serves the issued Secret once
it fits the Service, and needs no more than to read it."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import pytest
from kubernetes import client, config

from durable_agents.shell.admission import registration
from durable_agents.shell.admission.certs import (
    TLS_CERT,
    CertificateNotIssued,
    IssuedCertificates,
    WebhookCertificates,
    material_of,
    renewal_reason,
    renewed,
    service_names,
)
from durable_agents.shell.ground.certs import generate_ca, issue_serving_cert
from durable_agents.shell.ground.kube import Kube
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.rbac import grant, rule

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
    mutating, validating = registration.webhook_configurations(
        name=configuration_name,
        service=(namespace, SERVICE, 443),
        ca_pem=material.bundle_pem,
        namespace=namespace,
    )
    ours = Kube(kube.api)
    await registration.install_webhooks(ours, mutating, validating)
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
    await registration.install_webhooks(ours, mutating, validating)
    assert api.read_validating_webhook_configuration(configuration_name).metadata.resource_version == version

    # Someone breaks the caBundle: the next install puts it back.
    broken = api.read_validating_webhook_configuration(configuration_name)
    other = renewed(None, service_names(SERVICE, namespace)).bundle_pem
    for hook in broken.webhooks:
        hook.client_config.ca_bundle = base64.b64encode(other).decode()
    api.replace_validating_webhook_configuration(configuration_name, broken)
    await registration.install_webhooks(ours, mutating, validating)
    restored = api.read_validating_webhook_configuration(configuration_name)
    assert {base64.b64decode(w.client_config.ca_bundle) for w in restored.webhooks} == {material.bundle_pem}


async def test_replicas_starting_together_all_install_the_configurations(
    kube: KubeEnv, namespace: str, configuration_name: str
) -> None:
    """What a chart install meets: configurations already there without the caBundle, and every
    replica replacing them at once. Each must succeed (one that lost the race reads the winner's
    write); a failure here failed the operator's start-up and left a replica never Ready."""
    material = renewed(None, service_names(SERVICE, namespace))
    wanted = registration.webhook_configurations(
        name=configuration_name,
        service=(namespace, SERVICE, 443),
        ca_pem=material.bundle_pem,
        namespace=namespace,
    )
    bare = registration.webhook_configurations(
        name=configuration_name, service=(namespace, SERVICE, 443), ca_pem=b"", namespace=namespace
    )
    await registration.install_webhooks(Kube(kube.api), *bare)
    for _ in range(5):  # the race, several times: each round starts from the bare configurations
        replicas = [Kube(kube.api) for _ in range(4)]
        await asyncio.gather(*(registration.install_webhooks(r, *wanted) for r in replicas))
        api = client.AdmissionregistrationV1Api(kube.api)
        stored_hooks = api.read_validating_webhook_configuration(configuration_name).webhooks
        assert {base64.b64decode(w.client_config.ca_bundle) for w in stored_hooks} == {material.bundle_pem}
        current = api.read_validating_webhook_configuration(configuration_name)
        for hook in current.webhooks:
            hook.client_config.ca_bundle = None
        api.replace_validating_webhook_configuration(configuration_name, current)


def test_a_webhook_has_exactly_one_way_to_be_reached() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        registration.webhook_configurations(name="x", ca_pem=b"", namespace=None)


def tls_secret(names: list[str]) -> dict[str, object]:
    """What cert-manager stores for a Certificate: a kubernetes.io/tls Secret with the CA."""
    ca = generate_ca("issuer-ca")
    leaf = issue_serving_cert(ca, names[0], names, [])
    data = {"tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem, "ca.crt": ca.cert_pem}
    return {
        "metadata": {"name": SECRET},
        "type": "kubernetes.io/tls",
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


@pytest.mark.local_plane("users")
async def test_a_secret_cert_manager_issued_is_served_once_it_fits_and_only_read(
    kube: KubeEnv, plane: LocalControlPlane, namespace: str
) -> None:
    reader = "webhook-cert-reader"  # the chart's Role with certManager: get on this one Secret
    grant(kube, namespace, reader, rule("", "secrets", "get", names=[SECRET]))
    api = config.new_client_from_config(config_file=str(plane.write_user_kubeconfig(reader, [])))
    issued = IssuedCertificates(Kube(api), namespace, SECRET, SERVICE)
    with pytest.raises(CertificateNotIssued, match="not issued yet"):
        await issued.current()
    core = client.CoreV1Api(kube.api)
    core.create_namespaced_secret(namespace, tls_secret(service_names("another-service", namespace)))
    with pytest.raises(CertificateNotIssued, match=rf"does not name .*{SERVICE}\.{namespace}\.svc"):
        await issued.current()
    waiting = asyncio.create_task(issued.wait(interval=0.1))
    right = tls_secret(service_names(SERVICE, namespace))
    core.replace_namespaced_secret(SECRET, namespace, right)
    material = await asyncio.wait_for(waiting, timeout=30)
    data = right["data"]
    assert isinstance(data, dict)
    assert material.serving.cert_pem == base64.b64decode(data["tls.crt"])
    assert material.bundle_pem == base64.b64decode(data["ca.crt"])  # the caBundle the operator keeps
    version = stored(kube, namespace).metadata.resource_version
    assert await issued.current() == material
    assert stored(kube, namespace).metadata.resource_version == version, "the operator wrote the Secret"
