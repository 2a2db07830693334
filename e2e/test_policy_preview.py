"""Preview before merge: what a new AgentPolicy version will do to the runs waiting under the
current one is said before it is applied (``kubectl apply --dry-run=server`` warnings, ``kubectl
agentrun policy diff -o json``), and applying it does exactly that, run by run.

Six runs wait for approval under v1, with evidence from different reads: two read a ConfigMap
that stays as it was, two one that changes during the wait, two apply a ConfigMap (an effect v2
moves to the reversible tier). v2 changes freshness (policyChanged: immaterial, evidenceChanged:
refresh) and tiers. The policy author (the chart's ``policy-author`` verbs only: no read of
runs) asks for the preview; then v2 is applied for real, every request is approved, and what each
run does is compared with what was predicted for it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.test_approvals import decide, pending, people, policy_known
from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.kubectl import policy as kubectl_policy
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, group, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless, written_by_clients

__all__ = ["people"]  # a fixture, shared with test_approvals
pytestmark = pytest.mark.local_plane("users", "webhook")

RUNS = {
    "steady-1": "steady",
    "steady-2": "steady",
    "moving-1": "moving",
    "moving-2": "moving",
    "apply-1": "apply",
    "apply-2": "apply",
}
EXPECTED = {"steady": "staysValid", "moving": "needsRefreshedEvidence", "apply": "noLongerNeedsApproval"}


def policy_doc(version: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "payments"},
        "spec": {
            "version": version,
            "approvalRequiredTiers": ["consequential"],
            "approvalExpiry": "1h",
            **spec,
        },
    }


V1 = policy_doc(
    "v1",
    tiers={"http.post": "consequential", "kubernetes.apply": "consequential"},
    freshness={"evidenceChanged": "reapprove", "policyChanged": "reapprove"},
)
V2 = policy_doc(
    "v2",
    tiers={"http.post": "consequential", "kubernetes.apply": "reversible"},
    freshness={"evidenceChanged": "refresh", "policyChanged": "immaterial"},
)


def run_spec(kind: str, url: str, name: str) -> dict[str, Any]:
    read = "limits-moving" if kind == "moving" else "limits-steady"
    act: dict[str, Any] = {
        "effect": "http.post",
        "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
        "arguments": {"amount": 120, "currency": "EUR", "run": name},
    }
    if kind == "apply":
        made = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"made-by-{name}"},
            "data": {"k": "v"},
        }
        act = {"effect": "kubernetes.apply", "arguments": {"object": made}}
    return {
        "taskType": "payment",
        "objective": "pay the invoice",
        "policyRef": {"name": "payments"},
        "steps": [
            {
                "name": "read-limits",
                "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": read}},
            },
            {"name": "pay", "effect": act},
            {"name": "done", "complete": {"result": "paid"}},
        ],
    }


def what_it_did(run: dict[str, Any]) -> str:
    """What the run did after its approval was taken in, in the preview's words."""
    history = assert_history_is_gapless(run)
    after = history[[h["event"] for h in history].index("approval_decided") + 1]
    if after["event"] == "reapproval_required":
        return "needsReapproval"
    if after["event"] == "refresh_required":
        return "needsRefreshedEvidence"
    if after["event"] == "revalidated" and "no longer needs approval" in after.get("detail", ""):
        return "noLongerNeedsApproval"
    if after["event"] == "revalidated":
        return "staysValid"
    return f"{after['event']}: {after.get('detail', '')}"


@pytest.fixture
def author(kube: KubeEnv, plane: LocalControlPlane, namespace: str) -> Path:
    """paula, with the chart's policy-author verbs (agentpolicies only: she may not read runs)."""
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    grant(
        kube, namespace, group("policy-authors"), rule(GROUP, "agentpolicies", *verbs), name="policy-author"
    )
    return plane.write_user_kubeconfig("paula", ["policy-authors"])


