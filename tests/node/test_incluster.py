"""The operator installed by its chart on the node test bed, as a platform team installs it: the
image built here (``make image``) loaded into the node's containerd, ``helm install`` from the
local chart, two replicas serving the admission webhook behind its Service.

The demo's run in-cluster (reads, asks, waits for an event and for an approval given with
``kubectl agentrun approve`` through the in-cluster webhook, applies its change once); an approval
by someone without the verb refused by that webhook; the replica holding the run's shard deleted
with ``--force`` mid-run, another one taking over, the change applied once; ``helm uninstall``
leaving the runs and CRDs (and removing the webhook configurations), a reinstall resuming them;
``helm upgrade`` to a rebuilt image with the next version in the middle of 20 runs."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from durable_agents import __version__
from durable_agents.shell.ownership.shards import shard_lease_name, shard_of
from durable_agents_testkit import demo_cluster
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.demo import approver_kubeconfig, prepare_namespace
from durable_agents_testkit.eventually import eventually
from durable_agents_testkit.localcluster.node import NodeTestBed
from durable_agents_testkit.operator_rights import opt_in, opt_in_args
from durable_agents_testkit.rbac import grant
from durable_agents_testkit.rbac import rule as policy_rule
from durable_agents_testkit.runs import Runs

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts/durable-agents"
IMAGE = f"localhost/durable-agents:{__version__}"
RELEASE, OPERATOR_NS = "da", "durable-agents-system"
SHARDS = 16  # the chart's default
LEASE = 5  # seconds: the shard Leases of the region, so a takeover fits the test's bounds


def run(argv: list[str], timeout: float = 300, **env: str) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}, check=False
    )
    assert done.returncode == 0, f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def operator_image(node_bed: NodeTestBed, operator_image_archive: Path) -> str:
    """The operator's image (``make image``), loaded into the node's containerd."""
    node_bed.import_image(operator_image_archive, IMAGE)
    return IMAGE


def helm(bed: NodeTestBed, *args: str, timeout: float = 300) -> str:
    return run([str(bed.bin_dir / "helm"), "--kubeconfig", str(bed.kubeconfig_path), *args], timeout=timeout)


def diagnosis(bed: NodeTestBed) -> str:
    return demo_cluster.diagnosis(bed, RELEASE, OPERATOR_NS)


def install(bed: NodeTestBed, *extra: str) -> None:
    try:
        _install(bed, *extra)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{diagnosis(bed)}") from None


def _install(bed: NodeTestBed, *extra: str) -> None:
    helm(
        bed,
        "install", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--create-namespace",
        "--set", f"image.tag={__version__}", "--set", "image.pullPolicy=Never",
        "--set", f"leaseDurationSeconds={LEASE}",
        "--wait", "--timeout", "180s", *extra,
    )  # fmt: skip
    demo_cluster.await_webhook_service(bed, OPERATOR_NS)


@pytest.fixture(scope="module")
def env(node_bed: NodeTestBed) -> KubeEnv:
    assert node_bed.plane is not None
    return KubeEnv.local(node_bed.plane)


@pytest.fixture(scope="module")
def installed(node_bed: NodeTestBed, env: KubeEnv, operator_image: str) -> Iterator[float]:
    """The chart installed (two replicas Ready: webhook serving, caches synced); the seconds it took."""
    start = time.monotonic()
    install(node_bed)
    took = time.monotonic() - start
    print(f"\nhelm install to two Ready replicas: {took:.1f}s", flush=True)
    yield took
    subprocess.run(
        [str(node_bed.bin_dir / "helm"), "--kubeconfig", str(node_bed.kubeconfig_path), "uninstall", RELEASE,
         "--namespace", OPERATOR_NS, "--wait"],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture
def demo_ns(env: KubeEnv, installed: float) -> Iterator[str]:
    ns = f"demo-{uuid.uuid4().hex[:6]}"
    prepare_namespace(env, ns)
    opt_in(env, ns, RELEASE, OPERATOR_NS)  # managed: the chart's operator may act as its ServiceAccounts
    kubectl(env, "-n", ns, "apply", "-f", str(REPO / "config/samples/agentpolicy-default.yaml"))
    Runs(env, ns).await_webhook()
    yield ns
    client.CoreV1Api(env.api).delete_namespace(ns)


def kubectl(env: KubeEnv, *args: str, input: str | None = None) -> str:
    assert env.plane is not None
    done = env.plane.kubectl(*args, input=input)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return str(done.stdout)


def agentrun(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl agentrun`` (the plugin) as the user of ``kubeconfig``."""
    return subprocess.run(
        [sys.executable, "-m", "durable_agents.kubectl.main", *args],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def operator_pods(env: KubeEnv) -> list[Any]:
    pods = client.CoreV1Api(env.api).list_namespaced_pod(
        OPERATOR_NS, label_selector=f"app.kubernetes.io/instance={RELEASE}"
    )
    return [p for p in pods.items if p.metadata.deletion_timestamp is None]


def ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ())


