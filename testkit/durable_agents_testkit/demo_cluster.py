"""``make demo-cluster``: the demo's run with the operator installed by its chart on a real node.

What a platform team does, on this machine: ``make image`` (no registry), a control plane with one
node (kubelet, containerd, CNI, kube-proxy, scheduler: the node test bed), the image loaded into
the node's containerd, ``helm install`` from the local chart (two replicas serving the admission
webhook behind its Service), then the demo's run driven with ``kubectl``: it reads, asks, waits for
an event and for an approval given with ``kubectl agentrun approve`` (stamped by the in-cluster
webhook), applies its change once, completes. At the end the release is uninstalled, the bed torn
down and the machine checked to be as before. Needs root (namespaces, veth, cgroups, containerd).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from durable_agents import __version__
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.demo import approve, kubectl, patch_spec, prepare_namespace, say, step, timeline
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import find_repo_root
from durable_agents_testkit.localcluster.node import NodeTestBed
from durable_agents_testkit.operator_rights import opt_in_args
from durable_agents_testkit.runs import Runs

IMAGE = f"localhost/durable-agents:{__version__}"
RELEASE, OPERATOR_NS = "durable-agents", "durable-agents-system"


def shown(argv: list[str], *, name: str) -> None:
    say("    $ " + " ".join(shlex.quote(a) for a in [name, *argv]))


def diagnosis(bed: NodeTestBed, release: str = RELEASE, namespace: str = OPERATOR_NS) -> str:
    """What the operator's Pods are doing, for a failure message."""
    shown = []
    for args in (
        ("get", "pods", "-A", "-o", "wide"),
        ("-n", namespace, "describe", "pods"),
        ("-n", namespace, "logs", "-l", f"app.kubernetes.io/instance={release}", "--tail=30"),
    ):
        done = bed.kubectl(*args)
        shown.append(f"$ kubectl {' '.join(args)}\n{done.stdout}{done.stderr}")
    return "\n".join(shown)


def helm(bed: NodeTestBed, *args: str) -> None:
    shown(list(args), name="helm")
    argv = [str(bed.bin_dir / "helm"), "--kubeconfig", str(bed.kubeconfig_path), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"helm {args[0]} failed: {done.stderr.strip()}\n{diagnosis(bed)}")


def await_webhook_service(
    bed: NodeTestBed, namespace: str = OPERATOR_NS, within: float = Within.TAKEOVER
) -> None:
    """Wait until the API server reaches the webhook through its Service: a server-side dry run of
    the sample policy in ``namespace`` passes the policy webhook. ``helm install --wait`` waits for
    Ready Pods, not for kube-proxy on the node to carry a Service just made: until it does, the
    node answers the API server's call to the ClusterIP with no route ("network is unreachable")
    and every write through the webhook fails. Any other refusal fails at once."""
    policy = Path(__file__).resolve().parents[2] / "config/samples/agentpolicy-default.yaml"
    seen: list[str] = []

    def passes() -> bool:
        done = bed.kubectl("-n", namespace, "apply", "--dry-run=server", "-f", str(policy))
        if done.returncode == 0:
            return True
        seen[:] = [done.stderr.strip()]
        if "failed calling webhook" not in done.stderr:
            raise AssertionError(f"a dry run of {policy.name} in {namespace} was refused: {done.stderr}")
        return False

    try:
        eventually(passes, within, "the API server to reach the webhook through its Service")
    except TimeoutError as err:
        raise AssertionError(f"{err}; the last refusal: {seen[-1] if seen else '-'}") from None


def build_image(repo: Path, archive: Path) -> None:
    step("building the operator's image: make image (a debootstrap base, docker build --network none)")
    began = time.monotonic()
    built = subprocess.run(
        ["bash", str(repo / "hack/image.sh")], env={**os.environ, "IMAGE_SAVE": str(archive)}, check=False
    )
    if built.returncode != 0:
        raise SystemExit("make image failed: see its output above")
    say(f"    {IMAGE} built and saved in {time.monotonic() - began:.0f}s")


