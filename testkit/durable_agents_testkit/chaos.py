"""Machinery of the chaos suite (``e2e/test_chaos.py``): the recovery table of design/proofs.md.

Each scenario runs many AgentRuns against operators in separate processes, hurts them (SIGKILL by
the commit hooks or from the test, SIGSTOP, ambiguous answers of the reference system, restarts of
the API server and etcd, a stale backup restored into a fresh control plane, bad input), and ends
with the two global assertions of the table:

1. every run is terminal or in an owned recovery state: ``quarantined``, a wait with an expiry,
   or in progress (``ready`` and friends) under a live Lease;
2. the reference authoritative system applied no idempotency key twice.

This module owns what scenarios share: the size knob, a :class:`Lab` (namespaces, operator
processes, kill counting), a :class:`Responder` thread that answers what runs wait for, run
classification, backup export/restore, and the report (a table and JSON). The scenarios
themselves live in the test module. Nothing here is used at run time.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import queue
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.shell.leases import RUN_LABEL
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.operator_process import OperatorProcess, wait_for
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

SIZE_ENV = "DURABLE_AGENTS_CHAOS_SIZE"
OUT_ENV = "DURABLE_AGENTS_CHAOS_OUT"
TUNE_ENV = "DURABLE_AGENTS_CHAOS_TUNE"
OPERATOR_USER = "durable-agents-operator"
TERMINAL = frozenset({"completed", "failed", "canceled", "expired"})
WAITING = frozenset({"waiting_input", "waiting_approval", "waiting_external", "waiting_retry"})
IN_PROGRESS = frozenset({"pending", "ready", "resume_validation", "cancel_requested"})
SETTINGS_CONFIGMAP = "settings"
# A wait whose expiry passed this long ago without the operator acting on it is stuck.
EXPIRY_GRACE = timedelta(seconds=15)


# --- size ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """How hard each scenario pushes. ``ci`` runs on every CI run; ``full`` is the acceptance run."""

    name: str
    crash_chains: int  # namespaces killed in parallel, each with its own batches
    crash_batch: int  # runs per batch: one kill hits all of them
    crash_sweep: int  # values of N per chain (before:N and after:N); the chains share 1..all writes
    crash_extra: int  # further kills of the same batch at random boundaries
    dispatch_rounds: int
    dispatch_runs: int
    zombie_cycles: int
    zombie_runs: int
    zombie_dispatcher_cycles: int
    duplicate_runs: int
    duplicate_threads: int
    delayed_runs: int  # per case (expired, policy changed, evidence changed)
    policy_runs: int  # per group
    policy_changes: int
    upgrade_runs: int
    upgrade_kills: int  # old-release operators killed mid-flight
    ambiguous_runs: int  # per fault
    ambiguous_kills: int
    restart_runs: int
    restarts: int  # API server and etcd restarts, alternating
    restore_rounds: int
    restore_runs: int  # per group
    bad_runs: int
    min_total_kills: int = 0  # acceptance: kill points across all scenarios


SIZES = {
    "ci": Size(
        name="ci",
        crash_chains=4,
        crash_batch=3,
        crash_sweep=1,
        crash_extra=1,
        dispatch_rounds=1,
        dispatch_runs=6,
        zombie_cycles=1,
        zombie_runs=6,
        zombie_dispatcher_cycles=2,
        duplicate_runs=4,
        duplicate_threads=4,
        delayed_runs=2,
        policy_runs=2,
        policy_changes=2,
        upgrade_runs=2,
        upgrade_kills=2,
        ambiguous_runs=2,
        ambiguous_kills=2,
        restart_runs=6,
        restarts=2,
        restore_rounds=1,
        restore_runs=2,
        bad_runs=2,
    ),
    "full": Size(
        name="full",
        # 8 chains x 10 points x 2 phases: N = 1..75 (every write of a 5-run batch), before and after.
        crash_chains=8,
        crash_batch=5,
        crash_sweep=10,
        crash_extra=3,
        dispatch_rounds=8,
        dispatch_runs=8,
        zombie_cycles=10,
        zombie_runs=8,
        zombie_dispatcher_cycles=3,
        duplicate_runs=16,
        duplicate_threads=8,
        delayed_runs=6,
        policy_runs=6,
        policy_changes=5,
        upgrade_runs=6,
        upgrade_kills=10,
        ambiguous_runs=6,
        ambiguous_kills=12,
        restart_runs=36,
        restarts=12,
        restore_rounds=3,
        restore_runs=4,
        bad_runs=6,
        min_total_kills=500,
    ),
}


def chaos_size() -> Size:
    """The size named by DURABLE_AGENTS_CHAOS_SIZE, with DURABLE_AGENTS_CHAOS_TUNE overrides
    (``crash_chains=4,restarts=6``: for tuning on another machine, not for CI)."""
    name = os.environ.get(SIZE_ENV, "ci") or "ci"
    if name not in SIZES:
        raise ValueError(f"{SIZE_ENV} must be one of {sorted(SIZES)}, got {name!r}")
    size = SIZES[name]
    tune = os.environ.get(TUNE_ENV, "")
    overrides = dict(item.split("=", 1) for item in tune.split(",") if item.strip())
    unknown = set(overrides) - set(Size.__dataclass_fields__) - {"name"}
    if unknown:
        raise ValueError(f"{TUNE_ENV}: unknown knobs {sorted(unknown)}")
    knobs: dict[str, Any] = {k.strip(): int(v) for k, v in overrides.items()}
    return replace(size, **knobs)


def output_path() -> Path:
    env = os.environ.get(OUT_ENV)
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"durable-agents-chaos-{chaos_size().name}.json"


# --- report ----------------------------------------------------------------------------------


@dataclass
class ScenarioResult:
    scenario: str
    runs: int = 0
    kills: int = 0
    faults: int = 0  # injected faults that are not process deaths: freezes, bad answers, duplicates
    duplicates: list[str] = field(default_factory=list)  # idempotency keys applied more than once
    business_duplicates: list[str] = field(default_factory=list)  # one run's payment made twice
    stuck: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    passed: bool = False
    known_issue: str | None = None  # a known operator bug this scenario shows (the test is xfail)

    @property
    def duplicated_effects(self) -> int:
        """Effects applied more than once: every payment carries an invoice, and a duplicate key is
        a duplicate invoice too, unless the same invoice went out under two keys."""
        return max(len(self.duplicates), len(self.business_duplicates))


class ChaosReport:
    """Results of every scenario of this session: printed as a table, written as JSON."""

    def __init__(self, size: Size, seed: int) -> None:
        self.size = size
        self.seed = seed
        self.results: list[ScenarioResult] = []
        self.started = datetime.now(UTC)

    def add(self, result: ScenarioResult) -> None:
        self.results.append(result)

    @property
    def total_kills(self) -> int:
        return sum(r.kills for r in self.results)

    def acceptance(self) -> dict[str, Any]:
        """The full size's acceptance: enough kill points, no duplicate, no stuck run, nothing failed."""
        duplicates = sum(r.duplicated_effects for r in self.results)
        stuck = sum(len(r.stuck) for r in self.results)
        known = [r.scenario for r in self.results if not r.passed and r.known_issue]
        failed = [r.scenario for r in self.results if not r.passed and not r.known_issue]
        return {
            "killsRequired": self.size.min_total_kills,
            "kills": self.total_kills,
            "duplicates": duplicates,
            "stuck": stuck,
            "failed": failed,
            "knownBugs": known,
            "met": self.total_kills >= self.size.min_total_kills
            and not (duplicates or stuck or failed or known),
        }

    def verdict(self) -> str:
        failed = [r for r in self.results if not r.passed and not r.known_issue]
        known = [r for r in self.results if not r.passed and r.known_issue]
        return "FAILED" if failed else (f"{len(known)} KNOWN BUG(S)" if known else "ok")

    def table(self) -> str:
        header = ("scenario", "runs", "kills", "faults", "duplicates", "stuck runs", "wall time", "result")
        rows = [
            (
                r.scenario,
                str(r.runs),
                str(r.kills),
                str(r.faults),
                str(r.duplicated_effects),
                str(len(r.stuck)),
                f"{r.wall_seconds:.1f}s",
                "ok" if r.passed else ("KNOWN BUG" if r.known_issue else "FAILED"),
            )
            for r in self.results
        ]
        total = (
            "total",
            str(sum(r.runs for r in self.results)),
            str(self.total_kills),
            str(sum(r.faults for r in self.results)),
            str(sum(r.duplicated_effects for r in self.results)),
            str(sum(len(r.stuck) for r in self.results)),
            f"{sum(r.wall_seconds for r in self.results):.1f}s",
            self.verdict(),
        )
        widths = [max(len(row[i]) for row in (header, *rows, total)) for i in range(len(header))]

        def line(row: tuple[str, ...]) -> str:
            cells = enumerate(zip(row, widths, strict=True))
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in cells)

        rule = "  ".join("-" * w for w in widths)
        return "\n".join([line(header), rule, *(line(r) for r in rows), rule, line(total)])

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size.name,
            "seed": self.seed,
            "knobs": asdict(self.size),
            "startedAt": self.started.isoformat(),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "totals": {
                "runs": sum(r.runs for r in self.results),
                "kills": self.total_kills,
                "duplicates": sum(r.duplicated_effects for r in self.results),
                "stuck": sum(len(r.stuck) for r in self.results),
                "wallSeconds": round(sum(r.wall_seconds for r in self.results), 1),
                "minKillsRequired": self.size.min_total_kills,
            },
            "acceptance": self.acceptance(),
            "scenarios": [asdict(r) | {"wall_seconds": round(r.wall_seconds, 1)} for r in self.results],
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


