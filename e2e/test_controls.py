"""The on-call controls: ``kubectl agentrun list``, ``reconcile RUN`` (ask now), ``escalate``.

Real users (client certificates minted by the local control plane), RBAC made by the test (carol
holds the chart's on-call role, read from charts/durable-agents/files/user-roles.yaml; dave may
read and patch runs but holds neither ``reconcile`` nor ``escalate``; erin holds nothing), the
operator's admission webhook. The plugin runs in-process (``kubectl_plugin.main``) with the user's
kubeconfig; stdout, stderr and the exit code are what is checked.

The run's payment is applied and its answer lost; its query endpoint (a small server of the test)
answers 503 until the test opens it, so the outcome stays unknown and the dispatcher asks at a
doubling pace. "Ask now" must get the answer at once, not at the next paced query.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents.kubectl import main as kubectl_plugin
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port, metric, scrape_when

LEASE = 2
USER_ROLES = Path(__file__).resolve().parents[1] / "charts/durable-agents/files/user-roles.yaml"


class Gate:
    """An authoritative system's query endpoint that cannot answer (503) until opened."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.asked = 0
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                gate.asked += 1
                status, body = (200, {"receipt": "r-1"}) if gate.open.is_set() else (503, {"error": "down"})
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/effects"


@pytest.fixture
def gate() -> Iterator[Gate]:
    made = Gate()
    thread = threading.Thread(target=made.server.serve_forever, daemon=True)
    thread.start()
    yield made
    made.server.shutdown()


@pytest.fixture
def kubeconfigs(kube: KubeEnv, plane: LocalControlPlane, namespace: str) -> dict[str, str]:
    """carol: the chart's on-call role; dave: reads and patches runs, no custom verb; erin: nothing."""
    on_call = yaml.safe_load(USER_ROLES.read_text())["roles"]["on-call"]["rules"]
    grant(kube, namespace, "carol", on_call)
    grant(
        kube,
        namespace,
        "dave",
        [rule(GROUP, "agentruns", "get", "list", "patch"), rule(GROUP, "actionrecords", "get", "list")],
    )
    return {user: str(plane.write_user_kubeconfig(user, [])) for user in ("carol", "dave", "erin")}


