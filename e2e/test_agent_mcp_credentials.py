"""MCP servers reached with credentials read as the run's ServiceAccount.

Real API server, the operator as a separate process exporting its spans to the test kit's OTLP
receiver, the reference model server and the reference MCP server requiring a bearer token (401
without it). The token is a key of a Secret that the run's ServiceAccount (and only it, through
the sample's Role) may read.

- The token is sent with the listing, the read-only call and the consequential call; rotated at the
  server and in the Secret while the run waits for approval, the next call uses the new one; no
  value of either token is in the operator's log, its spans, the namespace's Events, the run or the
  action record.
- An https server verified with a CA bundle from a ConfigMap the run's account reads (and the
  token from a Secret): the run completes; without the bundle it fails saying the certificate was
  not verified.
- A Secret the account may not read, a key the Secret lacks, or no token at all: the run fails
  with a reason naming the Secret and the account (or the server's refusal), never waits.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.test_agent import agent_namespace, approve, mcp_spec, model, trust_lookups
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.shell.ground.certs import generate_ca, issue_serving_cert
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within
from durable_agents_testkit.mcpserver import McpServerThread
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.otlp import OtlpReceiver
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

__all__ = ["agent_namespace", "model"]  # the fixtures, as test_agent.py defines them

TOKEN = "mcp-bearer-7d1e5a0c"
ROTATED = "mcp-bearer-rotated-93b2f4"
GRANTED, FORBIDDEN = "mcp-token", "mcp-forbidden"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def secret(kube: KubeEnv, namespace: str, name: str, token: str) -> None:
    body = client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data={"token": token})
    client.CoreV1Api(kube.api).create_namespaced_secret(namespace, body)


def grant(kube: KubeEnv, namespace: str, name: str, resource: str = "secrets") -> None:
    """The run's ServiceAccount (the sample Role's subject) may get ``name`` too."""
    rbac = client.RbacAuthorizationV1Api(kube.api)
    role = rbac.read_namespaced_role("refund-agent", namespace)
    role.rules.append(
        client.V1PolicyRule(api_groups=[""], resources=[resource], verbs=["get"], resource_names=[name])
    )
    rbac.replace_namespaced_role("refund-agent", namespace, role)


def bearer(name: str, key: str = "token") -> dict[str, Any]:
    return {"bearerTokenSecretRef": {"name": name, "key": key}}


def leaks(text: str) -> list[str]:
    return [token for token in (TOKEN, ROTATED) if token in text]


def test_a_bearer_token_from_a_secret_is_sent_rotated_and_never_shown(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    kube: KubeEnv,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    receiver: OtlpReceiver,
) -> None:
    secret(kube, agent_namespace, GRANTED, TOKEN)
    grant(kube, agent_namespace, GRANTED)
    with McpServerThread(bearer_token=TOKEN) as tickets:
        trust_lookups(runs, tickets)
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        op = start_operator("mcp-creds", **traced)
        name = runs.create(mcp_spec(model, refsystem, tickets, **bearer(GRANTED)))
        run = runs.wait_state(name, "waiting_approval", timeout=Within.RUN)
        turns = run["status"]["checkpoint"]["agent"]["turns"]
        assert (turns[0]["tool"], turns[0]["outcome"]) == ("lookup_ticket", "succeeded"), turns
        assert tickets.refused() == 0, "the listing and the read-only call carried the token"
        assert tickets.counts() == {}
        # Rotate at the server (the old token is refused from now on) and in the Secret.
        tickets.rotate_token(ROTATED)
        patch = {"data": {"token": base64.b64encode(ROTATED.encode()).decode()}}
        client.CoreV1Api(kube.api).patch_namespaced_secret(GRANTED, agent_namespace, patch)
        approve(runs, name)
        done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
        assert done["status"]["state"] == "completed", done["status"].get("outcome")
        counts = tickets.counts()
        assert list(counts.values()) == [1], f"applied once, with the rotated token: {counts}"
        # Nowhere to be seen: the operator's log, its spans, the Events, the run, the record.
        assert leaks(op.log_path.read_text()) == [], "a token is in the operator's log"
        spans = [span for trace in receiver.traces().values() for span in trace]
        assert spans, "the operator exported spans"
        assert leaks(json.dumps([span.texts() for span in spans] + [span.name for span in spans])) == []
        events = client.CoreV1Api(kube.api).list_namespaced_event(agent_namespace).items
        assert leaks(json.dumps([e.to_dict() for e in events], default=str)) == [], "a token is in an Event"
        assert leaks(json.dumps(runs.get(name))) == [], "a token is in the run"
        records = runs.custom.list_namespaced_custom_object(GROUP, VERSION, agent_namespace, "actionrecords")
        assert len(records["items"]) == 1
        assert leaks(json.dumps(records)) == [], "a token is in the action record"


# What the run names, and what its reason must say.
BAD = {
    "forbidden": (bearer(FORBIDDEN), "ServiceAccount {ns}/default may not read Secret {ns}/mcp-forbidden"),
    "missing-key": (bearer(GRANTED, "nope"), "Secret {ns}/mcp-token has no key 'nope'"),
    "no-token": ({}, "the server refused the request's credentials (HTTP 401)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_credentials_the_run_cannot_use_fail_it_with_a_reason(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    kube: KubeEnv,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    case: str,
) -> None:
    secret(kube, agent_namespace, GRANTED, TOKEN)
    grant(kube, agent_namespace, GRANTED)
    secret(kube, agent_namespace, FORBIDDEN, TOKEN)  # exists; the run's account may not read it
    server, expected = BAD[case]
    with McpServerThread(bearer_token=TOKEN) as tickets:
        op = start_operator("mcp-creds-bad")
        name = runs.create(mcp_spec(model, refsystem, tickets, **server))
        done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
        outcome = done["status"]["outcome"]
        assert done["status"]["state"] == "failed", outcome
        assert expected.format(ns=agent_namespace) in outcome["message"], outcome
        assert "MCP server 'tickets'" in outcome["message"], outcome
        assert tickets.counts() == {}, "nothing was applied"
        assert leaks(json.dumps(done) + op.log_path.read_text()) == []


@pytest.mark.parametrize("bundle", [True, False])
def test_an_https_server_is_verified_with_the_runs_ca_bundle(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    kube: KubeEnv,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    tmp_path: Path,
    bundle: bool,
) -> None:
    ca = generate_ca("tickets test CA")
    leaf = issue_serving_cert(ca, "tickets", ["localhost"], ["127.0.0.1"])
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(leaf.cert_pem)
    key.write_bytes(leaf.key_pem)
    secret(kube, agent_namespace, GRANTED, TOKEN)
    grant(kube, agent_namespace, GRANTED)
    config_map = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="tickets-ca"), data={"ca.crt": ca.cert_pem.decode()}
    )
    client.CoreV1Api(kube.api).create_namespaced_config_map(agent_namespace, config_map)
    grant(kube, agent_namespace, "tickets-ca", "configmaps")
    tls = {"tls": {"caConfigMapRef": {"name": "tickets-ca", "key": "ca.crt"}}} if bundle else {}
    with McpServerThread(bearer_token=TOKEN, tls=(cert, key)) as tickets:
        assert tickets.url.startswith("https://")
        trust_lookups(runs, tickets)
        start_operator("mcp-tls")
        name = runs.create(mcp_spec(model, refsystem, tickets, **bearer(GRANTED), **tls))
        if not bundle:
            done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
            outcome = done["status"]["outcome"]
            assert done["status"]["state"] == "failed", outcome
            assert "CERTIFICATE_VERIFY_FAILED" in outcome["message"], outcome
            assert tickets.http_requests() == 0, "no request reached the server unverified"
            return
        approve(runs, name)
        done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
        assert done["status"]["state"] == "completed", done["status"].get("outcome")
        assert list(tickets.counts().values()) == [1], tickets.counts()
        assert tickets.refused() == 0


def test_a_header_from_a_secret_is_sent_and_may_not_double_the_bearer_token(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    kube: KubeEnv,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    secret(kube, agent_namespace, GRANTED, f"Bearer {TOKEN}")  # the whole header's value
    grant(kube, agent_namespace, GRANTED)
    header = {"headers": [{"name": "Authorization", "secretKeyRef": {"name": GRANTED, "key": "token"}}]}
    with McpServerThread(bearer_token=TOKEN) as tickets:
        trust_lookups(runs, tickets)
        start_operator("mcp-header")
        name = runs.create(mcp_spec(model, refsystem, tickets, **header))
        run = runs.wait_state(name, "waiting_approval", timeout=Within.RUN)
        turns = run["status"]["checkpoint"]["agent"]["turns"]
        assert (turns[0]["tool"], turns[0]["outcome"]) == ("lookup_ticket", "succeeded"), turns
        assert tickets.refused() == 0, "the listing and the read-only call carried the header"
        both = runs.create(mcp_spec(model, refsystem, tickets, **header, **bearer(GRANTED)))
        done = runs.wait_state(both, "completed", "failed", timeout=Within.RUN)
        assert done["status"]["state"] == "failed", done["status"]["outcome"]
        assert (
            "sets both bearerTokenSecretRef and an Authorization header"
            in done["status"]["outcome"]["message"]
        )
        assert leaks(json.dumps([run, done])) == []