class DuplicateEffects(AssertionError):
    """The authoritative system applied an effect more than once: global assertion (2) failed."""


# --- the lab: namespaces, operators, kills ---------------------------------------------------


def _ignore_conflict(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except ApiException as err:
        if err.status != 409:
            raise


def grant_operator_rules(api: client.ApiClient, rules_file: Path) -> None:
    """The operator's user gets exactly the chart's ClusterRole rules (as e2e/conftest.py does)."""
    rules = yaml.safe_load(rules_file.read_text())
    rbac = client.RbacAuthorizationV1Api(api)
    role = {"metadata": {"name": OPERATOR_USER}, "rules": rules}
    binding = {
        "metadata": {"name": OPERATOR_USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR_USER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}],
    }
    _ignore_conflict(lambda: rbac.create_cluster_role(role))
    _ignore_conflict(lambda: rbac.create_cluster_role_binding(binding))


def prepare_namespace(api: client.ApiClient, name: str, *, approvers: bool = False) -> None:
    """A namespace whose default ServiceAccount may read the settings ConfigMap; with approvers,
    the group ``approvers`` may approve AgentRuns and ``editors`` may only edit them."""
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    _ignore_conflict(
        lambda: core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    )
    _ignore_conflict(
        lambda: core.create_namespaced_config_map(
            name, {"metadata": {"name": SETTINGS_CONFIGMAP}, "data": {"maxSurge": "25%"}}
        )
    )
    role = {
        "metadata": {"name": "read-settings"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
    }
    _ignore_conflict(lambda: rbac.create_namespaced_role(name, role))
    binding = {
        "metadata": {"name": "read-settings"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-settings"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": name}],
    }
    _ignore_conflict(lambda: rbac.create_namespaced_role_binding(name, binding))
    if not approvers:
        return
    for who, verbs in (
        ("approver", ["get", "list", "create", "patch", "approve"]),
        ("editor", ["get", "list", "create", "patch"]),
    ):
        body = {
            "metadata": {"name": f"agentrun-{who}"},
            "rules": [{"apiGroups": [GROUP], "resources": ["agentruns"], "verbs": verbs}],
        }
        _ignore_conflict(lambda body=body: rbac.create_namespaced_role(name, body))  # type: ignore[misc]
        bind = {
            "metadata": {"name": f"agentrun-{who}s"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"agentrun-{who}"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": f"{who}s"}],
        }
        _ignore_conflict(lambda bind=bind: rbac.create_namespaced_role_binding(name, bind))  # type: ignore[misc]


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

    def create(self, namespace: str, spec: dict[str, Any], name: str | None = None) -> str:
        created = self.runs(namespace).create(spec, name=name)
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
        """An operator process watching ``namespace``. ``warm`` (default: unless it serves the
        webhook or runs another release's code) forks it from the lab's :class:`ForkServer`."""
        env.setdefault("DURABLE_AGENTS_NAMESPACE", namespace)
        kubeconfig = kubeconfig or self.operator_kubeconfig
        if warm is None:
            warm = "DURABLE_AGENTS_WEBHOOK_PORT" not in env and "PYTHONPATH" not in env
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
        wait_for(lambda: "admission webhook serving" in op.log_tail(200), 30, "the admission webhook")
        return op

    def kill(self, op: OperatorProcess) -> None:
        """SIGKILL from the test (counted)."""
        assert op.alive, f"operator {op.identity} is already dead:\n{op.log_tail(30)}"
        op.kill()
        self.count_kill()

    def await_hook_kill(self, op: OperatorProcess, give_up: Callable[[], bool], timeout: float) -> bool:
        """Wait until the commit hook kills ``op`` (True, counted), or until ``give_up()`` holds
        while it is alive (False: stopped; its kill point was never reached)."""
        deadline = time.monotonic() + timeout
        checked = 0.0
        while op.alive:
            # Dying is checked often (a kill is cheap to notice); the work less so (a list call).
            if time.monotonic() - checked > 0.5:
                if give_up():
                    break
                checked = time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"operator {op.identity} neither reached its kill point nor finished its work "
                    f"within {timeout:.0f}s; log:\n{op.log_tail(30)}"
                )
            time.sleep(0.02)
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


