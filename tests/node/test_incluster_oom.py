"""The operator's container killed by the kernel at its memory limit in the middle of a run, on the
node test bed (issue 37, item 7): the chart installed with its default resources (one replica, so
nothing but the restarted container can finish the run) and the test hook
``DURABLE_AGENTS_TEST_OOM_AT``, which at the operator's Nth write of record allocates memory until
the cgroup's OOM killer ends the process (once per container filesystem: the restarted container
finds the marker in its ``/tmp``, an emptyDir, and goes on). The kubelet restarts the container
(``OOMKilled``), and the demo's run completes with its change applied once."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests.node.test_incluster_tracing import helm

from durable_agents import __version__
from durable_agents_testkit import demo_cluster
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.demo import approver_kubeconfig, prepare_namespace
from durable_agents_testkit.eventually import eventually
from durable_agents_testkit.localcluster.node import NodeTestBed
from durable_agents_testkit.operator_rights import opt_in
from durable_agents_testkit.runs import Runs

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts/durable-agents"
IMAGE = f"localhost/durable-agents:{__version__}"
RELEASE, OPERATOR_NS = "da", "durable-agents-system"
OOM_AT = "after:4"  # the fourth write of record: the approval's commit, the change decided, not made


@pytest.fixture(scope="module")
def env(node_bed: NodeTestBed, operator_image_archive: Path) -> KubeEnv:
    node_bed.import_image(operator_image_archive, IMAGE)
    assert node_bed.plane is not None
    return KubeEnv.local(node_bed.plane)


@pytest.fixture(scope="module")
def oom_install(
    node_bed: NodeTestBed, env: KubeEnv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """One replica, the chart's default requests and limits, the out-of-memory hook."""
    values = tmp_path_factory.mktemp("values") / "oom.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "image": {"tag": __version__, "pullPolicy": "Never"},
                "replicas": 1,
                "leaseDurationSeconds": 5,
                "env": [{"name": "DURABLE_AGENTS_TEST_OOM_AT", "value": OOM_AT}],
            }
        )
    )
    try:
        helm(
            node_bed, "install", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--create-namespace",
            "--values", str(values), "--wait", "--timeout", "180s",
        )  # fmt: skip
        demo_cluster.await_webhook_service(node_bed, OPERATOR_NS)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{demo_cluster.diagnosis(node_bed, RELEASE, OPERATOR_NS)}") from None
    yield
    subprocess.run(
        [str(node_bed.bin_dir / "helm"), "--kubeconfig", str(node_bed.kubeconfig_path), "uninstall", RELEASE,
         "--namespace", OPERATOR_NS, "--wait"],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip


def operator_status(env: KubeEnv) -> Any:
    [pod] = [
        p
        for p in client.CoreV1Api(env.api)
        .list_namespaced_pod(OPERATOR_NS, label_selector=f"app.kubernetes.io/instance={RELEASE}")
        .items
        if p.metadata.deletion_timestamp is None
    ]
    [status] = [c for c in pod.status.container_statuses or () if c.name == "operator"]
    return pod, status


def oom_killed(env: KubeEnv) -> bool:
    _, status = operator_status(env)
    terminated = status.last_state.terminated if status.last_state else None
    return bool(terminated and terminated.reason == "OOMKilled" and status.ready)


def written(bed: NodeTestBed, ns: str, patch: dict[str, Any]) -> bool:
    """A person's patch of the run's spec; refused while the restarting operator's webhook is not
    serving (failurePolicy Fail), so retried."""
    done = bed.kubectl(
        "-n", ns, "patch", "agentrun", "rollout", "--type=merge", "-p", json.dumps({"spec": patch})
    )
    return done.returncode == 0


def test_the_operator_killed_at_its_memory_limit_restarts_and_the_run_completes_once(
    node_bed: NodeTestBed, env: KubeEnv, oom_install: None
) -> None:
    _, before = operator_status(env)
    assert before.restart_count == 0, "the operator restarted before the test began"
    ns = f"oom-{uuid.uuid4().hex[:6]}"
    prepare_namespace(env, ns)
    opt_in(env, ns, RELEASE, OPERATOR_NS)  # managed: the chart's operator may act as its ServiceAccounts
    try:
        node_bed.kubectl(
            "-n", ns, "apply", "-f", str(REPO / "config/samples/agentpolicy-default.yaml"), check=True
        )
        runs = Runs(env, ns)
        runs.await_webhook()
        node_bed.kubectl(
            "-n", ns, "apply", "-f", str(REPO / "config/samples/agentrun-rollout.yaml"), check=True
        )
        runs.wait_state("rollout", "waiting_input", timeout=60)
        eventually(lambda: written(node_bed, ns, {"answers": {"confirm": "yes"}}), 120, "the answer admitted")
        runs.wait_state("rollout", "waiting_external", timeout=180)
        events = {"events": {"maintenance-window-open": "opened by the test"}}
        eventually(lambda: written(node_bed, ns, events), 120, "the event admitted")
        parked = runs.wait_state("rollout", "waiting_approval", timeout=180)
        request = parked["status"]["approvalRequest"]
        approval = {"approvals": {request["requestId"]: {"digest": request["digest"], "decision": "approve"}}}
        approver = approver_kubeconfig(env, ns)

        def approved() -> bool:
            kubectl = [str(node_bed.bin_dir / "kubectl"), "--kubeconfig", str(approver), "-n", ns]
            patch = ["patch", "agentrun", "rollout", "--type=merge", "-p", json.dumps({"spec": approval})]
            done = subprocess.run([*kubectl, *patch], capture_output=True, text=True, timeout=60, check=False)
            return done.returncode == 0

        eventually(approved, 120, "the approval admitted")
        done = runs.wait_state("rollout", "completed", "failed", timeout=240)
        assert done["status"]["state"] == "completed", done["status"].get("outcome")
        try:
            eventually(lambda: oom_killed(env), 60, "the operator's container OOMKilled and Ready again")
        except TimeoutError as err:
            raise AssertionError(f"{err}\n{demo_cluster.diagnosis(node_bed, RELEASE, OPERATOR_NS)}") from None
        pod, after = operator_status(env)
        assert after.restart_count == 1, (
            f"restarted {after.restart_count} times: the hook fired once per container"
        )
        assert after.last_state.terminated.exit_code == 137
        logs = node_bed.kubectl("-n", OPERATOR_NS, "logs", pod.metadata.name, "-c", "operator", "--previous")
        assert "allocating memory until the OOM killer" in logs.stdout, logs.stdout[-2000:]
        records = client.CustomObjectsApi(env.api).list_namespaced_custom_object(
            "durable-agents.io", "v1alpha1", ns, "actionrecords"
        )["items"]
        assert [r["status"]["state"] for r in records] == ["succeeded"], records
        strategy = client.CoreV1Api(env.api).read_namespaced_config_map("rollout-strategy", ns)
        key = strategy.metadata.annotations["durable-agents.io/idempotency-key"]
        assert key == records[0]["spec"]["idempotencyKey"], "the change applied under the record's key"
    finally:
        client.CoreV1Api(env.api).delete_namespace(ns)
