"""The node test bed for the tests in this directory (``make test-node``; marker ``node``).

A control plane bound to a non-loopback address with one real node (kubelet, containerd,
kube-proxy, kube-scheduler), started once per session by
:class:`~durable_agents_testkit.localcluster.node.NodeTestBed`. Its teardown removes everything
it made and fails the session, with a readable diff, if the machine's iptables/nft rules,
mounts, network devices, cgroups, kernel settings or fixed host paths are not as before.

The embedded plane without a node (the ``kube`` fixture) stays the default everywhere else: it
starts faster and needs no root.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_agents import __version__
from durable_agents_testkit.localcluster.node import NodeTestBed

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OPERATOR_IMAGE = f"localhost/durable-agents:{__version__}"
DOCKER = "/usr/bin/docker"  # Debian's client, matching the daemon hack/image.sh starts


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The marker follows the folder, as the other tiers' do (see the root conftest.py).
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.node)


def _needs_root() -> None:
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("the node test bed needs root on Linux (namespaces, veth, cgroups, containerd)")


def _next_version(version: str) -> str:
    """A later version than ``version`` (X.Y.Z -> X.Y.(Z+1).dev0): the rebuilt image of an upgrade."""
    major, minor, patch = version.split(".")[:3]
    return f"{major}.{minor}.{int(patch) + 1}.dev0"


UPGRADE_VERSION = _next_version(__version__)
UPGRADE_IMAGE = f"localhost/durable-agents:{UPGRADE_VERSION}"


@pytest.fixture(scope="session")
def upgrade_image() -> tuple[str, str]:
    """The upgrade's image and version (``upgrade_image_archive`` holds it)."""
    return UPGRADE_IMAGE, UPGRADE_VERSION


def _build_and_save(directory: Path, image: str, **env: str) -> Path:
    """``make image`` (hack/image.sh; its caches make an unchanged image quick), then ``docker save``
    of ``image`` for the node's containerd."""
    built = subprocess.run(
        ["bash", str(REPO / "hack/image.sh")], env={**os.environ, **env}, timeout=3600, check=False
    )
    assert built.returncode == 0, f"hack/image.sh ({env or 'make image'}) failed: see its output above"
    archive = directory / "image.tar"
    saved = subprocess.run(
        [DOCKER, "save", "-o", str(archive), image], capture_output=True, text=True, timeout=600
    )
    assert saved.returncode == 0, f"docker save {image}: {saved.stderr}"
    return archive


@pytest.fixture(scope="session")
def operator_image_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator's image of these sources (``make image``) saved for the node's containerd.
    Made before the bed records the machine's state: the Docker engine that builds it is this
    machine's, started by ``hack/image.sh``, and stays."""
    _needs_root()
    return _build_and_save(tmp_path_factory.mktemp("image"), OPERATOR_IMAGE)


@pytest.fixture(scope="session")
def upgrade_image_archive(tmp_path_factory: pytest.TempPathFactory, operator_image_archive: Path) -> Path:
    """The same sources rebuilt as the next version (``IMAGE_VERSION``), as an upgrade brings:
    what ``helm upgrade`` rolls out in the middle of runs. Made before the bed, as above."""
    _needs_root()
    directory = tmp_path_factory.mktemp("upgrade-image")
    return _build_and_save(directory, UPGRADE_IMAGE, IMAGE_VERSION=UPGRADE_VERSION)


@pytest.fixture(scope="session")
def node_bed(operator_image_archive: Path, upgrade_image_archive: Path) -> Iterator[NodeTestBed]:
    """A started node test bed; at the end of the session, stopped and the machine checked."""
    _needs_root()
    bed = NodeTestBed()
    bed.start()
    print(f"\nnode test bed: Ready in {bed.timings['ready_seconds']:.1f}s ({bed.timings})", flush=True)
    yield bed
    bed.stop()  # raises HostStateChanged (the session errors) if the machine is not as before
    bed.stop()  # a second teardown finds nothing to do
    print(f"\nnode test bed: torn down in {bed.timings['teardown_seconds']:.1f}s ({bed.timings})", flush=True)


@pytest.fixture(scope="session")
def node_kubeconfig(node_bed: NodeTestBed) -> Path:
    """The admin kubeconfig of the plane with the node."""
    return node_bed.kubeconfig_path


@pytest.fixture
def node_namespace(node_bed: NodeTestBed) -> Iterator[str]:
    """A fresh namespace with its default ServiceAccount, deleted afterwards (not awaited)."""
    name = f"n-{uuid.uuid4().hex[:10]}"
    node_bed.kubectl("create", "namespace", name, check=True)
    # The ServiceAccount admission plugin refuses Pods until the controller made the account.
    node_bed.kubectl(
        "wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=30s", check=True
    )
    yield name
    node_bed.kubectl("delete", "namespace", name, "--wait=false")
