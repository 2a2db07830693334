"""Stuck runs: each cause gets the ``Stuck`` condition, the metric and an Event within one check
interval, ``kubectl agentrun why`` names the fix, and removing the cause clears both.

One operator (check every second, a wait without expiry is stuck after 4 s) and five runs, each
stuck for its own cause at once: its AgentPolicy missing; an approval nobody may give (the policy's
verb is held by nobody); an MCP call whose answer was lost (MCP cannot be asked by key); a parent
waiting for a child run (no expiry, no deadline); a quarantine (its status forged). Then each cause
is removed: the policy created, the verb granted, the action reconciled, the child's question
answered, the quarantine retried.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.engine import child_run_name
from durable_agents.kubectl import why as kubectl_why
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import admitted
from durable_agents_testkit.mcpserver import McpServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port, metric, scrape

CHECK = 1.0  # seconds between passes of the stuck check
AFTER = 4  # seconds a wait without expiry lasts before it is stuck
SLACK = 3.0  # a loaded 2-core machine: a pass may start late and its write take a moment
KUBECTL_AGENTRUN = (sys.executable, "-m", "durable_agents.kubectl.main")
DONE = {"name": "done", "complete": {"result": "done"}}
REASONS = ("PolicyMissing", "NoApprover", "UnreconcilableOutcome", "WaitWithoutExpiry", "Quarantined")


def policy(runs: Runs, name: str, **spec: Any) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": name},
        "spec": {"version": "v1", **spec},
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)


def grant_children(kube: KubeEnv, namespace: str) -> None:
    """The runs' ServiceAccount may start child runs (they are made AS that account)."""
    children = rule(GROUP, "agentruns", "get", "create", "patch")
    grant(kube, namespace, service_account("default", namespace), children, name="start-children")


def grant_sign_off(kube: KubeEnv, namespace: str) -> None:
    grant(kube, namespace, "carol", rule(GROUP, "agentruns", "get", "sign-off"), name="signer")


def condition(run: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (run.get("status") or {}).get("conditions") or [] if c["type"] == "Stuck"), None)


def stuck(runs: Runs, name: str, reason: str, within: float = Within.COMMIT) -> dict[str, Any]:
    def marked() -> dict[str, Any] | None:
        run = runs.get(name)
        found = condition(run)
        return run if found and (found["status"], found["reason"]) == ("True", reason) else None

    return eventually(marked, within, f"run {name} to be Stuck ({reason})")


def unstuck(runs: Runs, name: str) -> dict[str, Any]:
    def cleared() -> dict[str, Any] | None:
        run = runs.get(name)
        found = condition(run)
        return run if found and found["status"] == "False" else None

    return eventually(cleared, Within.COMMIT, f"run {name}'s Stuck condition to clear")


def at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def noticed_within(run: dict[str, Any], since: str, delay: float = 0.0) -> None:
    """The condition was set within one check interval of its cause (at ``since`` + ``delay``)."""
    found = condition(run)
    assert found is not None
    late = at(found["lastTransitionTime"]) - (at(since) + delay)
    assert late <= CHECK + SLACK, f"{run['metadata']['name']}: Stuck set {late:.1f}s after its cause"


def gauge(port: int, reason: str) -> float:
    return metric(scrape(port), f'durable_agents_stuck_runs{{reason="{reason}"}}')


def why(runs: Runs, name: str) -> str:
    return kubectl_why.text(kubectl_why.why(runs.custom, runs.namespace, name))


