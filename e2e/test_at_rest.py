"""What etcd holds: the runs, the ledger and Secrets are encrypted by kube-apiserver before they are
stored (EncryptionConfiguration), and etcd itself speaks only TLS to clients with a certificate.

These tests read etcd directly, as someone holding the etcd client certificate (a backup, a
snapshot, a stolen disk) would, through etcd's gRPC gateway.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable

import pytest
from kubernetes import client

from durable_agents_testkit.localcluster.controlplane import ENCRYPTION_KEY_NAME, LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

pytestmark = pytest.mark.local_plane("etcd")


def test_etcd_refuses_clients_without_a_certificate(plane: LocalControlPlane) -> None:
    anonymous = ssl.create_default_context(cafile=str(plane.pki_paths.ca_cert))
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=anonymous)
    )
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        opener.open(plane.etcd_url + "/v3/kv/range", data=b'{"key": "Lw=="}', timeout=10)
    plain = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        plain.open(plane.etcd_url.replace("https://", "http://") + "/health", timeout=10)


def test_runs_the_ledger_and_secrets_are_encrypted_in_etcd(
    plane: LocalControlPlane,
    runs: Runs,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    refsystem: ReferenceSystemThread,
) -> None:
    marker = f"zq{uuid.uuid4().hex[:12]}"
    objective, argument, answer = f"{marker}-objective", f"{marker}-argument", f"{marker}-answer"
    client.CoreV1Api(runs.kube.api).create_namespaced_secret(
        namespace, {"metadata": {"name": "token"}, "stringData": {"token": f"{marker}-secret"}}
    )
    start_operator("at-rest")
    name = runs.create(
        {
            "taskType": "payment",
            "objective": objective,
            "steps": [
                {"name": "confirm", "ask": {"question": "pay?"}},
                {
                    "name": "pay",
                    "effect": {
                        "effect": "http.post",
                        "target": {"url": f"{refsystem.url}/effects", "queryUrl": f"{refsystem.url}/effects"},
                        "arguments": {"memo": argument},
                    },
                },
                {"name": "done", "complete": {"result": "paid"}},
            ],
        }
    )
    runs.wait_state(name, "waiting_input")
    runs.patch_spec(name, {"answers": {"confirm": answer}})
    runs.wait_state(name, "completed")
    assert sum(refsystem.counts().values()) == 1

    stored = dict(plane.etcd_range("/registry/"))
    encrypted_prefix = f"k8s:enc:aescbc:v1:{ENCRYPTION_KEY_NAME}:".encode()
    for kind in ("durable-agents.io/agentruns", "durable-agents.io/actionrecords", "secrets"):
        keys = [k for k in stored if k.startswith(f"/registry/{kind}/{namespace}/")]
        assert keys, f"no {kind} of the test namespace found in etcd"
        for key in keys:
            assert stored[key].startswith(encrypted_prefix), f"{key} is stored in plain text"
    leaked = {
        key: [text for text in (objective, argument, answer, f"{marker}-secret") if text.encode() in value]
        for key, value in stored.items()
        if marker.encode() in value
    }
    assert leaked == {}, f"plain text in etcd: {leaked}"
