"""`make demo` end to end: its own local control plane, operator, run, kubectl patches."""

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
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "kubectl -n demo-" in text
    assert "patch agentrun rollout " in text
    final = text[text.index("==> the completed run") :]
    assert "rollout   completed   15" in final
    assert "'result': 'new rollout strategy enabled'" in final
    ledger = text[text.index("==> the action ledger") : text.index("==> the completed run")]
    assert "succeeded   kubernetes.apply   consequential   1" in ledger
    assert '{"enabledBy":"durable-agents","maxSurge":"50%"}' in ledger
    timeline = text[text.index("transition timeline") : text.index("==> the action ledger")]
    assert "approver 'demo-approver'" in text
    assert "approve sent for request enable-strategy-1 (kubernetes.apply)" in text
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
