"""A chaos scenario's world: a :class:`Lab` (namespaces, operator processes, kill counting), the
RBAC the operator and the people get, and calls that ride through control-plane restarts."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP
from durable_agents_testkit.chaos.report import ScenarioResult
from durable_agents_testkit.chaos.warm import ForkServer, WarmOperator, runs_this_checkout
from durable_agents_testkit.chaos.workloads import SETTINGS_CONFIGMAP
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.governance import permissive_default
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.operator_rights import grant_operator, manage
from durable_agents_testkit.rbac import grant, group, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

T = TypeVar("T")
OPERATOR_USER = "durable-agents-operator"
# An ApiException status that means the API server is (re)starting, not that the call is wrong.
RESTARTING = (0, 429, 500, 503, 504)


def _ignore_conflict(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except ApiException as err:
        if err.status != 409:
            raise


def grant_operator_rules(api: client.ApiClient) -> None:
    """The operator's user gets the chart's cluster-wide rules (as e2e/conftest.py does); each lab
    namespace is managed (:func:`prepare_namespace`)."""
    grant_operator(api, OPERATOR_USER)


def prepare_namespace(api: client.ApiClient, name: str, *, approvers: bool = False) -> None:
    """A namespace whose default ServiceAccount may read the settings ConfigMap; with approvers,
    the group ``approvers`` may approve AgentRuns and ``editors`` may only edit them."""
    core = client.CoreV1Api(api)
    _ignore_conflict(
        lambda: core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    )
    _ignore_conflict(
        lambda: core.create_namespaced_config_map(
            name, {"metadata": {"name": SETTINGS_CONFIGMAP}, "data": {"maxSurge": "25%"}}
        )
    )
    manage(api, name, OPERATOR_USER)  # the operator may act as its ServiceAccounts, keeps Leases there
    reads = rule("", "configmaps", "get")
    grant(api, name, service_account("default", name), reads, name="read-settings", exist_ok=True)
    # Runs are governed by default: runs naming no policy send without approval, as they did.
    _ignore_conflict(lambda: permissive_default(api, name))
    if not approvers:
        return
    for who, verbs in (
        ("approver", ["get", "list", "create", "patch", "approve"]),
        ("editor", ["get", "list", "create", "patch"]),
    ):
        grant(
            api,
            name,
            group(f"{who}s"),
            [rule(GROUP, "agentruns", *verbs), rule(GROUP, "agentpolicies", "use")],
            name=f"agentrun-{who}",
            exist_ok=True,
        )


class Lab:
    """One scenario's world: its namespaces, its operator processes and what was done to them."""

    def __init__(
        self,
        kube: KubeEnv,
        operator_kubeconfig: Path,
        log_dir: Path,
        result: ScenarioResult,
        refsystem: ReferenceSystemThread | None = None,
    ) -> None:
        self.kube = kube
        self.operator_kubeconfig = operator_kubeconfig
        self.log_dir = log_dir
        self.result = result
        self.refsystem = refsystem
        self.namespaces: list[str] = []
        self.operators: list[OperatorProcess] = []
        self._lock = threading.Lock()
        self._fork_server: ForkServer | None = None

    # -- bookkeeping --------------------------------------------------------------------------

    def count_kill(self, n: int = 1) -> None:
        with self._lock:
            self.result.kills += n

    def count_fault(self, n: int = 1) -> None:
        with self._lock:
            self.result.faults += n

    def note(self, text: str) -> None:
        with self._lock:
            self.result.notes.append(text)

    # -- namespaces and runs ------------------------------------------------------------------

    def namespace(self, prefix: str = "chaos", *, approvers: bool = False) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        prepare_namespace(self.kube.api, name, approvers=approvers)
        with self._lock:
            self.namespaces.append(name)
        return name

    def runs(self, namespace: str) -> Runs:
        return Runs(self.kube, namespace)

    def create(
        self, namespace: str, spec: dict[str, Any], name: str | None = None, *, seal: bool = True
    ) -> str:
        """``seal=False``: as an operator release from before sealing admitted runs."""
        created = self.runs(namespace).create(spec, name=name, seal=seal)
        with self._lock:
            self.result.runs += 1
        return created

    def all_runs(self, namespaces: list[str] | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ns in namespaces if namespaces is not None else list(self.namespaces):
            out += self.runs(ns).all()
        return out

    # -- operators ----------------------------------------------------------------------------

    def operator(
        self,
        namespace: str,
        name: str = "op",
        lease: int = 2,
        kubeconfig: Path | None = None,
        warm: bool | None = None,
        **env: str,
    ) -> OperatorProcess:
        """An operator process watching ``namespace``. ``warm`` (default: unless it runs another
        release's code) forks it from the lab's :class:`ForkServer`."""
        env.setdefault("DURABLE_AGENTS_NAMESPACE", namespace)
        kubeconfig = kubeconfig or self.operator_kubeconfig
        if warm is None:
            warm = runs_this_checkout(env)
        op: OperatorProcess
        if warm:
            with self._lock:
                if self._fork_server is None:
                    self._fork_server = ForkServer()
            op = WarmOperator(
                self._fork_server, kubeconfig, self.log_dir, name=name, lease_duration=lease, env=env
            )
        else:
            op = OperatorProcess(kubeconfig, self.log_dir, name=name, lease_duration=lease, env=env)
        with self._lock:
            self.operators.append(op)
        return op.start()

    def webhook_operator(self, namespace: str) -> OperatorProcess:
        """An operator that only serves the admission webhook (no workers, no dispatcher): it stays
        up while workers are killed, so approvals and answers keep being admitted."""
        op = self.operator(
            namespace,
            "webhook",
            DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()),
            DURABLE_AGENTS_WORKERS="0",
            DURABLE_AGENTS_DISPATCHER="off",
        )
        eventually(
            lambda: "admission webhook serving" in op.log_tail(200), Within.COMMIT, "the admission webhook"
        )
        return op

    def kill(self, op: OperatorProcess) -> None:
        """SIGKILL from the test (counted)."""
        assert op.alive, f"operator {op.identity} is already dead:\n{op.log_tail(30)}"
        op.kill()
        self.count_kill()

    def await_hook_kill(
        self, op: OperatorProcess, give_up: Callable[[], bool], within: Within | float = Within.RUN
    ) -> bool:
        """Wait until the commit hook kills ``op`` (True, counted), or until ``give_up()`` holds
        while it is alive (False: stopped; its kill point was never reached)."""
        checked = 0.0

        def dead_or_given_up() -> bool:
            nonlocal checked
            if not op.alive:
                return True
            # Dying is checked often (a kill is cheap to notice); the work less so (a list call).
            if time.monotonic() - checked > 0.5:
                if give_up():
                    return True
                checked = time.monotonic()
            return False

        try:
            eventually(dead_or_given_up, within, f"operator {op.identity} to die or finish", interval=0.02)
        except TimeoutError:
            raise TimeoutError(
                f"operator {op.identity} neither reached its kill point nor finished its work "
                f"within {float(within):.0f}s; log:\n{op.log_tail(30)}"
            ) from None
        if op.alive:
            op.stop()
            return False
        code = op.wait_exit(5)
        assert code < 0, f"operator {op.identity} exited with {code}, not by a signal:\n{op.log_tail(60)}"
        self.count_kill()
        return True

    def stop_operators(self) -> None:
        for op in self.operators:
            try:
                op.stop()
            except Exception as err:  # keep cleaning up; a process that will not die is reported
                self.note(f"operator {op.identity} did not stop: {err}")

    def close(self) -> None:
        try:
            self.stop_operators()
        finally:
            if self._fork_server is not None:
                self._fork_server.close()
        core = client.CoreV1Api(self.kube.api)
        for ns in self.namespaces:
            with contextlib.suppress(ApiException):
                core.delete_namespace(ns, propagation_policy="Background")

    def crash_report(self, limit: int = 3) -> str:
        """Log tails of the last operators, for failure messages."""
        return "\n".join(
            f"--- {op.identity} ({'alive' if op.alive else 'dead'}) ---\n{op.log_tail(25)}"
            for op in self.operators[-limit:]
        )


def retrying(fn: Callable[[], T], what: str, within: Within | float = Within.TAKEOVER) -> T:
    """Call ``fn`` until it stops failing with a connection error (the API server restarts)."""
    last: Exception | None = None

    def attempt() -> tuple[T] | None:
        nonlocal last
        try:
            return (fn(),)  # a tuple: a falsy result (an empty list) is a result too
        except Exception as err:  # urllib3 raises several kinds while the server is down
            if isinstance(err, ApiException) and err.status not in RESTARTING:
                raise
            last = err
            return None

    try:
        return eventually(attempt, within, what, interval=0.2)[0]
    except TimeoutError:
        raise TimeoutError(f"{what}: still failing after {float(within):.0f}s: {last}") from last