def test_the_preview_predicts_what_the_new_version_does_run_by_run(
    kube: KubeEnv,
    plane: LocalControlPlane,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
    author: Path,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(kube.api)
    for cm in ("limits-steady", "limits-moving"):
        core.create_namespaced_config_map(runs.namespace, {"metadata": {"name": cm}, "data": {"max": "100"}})
    sa = service_account("default", runs.namespace)
    grant(kube, runs.namespace, sa, rule("", "configmaps", "get", "create", "patch"), name="preview-runs")
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", V1)
    op = webhook_operator()
    policy_known(op, runs, "v1")
    for name, kind in RUNS.items():
        runs.create(run_spec(kind, refsystem.url, name), name=name)
    requests = {name: pending(runs, name) for name in RUNS}
    assert {r["policyVersion"] for r in requests.values()} == {"v1"}
    # Evidence from different reads: one ConfigMap changes during the wait, the other does not.
    core.patch_namespaced_config_map("limits-moving", runs.namespace, {"data": {"max": "5"}})

    # The dry run a CI job runs: kubectl itself, as the policy author. Nothing is stored.
    paula = client.CustomObjectsApi(client.ApiClient(_config(author)))
    stored = paula.get_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", "payments")
    file = tmp_path / "payments-v2.yaml"
    file.write_text(yaml.safe_dump({**V2, "metadata": {"name": "payments", "namespace": runs.namespace}}))
    kubectl = plane.bin_dir / "kubectl"  # the kubectl of the plane's Kubernetes release
    done = subprocess.run(
        [str(kubectl), "--kubeconfig", str(author), "apply", "--dry-run=server", "-f", str(file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    said = done.stderr
    assert (
        "policy preview " + f"{runs.namespace}/payments v1 -> v2: 6 run(s) under it; waiting approvals: "
        "2 stay valid, 0 need re-approval, 2 need refreshed evidence, 0 expire, 2 no longer need approval; "
        "pending actions: 0 newly need approval; refused: 0"
    ) in said, said
    dry_run = {name: _predicted_in(said, name) for name in RUNS}
    assert dry_run == {name: EXPECTED[kind] for name, kind in RUNS.items()}, said
    assert "EUR" not in said, "no argument (sealed) in the preview"
    assert "amount" not in said, "no argument (sealed) in the preview"

    # The same, per run, as JSON (kubectl agentrun policy diff -o json): a server-side dry run too.
    # (In a process of its own, as kubectl runs a plugin: it loads the author's kubeconfig.)
    plugin = [sys.executable, "-m", "durable_agents.kubectl.main", "policy", "diff", "-f", str(file)]
    out = subprocess.run(
        [*plugin, "-o", "json", "--kubeconfig", str(author)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    diff = json.loads(out.stdout)
    assert diff["policy"] == f"{runs.namespace}/payments"
    assert diff["summary"] in said
    predicted = {r["name"]: r["prediction"] for r in diff["runs"]}
    assert predicted == dry_run
    assert {r["name"]: r["requestId"] for r in diff["runs"]} == {
        n: r["requestId"] for n, r in requests.items()
    }
    after = paula.get_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", "payments")
    # (the operator writes the policy's status meanwhile: the object as clients wrote it is compared)
    assert written_by_clients(after) == written_by_clients(stored), "dry runs store nothing"
    assert refsystem.counts() == {}
    assert op.logged(f"policy preview of {runs.namespace}/payments: 6 run(s) under it, from a LIST")

    # v2 for real (the real apply carries the same warnings), then every request is approved.
    # (a replace under the resourceVersion read: the operator's status writes may move it first)
    def replace_with_v2() -> Any:
        current = paula.get_namespaced_custom_object(
            GROUP, VERSION, runs.namespace, "agentpolicies", "payments"
        )
        body = {
            **V2,
            "metadata": {"name": "payments", "resourceVersion": current["metadata"]["resourceVersion"]},
        }
        try:
            return paula.replace_namespaced_custom_object_with_http_info(
                GROUP, VERSION, runs.namespace, "agentpolicies", "payments", body
            )
        except ApiException as err:
            if err.status != 409:
                raise
            return None

    replaced = eventually(replace_with_v2, Within.COMMIT, "v2 replaced under a current resourceVersion")
    _, _, headers = replaced
    real = kubectl_policy.parse(kubectl_policy.warnings_of(headers))
    assert {r["name"]: r["prediction"] for r in real["runs"]} == predicted
    policy_known(op, runs, "v2")
    for name, request in requests.items():
        decide(people["alice"], runs, name, request["requestId"], request["digest"])
    ended = {name: runs.wait_state(name, "completed", timeout=Within.RUN) for name in RUNS}

    # Run by run: what each did is what was predicted for it.
    assert {name: what_it_did(run) for name, run in ended.items()} == predicted
    sent = refsystem.counts()
    assert sorted(sent.values()) == [1, 1, 1, 1], f"each payment sent once: {sent}"
    for name, kind in RUNS.items():
        events = [h["event"] for h in ended[name]["status"]["history"]]
        assert "reapproval_required" not in events, (name, events)
        if kind == "apply":
            assert core.read_namespaced_config_map(f"made-by-{name}", runs.namespace).data == {"k": "v"}
            actions = ended[name]["status"]["checkpoint"]["toolCalls"]
            assert [c["outcome"] for c in actions if c["tool"] == "kubernetes.apply"] == ["succeeded"]


def _predicted_in(stderr: str, name: str) -> str | None:
    """The prediction kubectl printed for run ``name`` (``Warning: policy preview run NAME: P (...)``)."""
    for line in stderr.splitlines():
        text = line.removeprefix("Warning: ")
        if text.startswith(f"{kubectl_policy.RUN_PREFIX}{name}: "):
            return text.split(": ", 2)[1].split(" ", 1)[0]
    return None


def _config(kubeconfig: Path) -> client.Configuration:
    from kubernetes import config

    conf = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=conf)
    return conf