# --- warm starts ----------------------------------------------------------------------------

_FORK_SERVER = r"""
import json, os, random, select, sys, traceback
import durable_agents_controllers.__main__ as entry
from kubernetes.config import kube_config

def child(request):
    code = 1
    try:
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        os.environ.clear()
        os.environ.update(request["env"])
        # Read from the environment at import time: set it as a fresh import would have.
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = os.environ.get("KUBECONFIG", "~/.kube/config")
        random.seed()
        entry.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)

print("ready", flush=True)
while True:
    readable, _, _ = select.select([sys.stdin], [], [], 0.02)
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        print(f"exit {pid} {os.waitstatus_to_exitcode(status)}", flush=True)
    if readable:
        line = sys.stdin.readline()
        if not line:
            break
        pid = os.fork()
        if pid == 0:
            child(json.loads(line))
        print(f"started {pid}", flush=True)
"""


class ForkServer:
    """Starts operator processes by forking an interpreter that has already imported the operator.

    Each operator is still a fresh OS process that knows nothing but what it reads from the API
    server; only the import (about a second of CPU per process) is done once. A kill chain of
    hundreds of processes on two cores is bound by exactly that second. What modules read from
    the environment at import time is set again in the child (the kubeconfig location); the
    admission webhook is chosen at import time, so warm-started operators never serve it.
    """

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _FORK_SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, **(env or {})},
            text=True,
            bufsize=1,
        )
        self.exits: dict[int, int] = {}
        self._started: queue.Queue[int] = queue.Queue()
        self._spawning = threading.Lock()  # one request and its answer at a time
        self._changed = threading.Condition()  # exits, recorded by the reader thread
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the fork server did not start")
        self._reader = threading.Thread(target=self._read, name="fork-server", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, _, rest = line.strip().partition(" ")
            if kind == "started":
                self._started.put(int(rest))
            elif kind == "exit":
                pid, code = rest.split()
                with self._changed:
                    self.exits[int(pid)] = int(code)
                    self._changed.notify_all()

    def spawn(self, env: dict[str, str], log: Path) -> int:
        assert self.proc.stdin is not None
        with self._spawning:
            self.proc.stdin.write(json.dumps({"env": env, "log": str(log)}) + "\n")
            self.proc.stdin.flush()
            return self._started.get(timeout=30)

    def wait(self, pid: int, timeout: float) -> int:
        with self._changed:
            if not self._changed.wait_for(lambda: pid in self.exits, timeout):
                raise subprocess.TimeoutExpired(f"operator pid {pid}", timeout)
            return self.exits[pid]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class WarmOperator(OperatorProcess):
    """An :class:`OperatorProcess` forked by a :class:`ForkServer` instead of exec'd."""

    def __init__(self, server: ForkServer, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server = server
        self._pid: int | None = None

    def start(self, timeout: float = 60.0) -> OperatorProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._pid = self.server.spawn(self.environment(), self.log_path)
        self.await_ready(timeout)
        return self

    @property
    def pid(self) -> int:
        assert self._pid is not None
        return self._pid

    @property
    def alive(self) -> bool:
        return self._pid is not None and self._pid not in self.server.exits

    def wait_exit(self, timeout: float) -> int:
        return self.server.wait(self.pid, timeout)


# --- run specs -------------------------------------------------------------------------------

READ = {
    "name": "read-settings",
    "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": SETTINGS_CONFIGMAP}},
}
DONE = {"name": "done", "complete": {"result": "ok"}}


