"""`make demo` end to end: its own local control plane, operator, runs, kubectl patches: the scripted
rollout run, then a run driven by the model planner through the reference model server."""

from __future__ import annotations

import os
import subprocess
import sys

from durable_agents_testkit.cluster import KubeEnv


def test_demo_completes_the_run(kube: KubeEnv) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    if kube.plane is None:  # on an external cluster the demo runs there
        env["KUBECONFIG"] = str(kube.kubeconfig)
    out = subprocess.run(
        [sys.executable, "-m", "durable_agents_testkit.demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "kubectl -n demo-" in text
    assert "patch agentrun rollout " in text
    final = text[text.index("==> the completed run") : text.index("==> act 2")]
    assert "rollout   completed   15" in final
    assert "'result': 'new rollout strategy enabled'" in final
    ledger = text[text.index("==> the action ledger") : text.index("==> the completed run")]
    assert "succeeded   kubernetes.apply   consequential   1" in ledger
    assert '{"enabledBy":"durable-agents","maxSurge":"50%"}' in ledger
    timeline = text[text.index("transition timeline") : text.index("==> the action ledger")]
    assert "approver 'demo-approver'" in text
    assert "approve sent for request enable-strategy-1 (kubernetes.apply)" in text
    inbox = text.split("$ kubectl agentrun inbox", 1)[1].split("$ kubectl agentrun status", 1)[0]
    assert "enable-strategy-1" in inbox, "the approver's inbox lists the request"
    assert "--request enable-strategy-1 --digest sha256:" in inbox, "with the pinned command"
    assert [line.split()[1] for line in timeline.splitlines()[2:17]] == [
        "accepted",
        "step_completed",
        "input_requested",
        "input_received",
        "revalidated",
        "external_awaited",
        "external_received",
        "revalidated",
        "approval_requested",
        "approval_decided",
        "revalidated",
        "external_awaited",
        "external_received",
        "revalidated",
        "succeeded",
    ]

    agent = text[text.index("==> act 2") :]
    assert "secret/model-credentials created" in agent
    assert "sk-demo-" not in text, "the model server's API key is never printed"
    proposed = agent[agent.index("proposed a refund") : agent.index("==> approving")]
    assert "tool:            refund (model call call_" in proposed, "the model's proposed tool"
    assert "effect:          http.post (consequential)" in proposed
    assert "request:         agent-1-1, digest sha256:" in proposed
    assert "policy version:  2026-12-01.1" in proposed
    assert "evidence-0-agent-0  ConfigMap/refund-limits@" in proposed, "the evidence and its digest"
    assert "refunds at the reference system so far: 0" in proposed, "nothing is sent before the approval"
    assert '"orderId": "A-1042"' in proposed, "an approver sees the model's proposed arguments"
    assert "patch agentrun refund --type=merge" in agent
    assert "stamped by the admission webhook: approver 'demo-approver'" in agent
    assert "effects applied: 1 (key " in agent, "the refund is applied once at the reference system"
    ledger = [line.split() for line in agent.splitlines() if line.startswith("act-")]
    assert [row[1:6] for row in ledger if row[5] == "refund"] == [
        ["succeeded", "http.post", "consequential", "1", "refund"]
    ]
    facts = agent[agent.index("==> the agent's facts") : agent.index("==> the agent run's transition")]
    assert "model:           scripted-refunds" in facts
    assert "prompt digest:   sha256:" in facts
    assert "tool-set digest: sha256:" in facts
    turns = [line.split()[:3] for line in facts.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert turns == [["0", "read_limits", "succeeded"], ["1", "refund", "succeeded"]], facts
    assert "model calls:     3 recorded" in facts
    assert "3 served by the reference model server" in facts
    agent_timeline = agent[agent.index("==> the agent run's transition") :]
    rows = agent_timeline.split("\n\n")[0].splitlines()[2:]
    events = [row.split()[1] for row in rows]
    assert events[0] == "accepted", agent_timeline
    assert events[-1] == "succeeded", agent_timeline
    decided = events.index("approval_decided")
    assert events[decided - 1 : decided + 4] == [
        "approval_requested",
        "approval_decided",
        "revalidated",
        "external_awaited",
        "external_received",
    ], agent_timeline
    assert "approve agent-1-1 by demo-approver" in agent_timeline
    # The model's final answer is its output: sealed in the status, shown to the approver revealed.
    assert (
        'answer, model says (written by the model, not authority): "Refunded 120 EUR for order A-1042."'
        in agent_timeline
    )
