"""The admission webhook as the chart runs it, on the local control plane: reached through a
Service (its certificate names the Service, not an address), the serving certificate shared by the
replicas through one Secret the operator makes, and a readiness probe that says ready only once the
webhook serves and the run cache has synced.

There is no node here, so the Service is an ExternalName one that points at loopback: the API
server resolves it, dials the operator, and checks the certificate against ``<service>.<ns>.svc``
exactly as it does for a Pod behind a ClusterIP Service."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from cryptography import x509
from kubernetes import client

from durable_agents.shell.admission.certs import material_of, service_names
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

SERVICE = "durable-agents-webhook"
SECRET = f"{SERVICE}-tls"
OPERATOR_USER = "durable-agents-operator"


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def grant_the_certificate_secret(kube: KubeEnv, namespace: str) -> None:
    """The chart's Role for the webhook's Secret (templates/webhook.yaml), bound to the operator."""
    rules = [rule("", "secrets", "create"), rule("", "secrets", "get", "update", names=[SECRET])]
    grant(kube, namespace, OPERATOR_USER, rules, name="webhook-tls")


@pytest.mark.local_plane("webhook")
def test_replicas_serve_the_webhook_behind_a_service_with_one_shared_certificate(
    kube: KubeEnv, namespace: str, runs: Runs, start_operator: Callable[..., OperatorProcess]
) -> None:
    grant_the_certificate_secret(kube, namespace)
    core = client.CoreV1Api(kube.api)
    service_port = free_port()
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": SERVICE},
            "spec": {"type": "ExternalName", "externalName": "localhost", "ports": [{"port": service_port}]},
        },
    )
    health = free_port()
    first = start_operator(
        "replica-1",
        DURABLE_AGENTS_WEBHOOK_PORT=str(service_port),
        DURABLE_AGENTS_WEBHOOK_SERVICE=SERVICE,
        DURABLE_AGENTS_WEBHOOK_SERVICE_PORT=str(service_port),
        DURABLE_AGENTS_HEALTH_PORT=str(health),
    )
    eventually(lambda: first.logged("admission webhook serving"), Within.COMMIT, "the webhook serving")
    eventually(
        lambda: http_status(f"http://127.0.0.1:{health}/readyz") == 200,
        Within.COMMIT,
        "/readyz answering 200",
    )
    assert http_status(f"http://127.0.0.1:{health}/healthz") == 200

    # The API server reaches the webhook through the Service: a create comes back stamped.
    runs.await_webhook()
    secret = core.read_namespaced_secret(SECRET, namespace)
    material = material_of(secret.data)
    assert material is not None, "the operator stored a complete serving certificate"
    san = material.serving.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert set(service_names(SERVICE, namespace)) <= set(san.value.get_values_for_type(x509.DNSName))
    admission = client.AdmissionregistrationV1Api(kube.api)
    name = f"durable-agents-{namespace}"
    validating = admission.read_validating_webhook_configuration(name)
    hooks = [w for w in validating.webhooks if w.name.startswith("approve.")]
    assert [(h.client_config.service.name, h.client_config.service.port) for h in hooks] == [
        (SERVICE, service_port)
    ]
    assert all(h.failure_policy == "Fail" for h in hooks)
    assert base64.b64decode(hooks[0].client_config.ca_bundle) == material.bundle_pem

    # A second replica shares the certificate: it writes neither the Secret nor the configurations.
    versions = (
        secret.metadata.resource_version,
        validating.metadata.resource_version,
        admission.read_mutating_webhook_configuration(name).metadata.resource_version,
    )
    second = start_operator(
        "replica-2",
        DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()),
        DURABLE_AGENTS_WEBHOOK_SERVICE=SERVICE,
        DURABLE_AGENTS_WEBHOOK_SERVICE_PORT=str(service_port),
    )
    eventually(
        lambda: second.logged("admission webhook serving"), Within.COMMIT, "the second replica serving"
    )
    assert (
        core.read_namespaced_secret(SECRET, namespace).metadata.resource_version,
        admission.read_validating_webhook_configuration(name).metadata.resource_version,
        admission.read_mutating_webhook_configuration(name).metadata.resource_version,
    ) == versions
    runs.await_webhook()  # still answered through the Service
    assert not first.logged("Traceback")
    assert not second.logged("Traceback")