def ask(expires: str = "1h", name: str = "confirm") -> dict[str, Any]:
    return {"name": name, "ask": {"question": "proceed?", "expiresIn": expires}}


def await_event(event: str = "window-open", expires: str = "1h") -> dict[str, Any]:
    return {"name": "window", "await": {"event": event, "expiresIn": expires}}


def pay(url: str, invoice: str, amount: int = 10, name: str = "pay") -> dict[str, Any]:
    """An http.post effect to the reference system; ``invoice`` identifies the payment in the
    business sense, so a payment made twice under two idempotency keys is caught too."""
    return {
        "name": name,
        "effect": {
            "effect": "http.post",
            "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
            "arguments": {"invoice": invoice, "amount": amount},
        },
    }


def run_spec(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"taskType": "chaos", "objective": "survive whatever happens", "steps": list(steps), **extra}


def policy_body(name: str, version: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": name},
        "spec": {"version": version, **spec},
    }


def apply_policy(kube: KubeEnv, namespace: str, name: str, version: str, **spec: Any) -> None:
    """Create the AgentPolicy, or replace its spec (as a GitOps pipeline would)."""
    custom = kube.custom()
    body = policy_body(name, version, **spec)
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", body)
    except ApiException as err:
        if err.status != 409:
            raise
        current = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", name)
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        custom.replace_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", name, body)