def patch_spec(env: KubeEnv, ns: str, name: str, spec: dict[str, Any]) -> None:
    """A person's ``kubectl patch`` of the run's spec: the in-cluster webhook stamps and seals it."""
    kubectl(env, "-n", ns, "patch", "agentrun", name, "--type=merge", "-p", json.dumps({"spec": spec}))


def start_rollout(env: KubeEnv, ns: str) -> tuple[Runs, str]:
    runs = Runs(env, ns)
    kubectl(env, "-n", ns, "apply", "-f", str(REPO / "config/samples/agentrun-rollout.yaml"))
    runs.wait_state("rollout", "waiting_input", timeout=60)
    patch_spec(env, ns, "rollout", {"answers": {"confirm": "yes"}})
    runs.wait_state("rollout", "waiting_external", timeout=60)
    return runs, "rollout"


def applied_once(env: KubeEnv, ns: str) -> None:
    records = client.CustomObjectsApi(env.api).list_namespaced_custom_object(
        "durable-agents.io", "v1alpha1", ns, "actionrecords"
    )["items"]
    assert len(records) == 1, [r["metadata"]["name"] for r in records]
    assert records[0]["status"]["state"] == "succeeded", records[0]["status"]
    assert records[0]["status"]["attempts"] == 1
    strategy = client.CoreV1Api(env.api).read_namespaced_config_map("rollout-strategy", ns)
    assert (
        strategy.metadata.annotations["durable-agents.io/idempotency-key"]
        == records[0]["spec"]["idempotencyKey"]
    )


def approve(env: KubeEnv, runs: Runs, ns: str, name: str) -> dict[str, Any]:
    parked = runs.wait_state(name, "waiting_approval", timeout=60)
    request = parked["status"]["approvalRequest"]  # the request the approver reviewed
    request_id = request["requestId"]
    pinned = ("--request", request_id, "--digest", request["digest"])
    answer = agentrun(
        approver_kubeconfig(env, ns), "approve", name, "-n", ns, *pinned, "--reason", "in-cluster test"
    )
    assert answer.returncode == 0, answer.stdout + answer.stderr
    decided = runs.get(name)["spec"]["approvals"][request_id]
    assert decided["approver"]["username"] == "demo-approver"  # stamped by the in-cluster webhook
    return decided


def test_the_chart_serves_the_webhook_through_its_service(env: KubeEnv, installed: float) -> None:
    pods = operator_pods(env)
    assert len(pods) == 2
    assert all(ready(p) for p in pods)
    for pod in pods:  # restricted: non-root, read-only root filesystem
        container = pod.spec.containers[0]
        assert container.security_context.read_only_root_filesystem is True
        assert pod.spec.security_context.run_as_non_root is True
    webhooks = client.AdmissionregistrationV1Api(env.api).read_validating_webhook_configuration(
        "durable-agents"
    )
    approve_hook = next(w for w in webhooks.webhooks if w.name.startswith("approve."))
    assert approve_hook.client_config.service.name == f"{RELEASE}-durable-agents-webhook"
    assert approve_hook.client_config.ca_bundle, "the operator filled in the caBundle"
    assert webhooks.metadata.labels["app.kubernetes.io/instance"] == RELEASE


def test_the_demo_run_in_cluster_with_an_approval_through_the_webhook(env: KubeEnv, demo_ns: str) -> None:
    runs, name = start_rollout(env, demo_ns)
    patch_spec(env, demo_ns, name, {"events": {"maintenance-window-open": "opened by the test"}})
    approve(env, runs, demo_ns, name)
    done = runs.wait_state(name, "completed", timeout=90)
    assert done["status"]["outcome"]
    applied_once(env, demo_ns)


