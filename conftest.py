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

import pytest
from hypothesis import HealthCheck, settings
from kubernetes import client

from durable_agents_testkit.cluster import KubeEnv, install_crds

REPO = Path(__file__).resolve().parent

# Property tests assert properties, never speed (speed is measured in bench/): no per-example
# deadline and no "input generation is slow" check, both of which fail on a loaded machine.
settings.register_profile("durable-agents", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("durable-agents")
_MARK_BY_DIR = {"unit": "unit", "integration": "integration"}


def pytest_configure(config: pytest.Config) -> None:
    # The tests start hundreds of operator processes; where PYTHONDONTWRITEBYTECODE is set (CI
    # images often set it), each would compile the sources again. Compiled once, up front (the
    # xdist workers are started after this, by the controlling process only).
    if not hasattr(config, "workerinput"):
        for directory in ("operator", "controllers", "testkit"):
            compileall.compile_dir(REPO / directory, quiet=1, workers=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Markers follow the folder, so a test cannot end up in the wrong tier by a forgotten mark.
    for item in items:
        parts = Path(str(item.fspath)).relative_to(REPO).parts
        if parts[0] == "e2e":
            item.add_marker(pytest.mark.e2e)
        elif parts[0] == "tests" and len(parts) > 1 and parts[1] in _MARK_BY_DIR:
            item.add_marker(getattr(pytest.mark, _MARK_BY_DIR[parts[1]]))
    # The node tests last: their test bed (a second control plane, kubelet, containerd, the
    # operator's Pods) lives until the session ends, and would take CPU from every test after it.
    node_tests = REPO / "tests" / "node"
    items.sort(key=lambda item: node_tests in Path(str(item.fspath)).resolve().parents)


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeEnv]:
    """A real API server with the CRDs installed."""
    external = os.environ.get("DURABLE_AGENTS_TEST_KUBECONFIG")
    if external:
        env = KubeEnv.external(Path(external))
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
    yield name
    core.delete_namespace(name, propagation_policy="Background")