# --- answering what runs wait for ------------------------------------------------------------


def events_of(run: dict[str, Any]) -> list[str]:
    return [h["event"] for h in (run.get("status") or {}).get("history", [])]


def _checkpoint(run: dict[str, Any]) -> dict[str, Any]:
    cp = (run.get("status") or {}).get("checkpoint")
    return cp if isinstance(cp, dict) else {}


class Responder:
    """A thread that delivers what parked runs wait for: answers, events and (with an approver's
    client) approvals. ``copies`` > 1 delivers each one that many times, concurrently."""

    def __init__(
        self,
        kube: KubeEnv,
        namespaces: list[str],
        *,
        approver: client.ApiClient | None = None,
        copies: int = 1,
        interval: float = 0.2,
        skip: Callable[[dict[str, Any]], bool] = lambda run: False,
    ) -> None:
        self.kube = kube
        self.namespaces = namespaces
        self.approver = approver
        self.copies = copies
        self.interval = interval
        self.skip = skip
        self.delivered = 0
        self.refused = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="responder", daemon=True)

    def __enter__(self) -> Responder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            for ns in self.namespaces:
                try:
                    items = self.kube.custom().list_namespaced_custom_object(GROUP, VERSION, ns, "agentruns")[
                        "items"
                    ]
                except Exception as err:  # the API server may be restarting: try again later
                    self.errors.append(f"list: {type(err).__name__}")
                    continue
                for run in items:
                    if self.skip(run):
                        continue
                    patch = self.response_to(run)
                    if patch is not None:
                        self._deliver(ns, run, patch)

    def response_to(self, run: dict[str, Any]) -> tuple[dict[str, Any], bool] | None:
        """The spec patch a run waits for, and whether an approver must send it."""
        status = run.get("status") or {}
        spec = run.get("spec") or {}
        kind, _, what = str(status.get("waitingFor") or "").partition(":")
        state = status.get("state")
        if state == "waiting_input" and kind == "input" and what not in (spec.get("answers") or {}):
            return {"spec": {"answers": {what: "yes"}}}, False
        if state == "waiting_external" and kind == "event" and what not in (spec.get("events") or {}):
            return {"spec": {"events": {what: "now"}}}, False
        if state == "waiting_approval" and self.approver is not None:
            request = status.get("approvalRequest") or {}
            rid = request.get("requestId")
            if rid and rid not in (spec.get("approvals") or {}):
                decision = {"digest": request["digest"], "decision": "approve"}
                return {"spec": {"approvals": {rid: decision}}}, True
        return None

    def _deliver(self, namespace: str, run: dict[str, Any], patch: tuple[dict[str, Any], bool]) -> None:
        body, by_approver = patch
        api = self.approver if by_approver else None
        name = run["metadata"]["name"]

        def send() -> None:
            try:
                self.kube.custom(api).patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, "agentruns", name, body
                )
                self.delivered += 1
            except ApiException as err:
                self.refused += 1
                if err.status not in (403, 409, 422, 500):
                    self.errors.append(f"{name}: {err.status} {err.reason}")
            except Exception as err:  # connection refused during a restart
                self.errors.append(f"{name}: {type(err).__name__}")

        if self.copies == 1:
            send()
            return
        threads = [threading.Thread(target=send) for _ in range(self.copies)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)


