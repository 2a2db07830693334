"""``make demo``: the main job, start to finish, on the embedded local control plane.

Starts the local control plane (or uses the cluster named by KUBECONFIG), installs the CRDs,
starts the operator as its own user with the chart's RBAC rules, applies a run that reads a
ConfigMap, asks a question and waits for an event; answers both with ``kubectl patch`` (printing
each command), and prints the completed run and its transition timeline. Stops everything it
started.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from durable_agents_testkit.cluster import KubeEnv, install_crds
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane, find_repo_root
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.runs import Runs

OPERATOR_USER = "durable-agents-operator"


def say(text: str = "") -> None:
    print(text, flush=True)


def step(text: str) -> None:
    say(f"\n==> {text}")


@contextlib.contextmanager
def cluster() -> Iterator[tuple[KubeEnv, list[str]]]:
    """The demo's cluster and the kubectl command line to reach it."""
    external = os.environ.get("KUBECONFIG")
    if external:
        step(f"using the cluster of KUBECONFIG={external}")
        bin_dir = os.environ.get("DURABLE_AGENTS_BIN_DIR")
        kubectl = str(Path(bin_dir) / "kubectl") if bin_dir else shutil.which("kubectl") or "kubectl"
        yield KubeEnv.external(Path(external)), [kubectl, "--kubeconfig", external]
        return
    step("starting the embedded local control plane (etcd + kube-apiserver, built from Go modules)")
    with LocalControlPlane() as plane:
        env = KubeEnv.local(plane)
        say(f"    API server {plane.server_url}, ready in {plane.startup_seconds or 0:.1f}s")
        yield env, [str(plane.bin_dir / "kubectl"), "--kubeconfig", str(plane.kubeconfig_path)]


def kubectl(base: list[str], *args: str, show: bool = True) -> str:
    cmd = [*base, *args]
    if show:
        shown = ["kubectl", *args]
        say("    $ " + " ".join(shlex.quote(a) for a in shown))
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"kubectl failed: {out.stderr.strip()}")
    return out.stdout


def patch_spec(base: list[str], ns: str, name: str, patch: str) -> None:
    kubectl(base, "-n", ns, "patch", "agentrun", name, "--type=merge", "-p", patch)


def operator_kubeconfig(env: KubeEnv, repo: Path) -> Path:
    rules = yaml.safe_load((repo / "charts/durable-agents/files/operator-rules.yaml").read_text())
    rbac = client.RbacAuthorizationV1Api(env.api)
    with contextlib.suppress(client.ApiException):
        rbac.create_cluster_role({"metadata": {"name": OPERATOR_USER}, "rules": rules})
    with contextlib.suppress(client.ApiException):
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": OPERATOR_USER},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": OPERATOR_USER,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}
                ],
            }
        )
    if env.plane is None:
        return env.kubeconfig
    return Path(env.plane.write_user_kubeconfig(OPERATOR_USER, []))


def prepare_namespace(env: KubeEnv, ns: str) -> None:
    core = client.CoreV1Api(env.api)
    rbac = client.RbacAuthorizationV1Api(env.api)
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "rollout-settings"}, "data": {"maxSurge": "25%", "maxUnavailable": "0"}}
    )
    # The run acts as its ServiceAccount: it may read the settings and write one ConfigMap.
    configmaps: dict[str, Any] = {"apiGroups": [""], "resources": ["configmaps"]}
    rules = [
        {**configmaps, "verbs": ["get"], "resourceNames": ["rollout-settings", "rollout-strategy"]},
        {**configmaps, "verbs": ["patch"], "resourceNames": ["rollout-strategy"]},
        {**configmaps, "verbs": ["create"]},
    ]
    rbac.create_namespaced_role(ns, {"metadata": {"name": "rollout-agent"}, "rules": rules})
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "rollout-agent"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rollout-agent"},
            "subjects": [{"kind": "ServiceAccount", "name": "rollout-agent", "namespace": ns}],
        },
    )


