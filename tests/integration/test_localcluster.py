"""The local control plane itself: pinned version, client-cert users under RBAC, garbage collection,
restarts that keep data, the detached CLI, and a stop that leaves no process behind.

Version and RBAC use the session plane (``kube`` fixture); lifecycle tests start their own
plane, since they stop it. All of it is about the local plane, so none of it runs against an
external cluster (DURABLE_AGENTS_TEST_KUBECONFIG).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import ControlPlaneError, LocalControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.local_plane("itself")]

REPO = Path(__file__).resolve().parents[2]


def pinned_kubernetes_version() -> str:
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1].strip()
    raise AssertionError("KUBERNETES_VERSION missing from hack/versions.env")


def process_gone(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (it holds no resources and runs no code)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def test_server_version_is_the_pinned_one(plane: LocalControlPlane, kube: KubeEnv) -> None:
    info = client.VersionApi(kube.api).get_code()
    assert info.git_version == pinned_kubernetes_version()


def test_built_kubectl_is_the_pinned_version(plane: LocalControlPlane) -> None:
    out = plane.kubectl("version", "-o", "json", check=True).stdout
    versions = json.loads(out)
    assert versions["clientVersion"]["gitVersion"] == pinned_kubernetes_version()
    assert versions["serverVersion"]["gitVersion"] == pinned_kubernetes_version()


def test_ordinary_user_is_forbidden_where_admin_is_not(
    plane: LocalControlPlane, kube: KubeEnv, namespace: str
) -> None:
    admin_pods = client.CoreV1Api(kube.api).list_namespaced_pod(namespace)
    assert admin_pods.items == []

    user = f"user-{uuid.uuid4().hex[:8]}"
    path = plane.write_user_kubeconfig(user, ["durable-agents-test-nobody"])
    api = config.new_client_from_config(config_file=str(path))
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(api).list_namespaced_pod(namespace)
    assert err.value.status == 403
    assert f'User "{user}" cannot list resource "pods"' in json.loads(err.value.body)["message"]

    # The identity comes from the certificate: CN is the user, O the groups.
    review = client.AuthenticationV1Api(api).create_self_subject_review(
        client.V1SelfSubjectReview(metadata=client.V1ObjectMeta())
    )
    assert review.status.user_info.username == user
    assert "durable-agents-test-nobody" in review.status.user_info.groups


# -- lifecycle: an own plane, because these tests stop it ------------------------------------


@pytest.fixture(scope="module")
def bin_dir(plane: LocalControlPlane) -> Path:
    # Same binaries as the session plane (no second build), resolved once.
    return plane.bin_dir


def test_plane_restarts_keep_data_collects_garbage_and_stop_leaves_no_process(bin_dir: Path) -> None:
    plane = LocalControlPlane(bin_dir=bin_dir)
    plane.start()
    try:
        pids = plane.pids
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager"}
        assert plane.startup_seconds is not None
        work_dir = plane.work_dir
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(plane.kubeconfig_path)))

        owner = core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
        )
        ref = client.V1OwnerReference(
            api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
        )
        core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="child", owner_references=[ref]))
        )

        plane.restart_apiserver()
        plane.restart_etcd(graceful=False)
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(plane.kubeconfig_path)))
        assert (
            core.read_namespaced_config_map("child", "default").metadata.owner_references[0].name == "owner"
        )
        assert plane.pids["etcd"] != pids["etcd"]
        assert plane.pids["kube-apiserver"] != pids["kube-apiserver"]

        core.delete_namespaced_config_map("owner", "default")

        def child_gone() -> bool:
            try:
                core.read_namespaced_config_map("child", "default")
            except ApiException as err:
                return bool(err.status == 404)
            return False

        eventually(child_gone, Within.TAKEOVER, "garbage collection of the child ConfigMap", interval=0.1)
        all_pids = {*pids.values(), *plane.pids.values()}
    finally:
        plane.stop()

    assert all(process_gone(pid) for pid in all_pids)
    assert not work_dir.exists()
    plane.stop()  # idempotent


def test_a_component_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl"):
        script = fake / name
        script.write_text("#!/bin/sh\necho 'fake component refuses to start' >&2\nexit 3\n")
        script.chmod(0o755)
    plane = LocalControlPlane(tmp_path / "plane", bin_dir=fake)
    with pytest.raises(ControlPlaneError, match=r"(?s)etcd exited with code 3.*refuses to start"):
        plane.start()
    assert not plane.started
    assert not (tmp_path / "plane" / "state.json").exists()


def test_a_component_that_never_gets_ready_times_out_and_its_whole_group_is_killed(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    child_pid_file = tmp_path / "child.pid"
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl"):
        script = fake / name
        # A shell with a child: stopping must reach the child too (same process group).
        script.write_text(
            f"#!/bin/sh\necho 'fake never answers'\nsleep 600 &\necho $! > {child_pid_file}\nwait\n"
        )
        script.chmod(0o755)
    plane = LocalControlPlane(tmp_path / "plane", bin_dir=fake, startup_timeout=2.0)
    with pytest.raises(TimeoutError, match=r"(?s)etcd not ready after 2s.*fake never answers"):
        plane.start()
    leader = plane.pids["etcd"]
    child = int(child_pid_file.read_text())
    assert process_gone(leader)
    eventually(lambda: process_gone(child), Within.MOMENT, "the component's child process to exit")


# -- the detached CLI ------------------------------------------------------------------------


@pytest.fixture
def cli_env(bin_dir: Path) -> dict[str, str]:
    return dict(os.environ, DURABLE_AGENTS_BIN_DIR=str(bin_dir))


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_agents_testkit.localcluster.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.fixture
def cluster_dir(tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    yield directory
    run_cli(cli_env, "down", "--dir", str(directory))  # never leave a detached plane behind


def test_cli_up_is_detached_idempotent_and_down_removes_everything(
    cluster_dir: Path, cli_env: dict[str, str]
) -> None:
    up = run_cli(cli_env, "up", "--dir", str(cluster_dir))
    assert up.returncode == 0, up.stderr
    kubeconfig = Path(up.stdout.strip().splitlines()[-1])
    assert kubeconfig.is_file()
    state = json.loads((cluster_dir / "state.json").read_text())
    pids = [p["pid"] for p in state["processes"].values()]
    # The CLI process has exited; the plane still answers.
    api = config.new_client_from_config(config_file=str(kubeconfig))
    assert client.VersionApi(api).get_code().git_version == pinned_kubernetes_version()

    status = run_cli(cli_env, "status", "--dir", str(cluster_dir))
    assert status.returncode == 0, status.stdout
    assert json.loads(status.stdout)["healthy"] is True

    again = run_cli(cli_env, "up", "--dir", str(cluster_dir))
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == str(kubeconfig)
    assert [
        p["pid"] for p in json.loads((cluster_dir / "state.json").read_text())["processes"].values()
    ] == pids

    down = run_cli(cli_env, "down", "--dir", str(cluster_dir))
    assert down.returncode == 0, down.stderr
    assert all(process_gone(pid) for pid in pids)
    assert not (cluster_dir / "state.json").exists()
    assert not (cluster_dir / "etcd-data").exists()
    assert run_cli(cli_env, "status", "--dir", str(cluster_dir)).returncode == 1