# --- the global assertions -------------------------------------------------------------------


def _when(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def wait_expiry(run: dict[str, Any]) -> datetime | None:
    """When the wait a run is in expires (None: it has no expiry)."""
    status = run.get("status") or {}
    cp = _checkpoint(run)
    state = status.get("state")
    if state == "waiting_input":
        return _when((cp.get("pendingInput") or {}).get("expiresAt"))
    if state == "waiting_external":
        return _when((cp.get("pendingExternal") or {}).get("expiresAt"))
    if state == "waiting_approval":
        return _when((status.get("approvalRequest") or {}).get("expiresAt"))
    if state == "waiting_retry":
        return _when(status.get("retryAt"))
    return None


def live_leases(kube: KubeEnv, namespace: str, now: datetime) -> dict[str, str]:
    """Run name -> holder, for the run Leases in ``namespace`` that are held and not expired."""
    out: dict[str, str] = {}
    for lease in client.CoordinationV1Api(kube.api).list_namespaced_lease(namespace).items:
        run = (lease.metadata.labels or {}).get(RUN_LABEL)
        spec = lease.spec
        if not run or not spec.holder_identity:
            continue
        renewed = spec.renew_time or spec.acquire_time
        if renewed is not None and renewed + timedelta(seconds=spec.lease_duration_seconds or 0) > now:
            out[run] = spec.holder_identity
    return out


def action_states(kube: KubeEnv, namespace: str) -> dict[str, str]:
    records = kube.custom().list_namespaced_custom_object(GROUP, VERSION, namespace, "actionrecords")
    return {r["metadata"]["name"]: (r.get("status") or {}).get("state", "intent") for r in records["items"]}


def settled(run: dict[str, Any], now: datetime) -> bool:
    """Terminal, quarantined, or parked in a wait that has an expiry still ahead (or just passed)."""
    state = (run.get("status") or {}).get("state")
    if state in TERMINAL or state == "quarantined":
        return True
    expiry = wait_expiry(run)
    return state in WAITING and expiry is not None and expiry > now - EXPIRY_GRACE


def ownership(
    run: dict[str, Any], now: datetime, leases: dict[str, str], records: dict[str, str]
) -> str | None:
    """Why this run is terminal or in an owned recovery state, or None: it is stuck."""
    status = run.get("status") or {}
    state = status.get("state") or "pending"
    name = run["metadata"]["name"]
    if state in TERMINAL:
        return "terminal"
    if state == "quarantined":
        return "quarantined"
    expiry = wait_expiry(run)
    if state in WAITING and expiry is not None and expiry > now - EXPIRY_GRACE:
        return f"waiting until {expiry.isoformat()}"
    if state in IN_PROGRESS and name in leases:
        return f"{state} under the live Lease of {leases[name]}"
    pending = [p.get("actionRecordName") for p in _checkpoint(run).get("pendingActions") or []]
    if (
        state == "waiting_external"
        and pending
        and all(
            records.get(str(p), "missing") in ("intent", "dispatching", "outcome_unknown") for p in pending
        )
    ):
        # No expiry on purpose (an unknown outcome is never assumed): the ledger owns it.
        return "waiting on the action ledger"
    return None


def describe(run: dict[str, Any]) -> str:
    status = run.get("status") or {}
    return (
        f"{run['metadata']['namespace']}/{run['metadata']['name']}: {status.get('state')!r} "
        f"v{status.get('stateVersion')} since {status.get('stateSince')} "
        f"outcome={status.get('outcome')} last={events_of(run)[-3:]}"
    )


def settle(kube: KubeEnv, namespaces: list[str], timeout: float) -> list[str]:
    """Wait (bounded) until every run is settled, then list the runs that are not owned (stuck)."""
    deadline = time.monotonic() + timeout
    while True:
        now = datetime.now(UTC)
        runs = [r for ns in namespaces for r in Runs(kube, ns).all()]
        if all(settled(r, now) for r in runs) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    now = datetime.now(UTC)
    stuck: list[str] = []
    for ns in namespaces:
        leases = live_leases(kube, ns, now)
        records = action_states(kube, ns)
        for run in Runs(kube, ns).all():
            if ownership(run, now, leases, records) is None:
                stuck.append(describe(run))
    return stuck


def business_duplicates(refsystem: ReferenceSystemThread) -> list[str]:
    """Invoices paid more than once, whatever idempotency keys they were sent with."""
    paid = Counter(str(r.body.get("invoice")) for r in refsystem.records() if isinstance(r.body, dict))
    return sorted(invoice for invoice, n in paid.items() if n > 1)


def assert_history_consistent(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Gapless state versions; one holder per lease epoch; epochs never go back."""
    history: list[dict[str, Any]] = run["status"]["history"]
    versions = [h["stateVersion"] for h in history]
    name = run["metadata"]["name"]
    assert versions == list(range(1, len(history) + 1)), f"{name}: state versions not gapless: {versions}"
    per_epoch: dict[int, set[str]] = {}
    for h in history:
        # A quarantine is committed by a worker that cannot read the checkpoint, hence not its
        # epoch either: its Lease epoch starts over (a known weakness, reported, not hidden here:
        # the entry is still checked for order below).
        if h["event"] != "quarantine":
            per_epoch.setdefault(h["epoch"], set()).add(h["holder"])
    assert all(len(v) == 1 for v in per_epoch.values()), f"{name}: two holders in one epoch: {per_epoch}"
    epochs = [h["epoch"] for h in history]
    assert epochs == sorted(epochs), f"{name}: lease epochs went back: {epochs}"
    return history


# --- backups ---------------------------------------------------------------------------------

_SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink")


def export_objects(kube: KubeEnv, namespace: str) -> dict[str, list[dict[str, Any]]]:
    """What a backup tool stores: every AgentRun and ActionRecord of the namespace, with status."""
    custom = kube.custom()
    return {
        plural: custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
        for plural in ("agentruns", "actionrecords")
    }


def restore_objects(kube: KubeEnv, namespace: str, backup: dict[str, list[dict[str, Any]]]) -> int:
    """Restore a backup as a restore tool does: create each object (the API server assigns new UIDs
    and resourceVersions), then write its status through the status subresource."""
    custom = kube.custom()
    restored = 0
    for plural in ("agentruns", "actionrecords"):
        for obj in backup[plural]:
            meta = {k: v for k, v in obj["metadata"].items() if k not in _SERVER_FIELDS}
            meta["namespace"] = namespace
            body = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": meta}
            body["spec"] = obj["spec"]
            created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
            if obj.get("status"):
                created["status"] = obj["status"]
                custom.replace_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, plural, meta["name"], created
                )
            restored += 1
    return restored


# --- small helpers ---------------------------------------------------------------------------


def retrying(fn: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Call ``fn`` until it stops failing with a connection error (the API server restarts)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Exception as err:  # urllib3 raises several kinds while the server is down
            if isinstance(err, ApiException) and err.status not in (0, 429, 500, 503, 504):
                raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: still failing after {timeout:.0f}s: {err}") from err
            time.sleep(0.2)


def chaos_seed() -> int:
    """The seed of this session's random choices: DURABLE_AGENTS_CHAOS_SEED to replay one."""
    return int(os.environ.get("DURABLE_AGENTS_CHAOS_SEED") or time.time_ns() % 1_000_000)


__all__ = [
    "DONE",
    "EXPIRY_GRACE",
    "IN_PROGRESS",
    "OPERATOR_USER",
    "OUT_ENV",
    "READ",
    "SETTINGS_CONFIGMAP",
    "SIZES",
    "SIZE_ENV",
    "TERMINAL",
    "TUNE_ENV",
    "WAITING",
    "ChaosReport",
    "DuplicateEffects",
    "ForkServer",
    "Lab",
    "Responder",
    "ScenarioResult",
    "Size",
    "WarmOperator",
    "action_states",
    "apply_policy",
    "ask",
    "assert_history_consistent",
    "await_event",
    "business_duplicates",
    "chaos_seed",
    "chaos_size",
    "describe",
    "events_of",
    "export_objects",
    "grant_operator_rules",
    "live_leases",
    "output_path",
    "ownership",
    "pay",
    "policy_body",
    "prepare_namespace",
    "restore_objects",
    "retrying",
    "run_spec",
    "settle",
    "settled",
    "wait_expiry",
]