def approve(env: KubeEnv, runs: Runs, ns: str, name: str) -> None:
    """The change is consequential (policy): a person allowed by RBAC approves it."""
    assert env.plane is not None
    parked = runs.wait_state(name, "waiting_approval", timeout=60)
    request = parked["status"]["approvalRequest"]
    step("the configuration change needs an approval: the request, bound to a digest")
    rbac = client.RbacAuthorizationV1Api(env.api)
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": "agentrun-approver"},
            "rules": [
                {
                    "apiGroups": ["durable-agents.io"],
                    "resources": ["agentruns"],
                    "verbs": ["get", "list", "patch", "approve"],
                }
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "agentrun-approvers"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agentrun-approver"},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "agentrun-approvers"}
            ],
        },
    )
    approver = env.plane.write_user_kubeconfig("demo-approver", ["agentrun-approvers"])
    plugin = [sys.executable, "-m", "durable_agents.kubectl_plugin"]
    for args in (["status", name, "-n", ns], ["approve", name, "-n", ns, "--reason", "window is open"]):
        say("    $ kubectl agentrun " + shlex.join(args) + "      # as user demo-approver")
        out = subprocess.run(
            [*plugin, *args],
            env={**os.environ, "KUBECONFIG": str(approver)},
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise SystemExit(out.stdout + out.stderr)
        say("\n".join("    " + line for line in out.stdout.rstrip().splitlines()))
    decided = runs.get(name)["spec"]["approvals"][request["requestId"]]
    say(
        f"    stamped by the admission webhook: approver {decided['approver']['username']!r} "
        f"at {decided['decidedAt']} (asked a SubjectAccessReview for verb approve)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timeline(run: dict[str, Any]) -> str:
    rows = [f"    {'VERSION':>7}  {'EVENT':<18} {'FROM':<18} {'TO':<18} DETAIL"]
    for h in run["status"]["history"]:
        moved = f"{h['event']:<18} {h['from']:<18} {h['to']:<18}"
        rows.append(f"    {h['stateVersion']:>7}  {moved} {h.get('detail', '')}")
    return "\n".join(rows)


def main() -> int:
    repo = find_repo_root()
    if repo is None:
        raise SystemExit("run the demo from a checkout of durable-agents (make demo)")
    ns = f"demo-{uuid.uuid4().hex[:4]}"
    with cluster() as (env, kc), tempfile.TemporaryDirectory() as logs:
        step("installing the CRDs (generated from the pydantic API types)")
        for name in install_crds(env.api, repo / "crds"):
            say(f"    {name}")
        step(f"namespace {ns}: a ConfigMap to read; the run's ServiceAccount may read it and write one")
        prepare_namespace(env, ns)
        kubectl(kc, "-n", ns, "apply", "-f", str(repo / "config/samples/agentpolicy-default.yaml"))
        if env.plane is None:
            say("    (this cluster's API server cannot reach a webhook on this machine's loopback:")
            say("     approvals are switched off for the demo; install the chart for the real thing)")
            kubectl(
                kc,
                "-n",
                ns,
                "patch",
                "agentpolicy",
                "default",
                "--type=merge",
                "-p",
                '{"spec":{"approvalRequiredTiers":[]}}',
            )

        step("starting the operator (its own user, bound to the chart's ClusterRole)")
        webhook_port = _free_port()
        extra = {"DURABLE_AGENTS_NAMESPACE": ns}
        if env.plane is not None:  # the API server must reach the webhook: on loopback here
            extra["DURABLE_AGENTS_WEBHOOK_PORT"] = str(webhook_port)
        op = OperatorProcess(
            operator_kubeconfig(env, repo),
            Path(logs),
            name="demo-operator",
            lease_duration=15,
            env=extra,
        ).start()
        if env.plane is not None:
            eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
        say(f"    operator {op.identity} (pid {op.pid}) is watching namespace {ns}")
        try:
            runs = Runs(env, ns)
            if env.plane is not None:
                runs.await_webhook()  # the run is applied with kubectl: the webhook stamps it
            step(
                "applying the run: read the settings, ask the on-call engineer, await the window, "
                "change the configuration once, complete"
            )
            kubectl(kc, "-n", ns, "apply", "-f", str(repo / "config/samples/agentrun-rollout.yaml"))
            name = "rollout"
            parked = runs.wait_state(name, "waiting_input", timeout=60)
            question = parked["status"]["checkpoint"]["pendingInput"]["question"]
            say(f"    the run is parked in waiting_input (no worker holds it): {question!r}")
            say(kubectl(kc, "-n", ns, "get", "agentruns", show=True).rstrip())

            step("answering the question by patching the run's spec")
            patch_spec(kc, ns, name, '{"spec":{"answers":{"confirm":"yes"}}}')
            runs.wait_state(name, "waiting_external", timeout=60)
            say("    the run resumed, and now waits for the event maintenance-window-open")

            step("delivering the external event")
            patch_spec(kc, ns, name, '{"spec":{"events":{"maintenance-window-open":"opened by the demo"}}}')
            if env.plane is not None:
                approve(env, runs, ns, name)
            done = runs.wait_state(name, "completed", timeout=60)

            step(
                "the run's transition timeline (status.history; stateVersion +1 per transition, "
                "written at semantic boundaries)"
            )
            say(timeline(done))
            cp = done["status"]["checkpoint"]
            ev = next(e for e in cp["evidence"] if e.get("source") == "kubernetes")
            say(
                f"\n    evidence: {ev['kind']}/{ev['name']} at resourceVersion {ev['resourceVersion']} "
                f"({ev['contentDigest'][:23]}...)"
            )
            step("the action ledger: the configuration change, applied once, as the run's ServiceAccount")
            say(kubectl(kc, "-n", ns, "get", "actionrecords", "-o", "wide").rstrip())
            say(
                kubectl(
                    kc,
                    "-n",
                    ns,
                    "get",
                    "configmap",
                    "rollout-strategy",
                    "-o",
                    "jsonpath={.data} key={.metadata.annotations.durable-agents\\.io/idempotency-key}",
                ).rstrip()
            )
            step("the completed run")
            say(kubectl(kc, "-n", ns, "get", "agentruns", "-o", "wide").rstrip())
            say(f"\n    outcome: {done['status']['outcome']}")
        finally:
            op.stop()
            if env.plane is None:
                client.CoreV1Api(env.api).delete_namespace(ns)
        step("stopped the operator" + ("" if env.plane is None else " and the local control plane"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
