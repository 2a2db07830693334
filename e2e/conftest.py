"""e2e fixtures: the operator runs as separate processes, as its own user with the chart's RBAC."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from durable_agents_testkit import local_plane
from durable_agents_testkit.chaos.warm import ForkServer, WarmOperator, runs_this_checkout
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.governance import permissive_default
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.operator_rights import grant_operator
from durable_agents_testkit.rbac import grant, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

REPO = Path(__file__).resolve().parents[1]
OPERATOR_USER = "durable-agents-operator"


@pytest.fixture(autouse=True)
def governed_namespace(request: pytest.FixtureRequest) -> None:
    """Every test namespace gets a permissive default AgentPolicy (no approvals): runs are governed
    by default now (issue 32), and the tests written before sent effects of runs naming no policy
    without approval. A test of ungoverned runs is marked ``ungoverned``."""
    if "namespace" not in request.fixturenames or request.node.get_closest_marker("ungoverned"):
        return
    kube: KubeEnv = request.getfixturevalue("kube")
    permissive_default(kube.api, request.getfixturevalue("namespace"))


@pytest.fixture(scope="session")
def operator_kubeconfig(kube: KubeEnv) -> Path:
    """A kubeconfig for the operator's own user, bound to the chart's cluster-wide rules; each
    test's namespace is managed (the chart's namespace rules: conftest.py's ``namespace``)."""
    grant_operator(kube, OPERATOR_USER)
    if kube.plane is None:  # an external cluster: run the operator with the given credentials
        return kube.kubeconfig
    return Path(kube.plane.write_user_kubeconfig(OPERATOR_USER, []))


@pytest.fixture(scope="session")
def fork_server() -> Iterator[ForkServer]:
    """One interpreter that has imported the operator (and the SDKs it imports on first use), from
    which each test's operators are forked: 2-5 s of CPU saved per operator process."""
    server = ForkServer()
    yield server
    server.close()


@pytest.fixture
def start_operator(
    operator_kubeconfig: Path,
    tmp_path: Path,
    namespace: str,
    fork_server: ForkServer,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., OperatorProcess]]:
    """Operator processes that watch only this test's namespace (and whose admission webhook, if
    enabled, is scoped to it); all stopped afterwards. Each is forked from the session's warm
    :class:`ForkServer` (still a fresh process that knows only what the API server tells it),
    unless it runs other code than this checkout's (``PYTHONPATH``): then it is exec'd.

    An operator with its admission webhook (on this host: loopback, or an ExternalName Service
    pointing there) is refused to a test not marked ``local_plane("webhook")``: another cluster's
    API server cannot reach it, and docs/operate/kind-suites.md must list the test."""
    started: list[OperatorProcess] = []

    def start(
        name: str = "op", lease_duration: int = 3, *, identity: str | None = None, **env: str
    ) -> OperatorProcess:
        if "DURABLE_AGENTS_WEBHOOK_PORT" in env and "webhook" not in local_plane.declared(request.node):
            pytest.fail(
                f"{request.node.nodeid} starts an operator with its admission webhook on this host:"
                ' mark it @pytest.mark.local_plane("webhook", ...) (and regenerate'
                " docs/operate/kind-suites.md: python -m durable_agents_testkit.kind_suites --write)"
            )
        env.setdefault("DURABLE_AGENTS_NAMESPACE", namespace)
        where = (operator_kubeconfig, tmp_path / "operators")
        op = (
            WarmOperator(
                fork_server, *where, name=name, lease_duration=lease_duration, env=env, identity=identity
            )
            if runs_this_checkout(env)
            else OperatorProcess(*where, name=name, lease_duration=lease_duration, env=env, identity=identity)
        )
        started.append(op)
        return op.start()

    yield start
    for op in started:
        op.stop()


@pytest.fixture
def runs(kube: KubeEnv, namespace: str) -> Runs:
    return Runs(kube, namespace)


@pytest.fixture
def webhook_operator(
    start_operator: Callable[..., OperatorProcess], runs: Runs
) -> Callable[..., OperatorProcess]:
    """Operators with their admission webhook on a free loopback port, each returned once writes
    in the test's namespace pass through it: the operator installs its webhook configurations
    before its webhook process serves (admission fails closed meanwhile), and the API server
    learns of a configuration through a watch."""

    def start(name: str = "webhook", lease_duration: int = 2, **env: str) -> OperatorProcess:
        op = start_operator(name, lease_duration, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()), **env)
        eventually(lambda: op.logged("admission webhook serving"), Within.TAKEOVER, "the admission webhook")
        runs.await_webhook()
        return op

    return start


@pytest.fixture
def readable_configmap(kube: KubeEnv, namespace: str) -> str:
    """A ConfigMap the namespace's default ServiceAccount may read (and nothing more)."""
    core = client.CoreV1Api(kube.api)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "settings"}, "data": {"maxSurge": "25%"}}
    )
    reads = rule("", "configmaps", "get", names=["settings"])
    grant(kube, namespace, service_account("default", namespace), reads, name="read-settings")
    return "settings"


@pytest.fixture
def refsystem() -> Iterator[ReferenceSystemThread]:
    """The counting reference system effects are sent to (loopback)."""
    with ReferenceSystemThread() as system:
        yield system
