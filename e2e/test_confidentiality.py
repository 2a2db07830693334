"""Sensitive values are sealed for real: what people write into a run (a question, effect
arguments, an answer, an event) and what an effect answers (its response) are sealed by the
operator before the API server stores them, so neither etcd (read directly, with the plane's client
certificate) nor a viewer of the API ever sees them in clear; the effect still receives them.

The operator runs as the chart's identity with its admission webhook on; the run is created,
answered and approved with raw writes (no test-kit stamping or sealing): the webhook does it all.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.sealed_values import (
    DATA_KEY_ANNOTATION,
    is_sealed,
    open_data_key,
    outcome_label,
    unseal_value,
)
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import session_keyring
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread, receipt_for
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

TOKEN_REF = {"name": "payment-token", "key": "token"}


def _role(kube: KubeEnv, namespace: str, user: str, rules: list[dict[str, Any]]) -> client.ApiClient:
    grant(kube, namespace, user, rules)
    return kube.user_client(user, [])


def _everything_a_viewer_reads(viewer: client.ApiClient, namespace: str) -> str:
    custom, core = client.CustomObjectsApi(viewer), client.CoreV1Api(viewer)
    listed = [
        custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
        for plural in ("agentruns", "actionrecords", "agentpolicies")
    ]
    events = core.list_namespaced_event(namespace).to_dict()
    return json.dumps([listed, events], default=str)


@pytest.mark.local_plane("etcd", "webhook")
def test_sealed_values_are_nowhere_in_clear_in_etcd_or_to_a_viewer(
    kube: KubeEnv,
    plane: LocalControlPlane,
    runs: Runs,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    refsystem: ReferenceSystemThread,
) -> None:
    marker = f"zs{uuid.uuid4().hex[:12]}"
    question, argument, answer, event = (
        f"{marker}-{what}" for what in ("question", "argument", "answer", "event")
    )
    reads = {
        "apiGroups": [GROUP],
        "resources": ["agentruns", "actionrecords", "agentpolicies"],
        "verbs": ["get", "list"],
    }
    viewer = _role(
        kube, namespace, "vera", [reads, {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}]
    )
    approver_rules = {"apiGroups": [GROUP], "resources": ["agentruns"], "verbs": ["get", "patch", "approve"]}
    approver = _role(kube, namespace, "alice", [approver_rules])
    policy = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "payments"},
        "spec": {
            "version": "v1",
            "tiers": {"http.post": "consequential"},
            "approvalRequiredTiers": ["consequential"],
            "approvalExpiry": "1h",
        },
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", policy)
    token = f"{marker}-token"
    core = client.CoreV1Api(kube.api)
    for secret in (TOKEN_REF["name"], "not-for-runs"):
        core.create_namespaced_secret(
            namespace, {"metadata": {"name": secret}, "stringData": {"token": token}}
        )
    # The run's ServiceAccount may read the one Secret it uses by reference, and no other.
    reads_token = rule("", "secrets", "get", names=[TOKEN_REF["name"]])
    grant(kube, namespace, service_account("default", namespace), reads_token, name="token-reader")
    op = start_operator("sealing", 2, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()  # the run is written raw: the webhook stamps and seals it

    name = runs.create(
        {
            "taskType": "payment",
            "objective": "pay, sealed",
            "policyRef": {"name": "payments"},
            "steps": [
                {"name": "confirm", "ask": {"question": question}},
                {"name": "go", "await": {"event": "go"}},
                {
                    "name": "pay",
                    "effect": {
                        "effect": "http.post",
                        "target": {"url": f"{refsystem.url}/effects", "queryUrl": f"{refsystem.url}/effects"},
                        "arguments": {"memo": argument, "token": {"valueFrom": {"secretKeyRef": TOKEN_REF}}},
                    },
                },
                {"name": "done", "complete": {"result": "paid"}},
            ],
        },
        name="sealed",
        stamped=False,  # raw: the webhook stamps and seals
    )
    parked = runs.wait_state(name, "waiting_input")
    assert is_sealed(parked["status"]["checkpoint"]["pendingInput"]["question"])
    runs.patch_spec(name, {"answers": {"confirm": answer}}, stamped=False)
    runs.wait_state(name, "waiting_external")
    runs.patch_spec(name, {"events": {"go": event}}, stamped=False)
    request = runs.wait_state(name, "waiting_approval")["status"]["approvalRequest"]
    assert is_sealed(request["arguments"])
    decision = {
        "spec": {"approvals": {request["requestId"]: {"digest": request["digest"], "decision": "approve"}}}
    }
    client.CustomObjectsApi(approver).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentruns", name, decision
    )
    done = runs.wait_state(name, "completed")

    # The effect got the arguments in clear, exactly once.
    (key,) = refsystem.counts()
    assert refsystem.counts() == {key: 1}
    last = refsystem.system.last(key)
    assert last is not None
    assert last.body == {"memo": argument, "token": token}  # the reference read as the run's ServiceAccount
    receipt = receipt_for(key)

    # What the API server holds is sealed, and opens (with the operator's keys) to what was given.
    data_key = open_data_key(
        session_keyring(), done["metadata"]["annotations"][DATA_KEY_ANNOTATION], namespace, name
    )
    spec = done["spec"]
    assert unseal_value(data_key, spec["steps"][0]["ask"]["question"], "steps/confirm/question") == question
    assert unseal_value(data_key, spec["answers"]["confirm"], "answers/confirm") == answer
    assert unseal_value(data_key, spec["events"]["go"], "events/go") == event
    (record,) = runs.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "actionrecords")["items"]
    outcome = record["status"]["outcome"]
    assert is_sealed(outcome)
    assert unseal_value(data_key, outcome, outcome_label(record["metadata"]["name"]))["receipt"] == receipt

    (resolved,) = record["status"]["resolvedReferences"]
    assert resolved["path"] == "token"
    assert (resolved["secret"], resolved["key"]) == (TOKEN_REF["name"], TOKEN_REF["key"])
    assert resolved["resourceVersion"]
    assert resolved["digest"].startswith("hmac-sha256:")
    secrets = {
        "question": question,
        "argument": argument,
        "answer": answer,
        "event": event,
        "tool result": receipt,
        "secret by reference": token,
    }
    seen = _everything_a_viewer_reads(viewer, namespace)
    assert name in seen  # the viewer does read the run, its ledger and its Events
    assert {what for what, text in secrets.items() if text in seen} == set()

    stored = dict(plane.etcd_range("/"))  # the whole keyspace: Events, Leases, everything
    assert any(name.encode() in key.encode() for key in stored), "the run is not in etcd?"
    leaked = {
        key: [what for what, text in secrets.items() if text.encode() in value]
        for key, value in stored.items()
        if marker.encode() in value or receipt.encode() in value
    }
    assert leaked == {}, f"plain text in etcd: {leaked}"


def test_a_secret_its_service_account_may_not_read_fails_the_action_before_anything_is_sent(
    runs: Runs,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    refsystem: ReferenceSystemThread,
) -> None:
    client.CoreV1Api(runs.kube.api).create_namespaced_secret(
        namespace, {"metadata": {"name": "not-for-runs"}, "stringData": {"token": "x"}}
    )
    start_operator("references", 2)
    reference = {"valueFrom": {"secretKeyRef": {"name": "not-for-runs", "key": "token"}}}
    name = runs.create(
        {
            "taskType": "payment",
            "objective": "pay with a token the run may not read",
            "steps": [
                {
                    "name": "pay",
                    "effect": {
                        "effect": "http.post",
                        "target": {"url": f"{refsystem.url}/effects", "queryUrl": f"{refsystem.url}/effects"},
                        "arguments": {"token": reference},
                    },
                },
                {"name": "done", "complete": {}},
            ],
        }
    )

    def failed_record() -> dict[str, Any] | None:
        items = runs.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "actionrecords")["items"]
        done = [r for r in items if (r.get("status") or {}).get("state") == "failed"]
        return done[0] if done else None

    record = eventually(failed_record, Within.RUN, "the action to fail")
    assert record["status"]["reason"] == "SecretReferenceUnresolved"
    assert "may not read it" in record["status"]["message"]
    assert refsystem.counts() == {}  # nothing was sent
    assert runs.state(name) != "completed"