def test_a_run_in_a_namespace_not_opted_in_is_marked_and_goes_on_once_it_opts_in(
    env: KubeEnv, installed: float
) -> None:
    """The chart's operator may impersonate ServiceAccounts only where a namespace opted in: a run
    elsewhere is left alone, marked NamespaceNotManaged (the fix named); the documented one-command
    RoleBinding opts the namespace in and the run goes on, reading as its ServiceAccount."""
    ns = f"unmanaged-{uuid.uuid4().hex[:6]}"
    prepare_namespace(env, ns)
    try:
        kubectl(env, "-n", ns, "apply", "-f", str(REPO / "config/samples/agentpolicy-default.yaml"))
        runs = Runs(env, ns)
        runs.await_webhook()
        kubectl(env, "-n", ns, "apply", "-f", str(REPO / "config/samples/agentrun-rollout.yaml"))

        def marked() -> dict[str, Any] | None:
            conditions = (runs.get("rollout").get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "NamespaceNotManaged"), None)

        condition = eventually(marked, 60, "the run marked NamespaceNotManaged")
        assert condition["status"] == "True"
        assert "kubectl create rolebinding" in condition["message"], condition
        assert (runs.get("rollout")["status"].get("state") or "pending") == "pending", "left alone"
        kubectl(env, *opt_in_args(ns, RELEASE, OPERATOR_NS))
        parked = runs.wait_state("rollout", "waiting_input", timeout=90)
        assert parked["status"]["checkpoint"]["evidence"], "read as its ServiceAccount once opted in"
        assert not [c for c in parked["status"]["conditions"] if c["type"] == "NamespaceNotManaged"]
    finally:
        client.CoreV1Api(env.api).delete_namespace(ns)


def test_an_approval_by_someone_without_the_verb_is_refused_in_cluster(env: KubeEnv, demo_ns: str) -> None:
    runs, name = start_rollout(env, demo_ns)
    patch_spec(env, demo_ns, name, {"events": {"maintenance-window-open": "opened by the test"}})
    parked = runs.wait_state(name, "waiting_approval", timeout=60)
    assert env.plane is not None
    grant(
        env,
        demo_ns,
        "mallory",
        policy_rule("durable-agents.io", "agentruns", "get", "list", "patch"),
        name="patcher",
    )
    mallory = env.plane.write_user_kubeconfig("mallory", [])
    request = parked["status"]["approvalRequest"]  # the request mallory reviewed
    request_id = request["requestId"]
    pinned = ("--request", request_id, "--digest", request["digest"])
    answer = agentrun(mallory, "approve", name, "-n", demo_ns, *pinned, "--reason", "not mine to give")
    assert answer.returncode != 0
    assert "approve" in answer.stderr + answer.stdout
    assert request_id not in (runs.get(name)["spec"].get("approvals") or {})
    assert runs.get(name)["status"]["state"] == "waiting_approval"


def shard_holder(env: KubeEnv, lease: str) -> str | None:
    held = client.CoordinationV1Api(env.api).read_namespaced_lease(lease, OPERATOR_NS)
    return str(held.spec.holder_identity) if held.spec.holder_identity else None


def test_the_replica_holding_the_run_is_deleted_and_another_completes_it(env: KubeEnv, demo_ns: str) -> None:
    runs, name = start_rollout(env, demo_ns)
    lease = shard_lease_name("default", shard_of(demo_ns, name, SHARDS))
    victim = shard_holder(env, lease)
    assert victim in {p.metadata.name for p in operator_pods(env)}, f"{lease} held by {victim}"
    deleted = time.monotonic()
    kubectl(env, "-n", OPERATOR_NS, "delete", "pod", victim, "--force", "--grace-period=0")
    eventually(lambda: shard_holder(env, lease) not in (None, victim), LEASE * 4, f"{lease} taken over")
    took = time.monotonic() - deleted
    print(f"\nthe run's shard taken over {took:.1f}s after its holder was force-deleted", flush=True)
    assert took <= LEASE + 1 + 1, f"takeover {took:.1f}s: more than the Lease ({LEASE}s) + 1s (+1s polling)"
    patch_spec(env, demo_ns, name, {"events": {"maintenance-window-open": "opened by the test"}})
    approve(env, runs, demo_ns, name)
    runs.wait_state(name, "completed", timeout=90)
    applied_once(env, demo_ns)
    eventually(lambda: len([p for p in operator_pods(env) if ready(p)]) == 2, 120, "the Deployment back to 2")


