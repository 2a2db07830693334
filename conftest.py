"""Shared pytest fixtures: the real API server every integration and e2e test talks to.

By default a local control plane (etcd + kube-apiserver built from Go modules, see hack/) is
started once per session. Set DURABLE_AGENTS_TEST_KUBECONFIG to run the same suite against any
existing cluster instead (for example kind on a laptop with Docker).
"""

from __future__ import annotations

import compileall
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings
from kubernetes import client

from durable_agents_testkit import local_plane
from durable_agents_testkit.cluster import KubeEnv, install_crds
from durable_agents_testkit.operator_rights import manage

if TYPE_CHECKING:
    from durable_agents_testkit.localcluster.controlplane import LocalControlPlane

REPO = Path(__file__).resolve().parent

# Property tests assert properties, never speed (speed is measured in bench/): no per-example
# deadline and no "input generation is slow" check, both of which fail on a loaded machine.
settings.register_profile("durable-agents", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("durable-agents")
_MARK_BY_DIR = {"unit": "unit", "integration": "integration"}
# Another cluster instead of the local control plane (make test-kind): tests marked local_plane skip.
EXTERNAL_KUBECONFIG = os.environ.get("DURABLE_AGENTS_TEST_KUBECONFIG")


def pytest_configure(config: pytest.Config) -> None:
    # The tests start hundreds of operator processes; where PYTHONDONTWRITEBYTECODE is set (CI
    # images often set it), each would compile the sources again. Compiled once, up front (the
    # xdist workers are started after this, by the controlling process only).
    if not hasattr(config, "workerinput"):
        for directory in ("operator", "controllers", "testkit"):
            compileall.compile_dir(REPO / directory, quiet=1, workers=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Markers follow the folder, so a test cannot end up in the wrong tier by a forgotten mark.
    unmarked: list[str] = []
    for item in items:
        parts = Path(str(item.fspath)).relative_to(REPO).parts
        if parts[0] == "e2e":
            item.add_marker(pytest.mark.e2e)
        elif parts[0] == "tests" and len(parts) > 1 and parts[1] in _MARK_BY_DIR:
            item.add_marker(getattr(pytest.mark, _MARK_BY_DIR[parts[1]]))
        unlisted = _needs_local_plane(item)
        if unlisted:
            unmarked.append(unlisted)
    if unmarked:
        raise pytest.UsageError(
            f"these tests use the local control plane (fixture 'plane') without"
            f" @pytest.mark.{local_plane.MARK}(<need>, ...) naming their needs among"
            f" {sorted(local_plane.NEEDS)}: {unmarked}"
        )
    # The node tests last: their test bed (a second control plane, kubelet, containerd, the
    # operator's Pods) lives until the session ends, and would take CPU from every test after it.
    node_tests = REPO / "tests" / "node"
    items.sort(key=lambda item: node_tests in Path(str(item.fspath)).resolve().parents)


def _needs_local_plane(item: pytest.Item) -> str | None:
    """One mark says a test needs the local control plane (and what of it): on another cluster it
    is skipped, and the table of docs/operate/kind-suites.md lists it. A test that asks for the
    ``plane`` fixture (itself or through a fixture) without the mark is refused (its id returned),
    so no test can need the plane without being listed."""
    marks = list(item.iter_markers(local_plane.MARK))
    if not marks:
        return item.nodeid if "plane" in getattr(item, "fixturenames", ()) else None
    try:
        needs = local_plane.checked([n for mark in marks for n in mark.args], item.nodeid)
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None
    if EXTERNAL_KUBECONFIG:
        item.add_marker(pytest.mark.skip(reason=local_plane.skip_reason(needs)))
    return None


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeEnv]:
    """A real API server with the CRDs installed."""
    if EXTERNAL_KUBECONFIG:
        env = KubeEnv.external(Path(EXTERNAL_KUBECONFIG))
        install_crds(env.api, REPO / "crds")
        yield env
        return
    from durable_agents_testkit.localcluster.controlplane import LocalControlPlane

    with LocalControlPlane() as plane:
        env = KubeEnv.local(plane)
        install_crds(env.api, REPO / "crds")
        yield env


@pytest.fixture
def namespace(kube: KubeEnv) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube.api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    manage(kube, name)  # managed: the operators the kit starts may act as its ServiceAccounts
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="session")
def plane(kube: KubeEnv) -> LocalControlPlane:
    """The local control plane, for tests marked ``local_plane`` (only they may ask for it; on
    another cluster they are skipped before this runs)."""
    assert kube.plane is not None, "a test marked local_plane ran against another cluster"
    return kube.plane