def agentrun(kubeconfig: str, *args: str) -> tuple[int, str, str]:
    """``kubectl agentrun ARGS`` in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = kubectl_plugin.main([*args, "--kubeconfig", kubeconfig])
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


def policy(runs: Runs) -> None:
    spec = {"version": "v1", "tiers": {"http.post": "consequential"}, "approvalRequiredTiers": []}
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "pay"},
        "spec": spec,
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)


def payment(url: str, query_url: str) -> dict[str, Any]:
    effect = {
        "effect": "http.post",
        "target": {"url": f"{url}/effects", "queryUrl": query_url},
        "arguments": {},
    }
    return {
        "taskType": "payment",
        "objective": "pay the invoice",
        "policyRef": {"name": "pay"},
        "steps": [{"name": "pay", "effect": effect}, {"name": "done", "complete": {"result": "paid"}}],
    }


def action_status(runs: Runs, name: str) -> dict[str, Any]:
    try:
        found = runs.custom.get_namespaced_custom_object(
            GROUP, VERSION, runs.namespace, "actionrecords", name
        )
    except client.ApiException:
        return {}
    return dict(found.get("status") or {})


def condition(run: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    conditions = (run.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == ctype), None)


@pytest.mark.local_plane("users", "webhook")
def test_list_reconcile_and_escalate_as_on_call_and_refused_without_the_verb(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    kubeconfigs: dict[str, str],
    refsystem: ReferenceSystemThread,
    gate: Gate,
) -> None:
    carol, dave, erin = kubeconfigs["carol"], kubeconfigs["dave"], kubeconfigs["erin"]
    ns = runs.namespace
    policy(runs)
    port = free_port()
    op = start_operator(
        "controls", LEASE, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()), DURABLE_AGENTS_METRICS_PORT=str(port)
    )
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()
    refsystem.inject("drop_after_apply", times=1)  # applied, and the answer lost: unknown
    run = runs.create(payment(refsystem.url, gate.url))
    action = action_record_name(idempotency_key(runs.get(run)["metadata"]["uid"], 0, "pay"))

    # Asked about at a doubling pace (1, 2, 4, 8 s): after the 4th answer, the next is 8 s away.
    eventually(
        lambda: action_status(runs, action).get("queries", 0) >= 4, Within.RUN, f"{action} queried 4 times"
    )
    runs.wait_state(run, "waiting_external", timeout=Within.COMMIT)

    # list: the queue, as kubectl prints it.
    code, out, err = agentrun(carol, "list", "-n", ns)
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["NAME", "STATE", "WAITING", "FOR", "AGE", "IN", "STATE", "REGION", "STUCK"]
    assert row.split()[:2] == [run, "waiting_external"], out
    code, out, err = agentrun(carol, "list", "-n", ns, "-o", "json")
    assert code == 0, err
    listed = json.loads(out)
    assert (listed["kind"], [i["metadata"]["name"] for i in listed["items"]]) == ("List", [run])
    code, out, err = agentrun(carol, "list", "-n", ns, "--state", "completed")
    assert (code, out, err) == (0, "", f"No resources found in {ns} namespace.\n")
    code, out, err = agentrun(erin, "list", "-n", ns)
    assert (code, out) == (1, "")
    assert f"""error: user 'erin' may not list agentruns in namespace '{ns}': needs verb 'list'""" in err
    code, out, err = agentrun(carol, "list", "-A")  # carol's role is bound in one namespace only
    assert (code, out) == (1, "")
    assert "error: user 'carol' may not list agentruns in any namespace: needs verb 'list'" in err

    # Without the custom verb: refused, and the message names it. Nothing is asked.
    code, out, err = agentrun(dave, "reconcile", run, "-n", ns)
    assert code == 1, out
    assert "user 'dave' may not reconcile" in err, err
    assert "needs verb 'reconcile'" in err, err
    code, out, err = agentrun(dave, "escalate", run, "-n", ns, "--reason", "payments team, look")
    assert code == 1, out
    assert "user 'dave' may not escalate" in err, err
    assert "needs verb 'escalate'" in err, err
    spec = runs.get(run)["spec"]
    assert not {"reconcileNow", "escalation"} & spec.keys(), "nothing was asked"

    # escalate: condition, Event, metric.
    code, out, err = agentrun(carol, "escalate", run, "-n", ns, "--reason", "the bank is down: call them")
    assert code == 0, err
    assert out.startswith(f"agentrun.{GROUP}/{run}: escalation escalate-"), out
    escalated = eventually(
        lambda: condition(runs.get(run), "Escalated"), Within.COMMIT, "condition Escalated"
    )
    assert (escalated["status"], escalated["reason"]) == ("True", "Escalated")
    assert escalated["message"] == "escalated by carol: the bank is down: call them"
    # The Event is recorded right after the commit that sets the condition: awaited, not raced.
    eventually(
        lambda: any(
            e.reason == "Escalated" and e.type == "Warning" and "carol" in e.message for e in runs.events(run)
        ),
        Within.COMMIT,
        "the Escalated Warning Event naming carol",
    )
    code, out, _ = agentrun(carol, "list", "-n", ns, "--escalated", "-o", "wide")
    assert code == 0, out
    assert out.splitlines()[1].split()[:2] == [run, "waiting_external"], out

    # reconcile RUN: the system answers now (opened), not at the next paced query (8 s away).
    asked = action_status(runs, action)["queries"]
    gate.open.set()
    code, out, err = agentrun(carol, "reconcile", run, "-n", ns, "--wait", "5s")
    assert code == 0, err
    assert "asked the authoritative system now (request ask-" in out, out
    assert f"about: {action}" in out, out
    assert f"  {action}: Applied" in out, out
    assert action_status(runs, action)["state"] == "succeeded"
    assert action_status(runs, action)["queries"] == asked + 1, "asked once more, now"
    done = runs.wait_state(run, "completed", timeout=Within.COMMIT)
    assert condition(done, "Escalated") is not None, "the run's commits keep the Escalated condition"
    code, out, err = agentrun(carol, "status", run, "-n", ns)
    assert code == 0, err
    assert "Escalated:   by carol at " in out, out
    assert "Asked now:   ask-" in out, out
    assert f"\n  {action}: Applied\n" in out, out
    assert refsystem.counts() == {idempotency_key(done["metadata"]["uid"], 0, "pay"): 1}

    text = scrape_when(
        port,
        {
            "durable_agents_escalations_total": 1,
            'durable_agents_reconcile_requests_total{answer="Applied"}': 1,
        },
    )
    assert metric(text, "durable_agents_escalations_total") == 1
    assert metric(text, "durable_agents_escalated_runs") == 1
    assert metric(text, 'durable_agents_reconcile_requests_total{answer="Applied"}') == 1
    assert metric(text, 'durable_agents_reconcile_requests_total{answer="Refused"}') == 0


def test_without_the_webhook_control_requests_written_by_hand_are_refused(
    start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    start_operator("no-webhook", LEASE)  # no DURABLE_AGENTS_WEBHOOK_PORT: nothing stamps
    spec = {"taskType": "e2e", "objective": "ask", "steps": [{"name": "q", "ask": {"question": "go?"}}]}
    run = runs.create(spec)
    runs.wait_state(run, "waiting_input", timeout=Within.COMMIT)
    forged = {"requestedBy": {"username": "carol"}, "requestedAt": "2026-01-01T00:00:00Z"}
    runs.patch_spec(
        run,
        {
            "escalation": {"token": "e1", "reason": "by hand", **forged},
            "reconcileNow": {"token": "a1", **forged},
        },
        stamped=False,
    )

    def refused() -> list[tuple[str, str, str]] | None:
        found = [
            (r["field"], r["key"], r["reason"]) for r in runs.get(run)["status"].get("refusedRequests") or []
        ]
        return found if len(found) == 2 else None

    assert sorted(eventually(refused, Within.COMMIT, "both requests refused")) == [
        ("escalation", "e1", "Unstamped"),
        ("reconcileNow", "a1", "Unstamped"),
    ]
    status = runs.get(run)["status"]
    assert condition(runs.get(run), "Escalated") is None
    assert not {"escalation", "reconcileNow"} & status.keys(), "nothing acted on"
    assert status["state"] == "waiting_input"