def test_with_the_webhook_removed_no_approval_is_acted_on(
    node_bed: NodeTestBed, env: KubeEnv, demo_ns: str
) -> None:
    """The second line, in-cluster: the chart upgraded with webhook.enabled=false (its configurations
    gone), an approval given with ``kubectl agentrun approve`` by someone holding the verb carries no
    stamp, and the operator refuses it; with the webhook back, a stamped approval is acted on once."""
    runs, name = start_rollout(env, demo_ns)
    patch_spec(env, demo_ns, name, {"events": {"maintenance-window-open": "opened by the test"}})
    request = runs.wait_state(name, "waiting_approval", timeout=60)["status"]["approvalRequest"]
    upgrade = ["upgrade", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--reuse-values", "--wait"]
    helm(node_bed, *upgrade, "--set", "webhook.enabled=false", "--timeout", "180s")
    try:
        admission = client.AdmissionregistrationV1Api(env.api)
        names = {w.metadata.name for w in admission.list_validating_webhook_configuration().items}
        assert "durable-agents" not in names
        pinned = ("--request", request["requestId"], "--digest", request["digest"])
        answer = agentrun(approver_kubeconfig(env, demo_ns), "approve", name, "-n", demo_ns, *pinned)
        assert answer.returncode == 0, answer.stdout + answer.stderr  # nothing refuses the write itself

        def refused() -> dict[str, Any] | None:
            status = runs.get(name)["status"]
            keys = [r["key"] for r in status.get("refusedRequests") or ()]
            return status if request["requestId"] in keys else None

        status = eventually(refused, 60, "the operator to refuse the unstamped approval")
        assert status["state"] == "waiting_approval"
        assert not client.CustomObjectsApi(env.api).list_namespaced_custom_object(
            "durable-agents.io", "v1alpha1", demo_ns, "actionrecords"
        )["items"], "no effect on an unstamped approval"
    finally:
        helm(node_bed, *upgrade, "--set", "webhook.enabled=true", "--timeout", "180s")
    Runs(env, demo_ns).await_webhook()
    approve(env, runs, demo_ns, name)
    runs.wait_state(name, "completed", timeout=90)
    applied_once(env, demo_ns)


def test_uninstall_keeps_the_runs_and_a_reinstall_resumes_them(
    node_bed: NodeTestBed, env: KubeEnv, demo_ns: str
) -> None:
    runs, name = start_rollout(env, demo_ns)
    helm(node_bed, "uninstall", RELEASE, "--namespace", OPERATOR_NS, "--wait")
    admission = client.AdmissionregistrationV1Api(env.api)
    assert not [
        w
        for w in admission.list_validating_webhook_configuration().items
        if w.metadata.name == "durable-agents"
    ]
    crds = client.ApiextensionsV1Api(env.api).list_custom_resource_definition().items
    assert "agentruns.durable-agents.io" in {c.metadata.name for c in crds}
    assert runs.get(name)["status"]["state"] == "waiting_external"
    # No webhook configuration is left behind to refuse every write while no operator answers.
    kubectl(env, "-n", demo_ns, "label", "agentrun", name, "uninstalled=yes")
    install(node_bed)
    Runs(env, demo_ns).await_webhook()
    patch_spec(env, demo_ns, name, {"events": {"maintenance-window-open": "opened after the reinstall"}})
    approve(env, runs, demo_ns, name)
    runs.wait_state(name, "completed", timeout=90)
    applied_once(env, demo_ns)


UPGRADE_RUNS = 20


def rollout_runs(ns: str, count: int) -> str:
    """``count`` copies of the demo's run (rollout-0, ...), each changing its own ConfigMap."""
    sample = yaml.safe_load((REPO / "config/samples/agentrun-rollout.yaml").read_text())
    docs = []
    for i in range(count):
        doc = copy.deepcopy(sample)
        doc["metadata"] = {"name": f"rollout-{i}", "namespace": ns}
        effect = next(s for s in doc["spec"]["steps"] if "effect" in s)["effect"]
        effect["arguments"]["object"]["metadata"]["name"] = f"rollout-strategy-{i}"
        docs.append(doc)
    return yaml.safe_dump_all(docs)


def approve_when_served(env: KubeEnv, runs: Runs, ns: str, name: str) -> None:
    """``approve``, tried again while a rollout leaves the webhook's Service briefly without an
    answering Pod (the write is refused then, failurePolicy Fail: nothing is lost)."""

    def approved() -> bool:
        try:
            approve(env, runs, ns, name)
        except AssertionError as err:
            if "webhook" not in str(err) and "connection refused" not in str(err):
                raise
            return False
        return True

    eventually(approved, 120, f"{name} approved through the webhook")


def test_helm_upgrade_to_a_rebuilt_image_in_the_middle_of_20_runs(
    node_bed: NodeTestBed,
    env: KubeEnv,
    demo_ns: str,
    upgrade_image_archive: Path,
    upgrade_image: tuple[str, str],
) -> None:
    """20 runs parked for approval; 7 approved just before ``helm upgrade`` to the image rebuilt
    as the next version, 7 while its rollout replaces the Pods, 6 after. Every run completes and
    applies its change once; the runs that waited across the upgrade are resumed, revalidated and
    finished by the new version (their checkpoints need no migration: the same schema)."""
    new_image, new_version = upgrade_image
    node_bed.import_image(upgrade_image_archive, new_image)
    rbac = client.RbacAuthorizationV1Api(env.api)
    role = rbac.read_namespaced_role("rollout-agent", demo_ns)
    targets = [f"rollout-strategy-{i}" for i in range(UPGRADE_RUNS)]
    for rule in role.rules:
        if rule.resource_names:
            rule.resource_names = [*rule.resource_names, *targets]
    rbac.replace_namespaced_role("rollout-agent", demo_ns, role)
    kubectl(env, "-n", demo_ns, "apply", "-f", "-", input=rollout_runs(demo_ns, UPGRADE_RUNS))
    runs = Runs(env, demo_ns)
    names = [f"rollout-{i}" for i in range(UPGRADE_RUNS)]
    for name in names:
        runs.wait_state(name, "waiting_input", timeout=120)
        patch_spec(env, demo_ns, name, {"answers": {"confirm": "yes"}})
    for name in names:
        runs.wait_state(name, "waiting_external", timeout=120)
        patch_spec(env, demo_ns, name, {"events": {"maintenance-window-open": "opened by the test"}})
    for name in names:
        runs.wait_state(name, "waiting_approval", timeout=120)
    before, during, after = names[:7], names[7:14], names[14:]
    for name in before:
        approve(env, runs, demo_ns, name)
    upgrade = ["upgrade", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--reuse-values"]
    started = time.monotonic()
    helm(node_bed, *upgrade, "--set", f"image.tag={new_version}")
    for name in during:
        approve_when_served(env, runs, demo_ns, name)
    deployment = f"deployment/{RELEASE}-durable-agents"
    kubectl(env, "-n", OPERATOR_NS, "rollout", "status", deployment, "--timeout=240s")
    print(f"\nhelm upgrade to {new_image}: rolled out in {time.monotonic() - started:.1f}s", flush=True)
    pods = operator_pods(env)
    assert {p.spec.containers[0].image for p in pods} == {new_image}, diagnosis(node_bed)
    for name in after:
        approve(env, runs, demo_ns, name)
    finished = {name: runs.wait_state(name, "completed", timeout=180) for name in names}

    records = client.CustomObjectsApi(env.api).list_namespaced_custom_object(
        "durable-agents.io", "v1alpha1", demo_ns, "actionrecords"
    )["items"]
    by_run: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_run.setdefault(record["spec"]["runRef"]["name"], []).append(record)
    core = client.CoreV1Api(env.api)
    for i, name in enumerate(names):
        assert len(by_run.get(name) or ()) == 1, f"{name}: not one ActionRecord ({sorted(by_run)})"
        (record,) = by_run[name]
        assert (record["status"]["state"], record["status"]["attempts"]) == ("succeeded", 1), record["status"]
        changed = core.read_namespaced_config_map(f"rollout-strategy-{i}", demo_ns)
        key = changed.metadata.annotations["durable-agents.io/idempotency-key"]
        assert key == record["spec"]["idempotencyKey"], name
    for name in after:
        # Parked across the upgrade: resumed by the new version, which revalidated the run's
        # material facts after the approval (as after any wait) before it applied the change.
        status = finished[name]["status"]
        assert status["checkpoint"]["runtimeConfig"]["operator"] == new_version, (name, status["checkpoint"])
        events = [h["event"] for h in status["history"]]
        decided = events.index("approval_decided")
        assert "revalidated" in events[decided:], (name, events)