def demo_in_cluster(bed: NodeTestBed, repo: Path) -> None:
    assert bed.plane is not None
    env = KubeEnv.local(bed.plane)
    kc = [str(bed.bin_dir / "kubectl"), "--kubeconfig", str(bed.kubeconfig_path)]
    step("helm install from the local chart: two replicas, the admission webhook behind its Service")
    began = time.monotonic()
    helm(
        bed,
        "install", RELEASE, str(repo / "charts/durable-agents"), "--namespace", OPERATOR_NS,
        "--create-namespace", "--set", f"image.tag={__version__}", "--set", "image.pullPolicy=Never",
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    try:
        await_webhook_service(bed)
    except AssertionError as err:
        raise SystemExit(f"{err}\n{diagnosis(bed)}") from None
    say(f"    two replicas Ready in {time.monotonic() - began:.1f}s (webhook serving, caches synced)")
    say(kubectl(kc, "-n", OPERATOR_NS, "get", "pods", "-o", "wide").rstrip())
    say(kubectl(kc, "get", "validatingwebhookconfigurations").rstrip())

    ns = f"demo-{uuid.uuid4().hex[:4]}"
    step(f"namespace {ns}: a ConfigMap to read; the run's ServiceAccount may read it and write one")
    prepare_namespace(env, ns)
    step(f"namespace {ns} opts in: the operator may act as its ServiceAccounts there, nowhere else")
    say(kubectl(kc, *opt_in_args(ns, RELEASE, OPERATOR_NS)).rstrip())
    kubectl(kc, "-n", ns, "apply", "-f", str(repo / "config/samples/agentpolicy-default.yaml"))
    runs = Runs(env, ns)
    runs.await_webhook()
    step("applying the run (the in-cluster webhook admits and stamps it)")
    kubectl(kc, "-n", ns, "apply", "-f", str(repo / "config/samples/agentrun-rollout.yaml"))
    name = "rollout"
    parked = runs.wait_state(name, "waiting_input", timeout=120)
    question = parked["status"]["checkpoint"]["pendingInput"]["question"]
    shown_question = (
        "(sealed: kubectl agentrun status --reveal shows it)" if question.startswith("sealed:") else question
    )
    say(f"    parked in waiting_input: {shown_question}")
    step("answering the question, then delivering the event, by patching the run's spec")
    patch_spec(kc, ns, name, '{"spec":{"answers":{"confirm":"yes"}}}')
    runs.wait_state(name, "waiting_external", timeout=120)
    patch_spec(kc, ns, name, '{"spec":{"events":{"maintenance-window-open":"opened by the demo"}}}')
    approve(env, runs, ns, name)
    done = runs.wait_state(name, "completed", timeout=120)
    step("the run's transition timeline (status.history)")
    say(timeline(done))
    step("the action ledger: the change, applied once, by an operator Pod as the run's ServiceAccount")
    say(kubectl(kc, "-n", ns, "get", "actionrecords", "-o", "wide").rstrip())
    say(kubectl(kc, "-n", ns, "get", "agentruns", "-o", "wide").rstrip())
    say(f"\n    outcome: {done['status']['outcome']}")
    step("helm uninstall: the runs and the CRDs stay (kubectl get agentruns still lists the run)")
    helm(bed, "uninstall", RELEASE, "--namespace", OPERATOR_NS, "--wait")
    say(kubectl(kc, "-n", ns, "get", "agentruns").rstrip())


def main() -> int:
    repo = find_repo_root()
    if repo is None:
        raise SystemExit("run the demo from a checkout of durable-agents (make demo-cluster)")
    if sys.platform != "linux" or os.geteuid() != 0:
        raise SystemExit("make demo-cluster runs a real node (namespaces, veth, cgroups): run it as root")
    with tempfile.TemporaryDirectory() as work:
        archive = Path(work) / "image.tar"
        build_image(repo, archive)
        step("starting a control plane with one node (kubelet, containerd, CNI, kube-proxy, scheduler)")
        bed = NodeTestBed()
        try:
            bed.start()
            say(f"    node Ready in {bed.timings['ready_seconds']:.1f}s")
            bed.import_image(archive, IMAGE)
            say(f"    {IMAGE} loaded into the node's containerd (imagePullPolicy Never)")
            demo_in_cluster(bed, repo)
        finally:
            step("tearing the node down; the machine is checked to be as before")
            bed.stop()
            say(f"    torn down in {bed.timings.get('teardown_seconds', 0):.1f}s; the machine is as before")
    return 0


if __name__ == "__main__":
    sys.exit(main())