def test_each_cause_marks_the_run_stuck_why_names_the_fix_and_removing_it_clears_it(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    ns = runs.namespace
    port = free_port()
    grant_children(kube, ns)
    policy(runs, "guarded", tiers={"http.post": "consequential"}, approvers={"verb": "sign-off"})
    policy(runs, "open", approvalRequiredTiers=[])
    with McpServerThread() as tickets:
        tickets.inject("drop_after_apply")
        start_operator(
            "stuck",
            3,
            DURABLE_AGENTS_METRICS_PORT=str(port),
            DURABLE_AGENTS_STUCK_CHECK_SECONDS=str(CHECK),
            DURABLE_AGENTS_STUCK_AFTER=f"{AFTER}s",
        )
        orphan = runs.create(
            {"taskType": "t", "objective": "o", "policyRef": {"name": "late"}, "steps": [DONE]}
        )
        pay = {"effect": "http.post", "target": {"url": f"{refsystem.url}/effects"}, "arguments": {"n": 1}}
        unapproved = runs.create(
            {
                "taskType": "t",
                "objective": "o",
                "policyRef": {"name": "guarded"},
                "steps": [{"name": "pay", "effect": pay}, DONE],
            }
        )
        close = {
            "effect": "mcp.call",
            "target": {"url": tickets.url, "tool": "close_ticket"},
            "arguments": {"id": "T-101", "resolution": "fixed"},
        }
        ticket = runs.create(
            {
                "taskType": "t",
                "objective": "o",
                "policyRef": {"name": "open"},
                "steps": [{"name": "close", "effect": close}, DONE],
            }
        )
        ask = {"name": "ask", "ask": {"question": "which one?", "expiresIn": "1h"}}
        child = {"name": "sub", "child": {"taskType": "sub", "objective": "o", "steps": [ask, DONE]}}
        parent = runs.create({"taskType": "t", "objective": "o", "steps": [child, DONE]})
        forged = runs.create({"taskType": "t", "objective": "o", "steps": [ask, DONE]})

        # --- each cause, noticed within one check interval -------------------------------------
        run = stuck(runs, orphan, "PolicyMissing")
        noticed_within(run, run["metadata"]["creationTimestamp"])
        assert f"kubectl apply -n {ns} -f <AgentPolicy late>" in why(runs, orphan)

        waiting = runs.wait_state(unapproved, "waiting_approval", timeout=Within.COMMIT)
        run = stuck(runs, unapproved, "NoApprover")
        noticed_within(run, waiting["status"]["stateSince"])
        said = why(runs, unapproved)
        assert "Stuck:            NoApprover" in said, said
        assert "--verb=sign-off --resource=agentruns.durable-agents.io" in said, said
        assert f"kubectl agentrun approve {unapproved} -n {ns}" in said, said

        run = stuck(runs, ticket, "UnreconcilableOutcome", Within.RUN)
        (action,) = [
            r
            for r in runs.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "actionrecords")["items"]
            if r["spec"]["runRef"]["name"] == ticket
        ]
        said = why(runs, ticket)
        record = action["metadata"]["name"]
        fix = f"kubectl agentrun reconcile {ticket} -n {ns} --action {record} --applied|--not-applied"
        assert fix in said, said

        waiting = runs.wait_state(parent, "waiting_external", timeout=Within.COMMIT)
        run = stuck(runs, parent, "WaitWithoutExpiry")
        noticed_within(run, waiting["status"]["stateSince"], AFTER)
        sub = child_run_name(parent, "sub")
        said = why(runs, parent)
        assert f"kubectl agentrun why {sub} -n {ns}" in said, said
        assert "Expires:          never (no expiry, no deadline)" in said, said
        assert condition(runs.wait_state(sub, "waiting_input")) is None, "the child's wait expires: not stuck"

        asked = runs.wait_state(forged, "waiting_input", timeout=Within.COMMIT)
        eventually(
            lambda: "finalizers" in runs.get(forged)["metadata"], Within.COMMIT, "the retention finalizer"
        )
        current = runs.get(forged)
        current["status"]["stateVersion"] += 1  # written by someone other than the operator
        client.CustomObjectsApi(kube.api).replace_namespaced_custom_object_status(
            GROUP, VERSION, ns, "agentruns", forged, current
        )
        quarantined = runs.wait_state(forged, "quarantined", timeout=Within.COMMIT)
        run = stuck(runs, forged, "Quarantined")
        noticed_within(run, quarantined["status"]["stateSince"])
        assert f"kubectl agentrun retry {forged} -n {ns}" in why(runs, forged)
        assert asked

        # The gauge is set at the end of the pass that wrote the last condition: await that pass.
        def gauges_counted() -> str | None:
            text = scrape(port)
            counted = all(metric(text, f'durable_agents_stuck_runs{{reason="{r}"}}') == 1 for r in REASONS)
            return text if counted else None

        text = eventually(gauges_counted, Within.COMMIT, "the gauge of the pass that wrote the conditions")
        for reason in REASONS:
            assert metric(text, f'durable_agents_stuck_runs{{reason="{reason}"}}') == 1, reason
            assert metric(text, f'durable_agents_stuck_detections_total{{reason="{reason}"}}') == 1, reason
        events = runs.wait_event(orphan, "Stuck")
        assert [e.type for e in events] == ["Warning"], "one Event when it became stuck"
        assert "AgentPolicy 'late'" in events[0].message

        # The plugin itself: -o json, and a clear error for a run that is not there.
        out = subprocess.run(
            [
                *KUBECTL_AGENTRUN,
                "why",
                unapproved,
                "-n",
                ns,
                "-o",
                "json",
                "--kubeconfig",
                str(kube.kubeconfig),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        answer = json.loads(out.stdout)
        assert answer["stuck"]["reason"] == "NoApprover"
        assert answer["lastTransition"]["to"] == "waiting_approval"
        assert answer["expiresAt"] is not None, "an approval request expires"
        missing = subprocess.run(
            [*KUBECTL_AGENTRUN, "why", "no-such-run", "-n", ns, "--kubeconfig", str(kube.kubeconfig)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert missing.returncode == 1
        assert f"agentrun 'no-such-run' not found in namespace '{ns}'" in missing.stderr

        # --- each cause removed: the condition clears, and the gauge with it --------------------
        policy(runs, "late")
        grant_sign_off(kube, ns)
        name = action["metadata"]["name"]
        old = runs.get(ticket)
        attempt = runs.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "actionrecords", name)[
            "status"
        ]["attempts"]
        entry = {"applied": True, "attempt": attempt, "reason": "the ticket shows closed"}
        new = {**old, "spec": {**old["spec"], "reconciliations": {name: entry}}}
        stamped = admitted("UPDATE", new, old)
        runs.custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, "agentruns", ticket, {"spec": {"reconciliations": {name: entry}, **stamped}}
        )
        runs.patch_spec(sub, {"answers": {"ask": "that one"}})
        runs.patch_spec(forged, {"retryQuarantine": "after-review"})

        for name in (orphan, unapproved, ticket, parent, forged):
            unstuck(runs, name)
        assert runs.wait_state(orphan, "completed", timeout=Within.COMMIT)
        assert runs.wait_state(ticket, "completed", timeout=Within.COMMIT)
        assert runs.wait_state(parent, "completed", timeout=Within.COMMIT)
        assert runs.state(unapproved) == "waiting_approval", "still waiting: now someone can approve it"
        assert runs.state(forged) == "waiting_input"
        assert "Stuck:            no" in why(runs, unapproved)
        eventually(
            lambda: all(gauge(port, reason) == 0 for reason in REASONS), Within.MOMENT, "the gauges back to 0"
        )
