"""A real Kubernetes control plane as local processes, the way controller-runtime's envtest does it.

This module owns the lifecycle of ``etcd``, ``kube-apiserver`` and (optionally)
``kube-controller-manager`` started from the binaries ``hack/build.sh`` builds: choosing free
ports, writing the PKI and kubeconfigs, starting each process in its own process group with its
log in the work directory, waiting for real readiness (etcd ``/health``, apiserver ``/readyz``,
controller-manager ``/healthz``) under bounded deadlines, restarting a component in place (chaos
tests), and stopping everything so that no process is left behind.

Two modes share the code. In-process (tests): the plane belongs to this Python process and is
also stopped at interpreter exit. Detached (the test kit's ``localcluster.cli``): the processes
outlive the CLI, and a ``state.json`` in the work directory lets a later invocation
(:meth:`LocalControlPlane.attach`) check or stop them. The state file is written in both modes,
so a test run killed hard can still be cleaned up with ``durable-agents-cluster down --dir``.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import fcntl
import http.client
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from durable_agents.shell.ground.certs import KeyPair, issue_leaf
from durable_agents_testkit.eventually import eventually
from durable_agents_testkit.localcluster.certs import ClusterPKI, PKIPaths, write_file

ETCD = "etcd"
APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
KUBECTL = "kubectl"

# Garbage collection (owner references), namespace deletion, the default ServiceAccount of each
# namespace, and aggregation of the built-in view/edit/admin roles.
DEFAULT_CONTROLLERS: tuple[str, ...] = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "clusterrole-aggregation-controller",
)

STATE_FILE = "state.json"
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
"""
ADMIN_USER = "durable-agents-admin"
CONTEXT_NAME = "durable-agents-local"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"

# What kube-apiserver encrypts before it reaches etcd (EncryptionConfiguration): the runs, the
# ledger and Secrets. aescbc with a local key, as a cluster without a KMS would; docs/security/data-at-rest.md
# shows the KMS v2 configuration a production cluster uses instead.
ENCRYPTED_RESOURCES = ("agentruns.durable-agents.io", "actionrecords.durable-agents.io", "secrets")
ENCRYPTION_KEY_NAME = "local-1"

_STATE_VERSION = 1
_POLL_INTERVAL = 0.1
_LOG_TAIL_LINES = 40
# Bounded waits around SIGTERM / SIGKILL; the Go binaries exit well within these.
_TERM_GRACE = 15.0
_KILL_GRACE = 10.0


@dataclass(frozen=True)
class NodeAccess:
    """How a plane serves a real node (:mod:`.node`); None (the default) keeps it on loopback.

    A kubelet refuses a loopback node IP and Endpoints refuse loopback addresses, so the API
    server binds and advertises ``address`` (on a device the node test bed made), hands out
    Service IPs from ``service_cluster_ip_range``, and runs as a cluster with nodes does:
    ServiceAccount admission on, ``Node,RBAC`` authorization with ``NodeRestriction``, a client
    certificate for the kubelets (logs, exec), and the controller manager's flex-volume
    directory under the plane (it would otherwise create ``/usr/libexec/kubernetes``).
    """

    address: str
    service_cluster_ip_range: str
    kubernetes_service_ip: str


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or stopped."""


class BinariesNotFound(ControlPlaneError):
    """Neither ``DURABLE_AGENTS_BIN_DIR`` nor ``hack/build.sh`` produced the binaries."""


# ---------------------------------------------------------------------------------------------
# Binaries


def find_repo_root(start: Path | None = None) -> Path | None:
    """The nearest ancestor of ``start`` (default: this file) holding ``hack/build.sh``."""
    here = (start or Path(__file__)).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "hack" / "build.sh").is_file():
            return candidate
    return None


def _cache_dir() -> Path:
    # Mirrors hack/build.sh, only to place the build lock next to the cache it protects.
    if env := os.environ.get("DURABLE_AGENTS_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "durable-agents"


def _check_bin_dir(bin_dir: Path, names: Sequence[str], source: str) -> Path:
    missing = [n for n in names if not os.access(bin_dir / n, os.X_OK)]
    if missing:
        raise BinariesNotFound(f"{source}: {bin_dir} lacks executable {', '.join(missing)}")
    return bin_dir


def ensure_binaries(
    *, controller_manager: bool = True, extra: Sequence[str] = (), node: bool = False
) -> Path:
    """The directory holding etcd, kube-apiserver, kubectl (and kube-controller-manager, and the
    ``extra`` names; ``node``: built with ``WITH_NODE=1``, for the node test bed).

    ``DURABLE_AGENTS_BIN_DIR`` wins when set. Otherwise ``hack/build.sh`` is run (it returns at
    once when everything is cached; the first build on a machine takes many minutes) and its
    last stdout line is the directory. A file lock serialises concurrent Python callers, so two
    test processes never build the same binary at the same time.
    """
    names = [ETCD, APISERVER, KUBECTL, *([CONTROLLER_MANAGER] if controller_manager else []), *extra]
    env = os.environ.get("DURABLE_AGENTS_BIN_DIR")
    if env and (not node or all(os.access(Path(env) / n, os.X_OK) for n in names)):
        return _check_bin_dir(Path(env), names, "DURABLE_AGENTS_BIN_DIR")
    root = find_repo_root()
    if root is None:
        raise BinariesNotFound(
            "set DURABLE_AGENTS_BIN_DIR to a directory with etcd and kube-apiserver, "
            "or run from a checkout that has hack/build.sh"
        )
    env_vars = dict(os.environ, WITH_CONTROLLER_MANAGER="1" if controller_manager else "0")
    if node:
        env_vars["WITH_NODE"] = "1"
    lock_path = _cache_dir() / "build.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # stderr is inherited: a first-time build reports its progress to whoever is watching.
        result = subprocess.run(
            ["bash", str(root / "hack" / "build.sh")],
            stdout=subprocess.PIPE,
            text=True,
            env=env_vars,
            check=False,
        )
    lines = [ln.strip() for ln in result.stdout.splitlines() if ln.strip()]
    if result.returncode != 0 or not lines:
        raise BinariesNotFound(f"hack/build.sh failed with exit code {result.returncode}")
    return _check_bin_dir(Path(lines[-1]), names, "hack/build.sh")


# ---------------------------------------------------------------------------------------------
# Processes


def _free_ports(count: int) -> list[int]:
    # All sockets stay open until every port is chosen, so the kernel cannot hand out one twice.
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _proc_start_ticks(pid: int) -> int | None:
    """The kernel start time of ``pid`` (guards against pid reuse), None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; fields resume after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ManagedProcess:
    """One component process: how it was started and how to recognise it later."""

    name: str
    argv: list[str]
    log_path: Path
    pid: int = 0
    start_ticks: int | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def spawn(self, env: Mapping[str, str] | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n===== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {self.name} =====\n".encode())
            log.flush()
            # Own session = own process group: stop() signals the whole group, and a Ctrl-C in
            # the terminal that ran the CLI does not reach a detached plane.
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(env) if env is not None else None,
            )
        self.pid = self.popen.pid
        self.start_ticks = _proc_start_ticks(self.pid)

    def alive(self) -> bool:
        if self.pid <= 0:
            return False
        if self.popen is not None:
            return self.popen.poll() is None
        ticks = _proc_start_ticks(self.pid)
        return ticks is not None and (self.start_ticks is None or ticks == self.start_ticks)

    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def _signal_group(self, sig: signal.Signals) -> None:
        # Only while the leader is known alive: an unreaped child keeps its pid reserved, but
        # a pid that is gone may already belong to an unrelated process group.
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def _wait_gone(self, timeout: float) -> bool:
        if self.popen is not None:
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        try:
            eventually(lambda: not self.alive(), timeout, f"{self.name} to exit", interval=_POLL_INTERVAL)
        except TimeoutError:
            return False
        return True

    def terminate(self, *, graceful: bool = True) -> None:
        """SIGTERM (unless not ``graceful``), a bounded wait, then SIGKILL; raises if it survives."""
        if self.pid <= 0:
            return
        if graceful:
            self._signal_group(signal.SIGTERM)
            if self._wait_gone(_TERM_GRACE):
                return
        self._signal_group(signal.SIGKILL)
        if not self._wait_gone(_KILL_GRACE):
            raise ControlPlaneError(f"{self.name} (pid {self.pid}) survived SIGKILL")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "argv": self.argv,
            "log_path": str(self.log_path),
            "pid": self.pid,
            "start_ticks": self.start_ticks,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ManagedProcess:
        return cls(
            name=str(data["name"]),
            argv=[str(a) for a in data["argv"]],
            log_path=Path(data["log_path"]),
            pid=int(data["pid"]),
            start_ticks=None if data.get("start_ticks") is None else int(data["start_ticks"]),
        )


# ---------------------------------------------------------------------------------------------
# Kubeconfig


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def kubeconfig_document(server_url: str, ca_pem: bytes, user: str, client: KeyPair) -> dict[str, Any]:
    """A self-contained kubeconfig (certificates embedded) for one client-certificate user."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT_NAME,
                "cluster": {"server": server_url, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert_pem),
                    "client-key-data": _b64(client.key_pem),
                },
            }
        ],
        "contexts": [{"name": CONTEXT_NAME, "context": {"cluster": CONTEXT_NAME, "user": user}}],
        "current-context": CONTEXT_NAME,
    }


def _safe_file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "user"


# ---------------------------------------------------------------------------------------------
# The plane


@dataclass
class Ports:
    """The loopback ports the plane listens on; kept across component restarts."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int

    @classmethod
    def pick(cls) -> Ports:
        a, b, c, d = _free_ports(4)
        return cls(a, b, c, d)


_live_planes: set[LocalControlPlane] = set()
_live_lock = threading.Lock()


def _stop_live_planes() -> None:
    with _live_lock:
        planes = list(_live_planes)
    for plane in planes:
        with contextlib.suppress(Exception):
            plane.stop()


atexit.register(_stop_live_planes)


class LocalControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) on loopback, with client-cert users.

    ``work_dir`` defaults to a fresh temporary directory, removed again by :meth:`stop` unless
    ``keep_work_dir`` (and kept when :meth:`start` fails, for its logs). ``fsync=False`` runs
    etcd with ``--unsafe-no-fsync`` (fast tests; numbers from it are not durable-write numbers).
    ``detach=True`` leaves the processes running when this Python process exits (the CLI);
    otherwise they are stopped at interpreter exit too.
    """

    def __init__(
        self,
        work_dir: Path | str | None = None,
        *,
        fsync: bool = False,
        audit: bool = True,
        controller_manager: bool = True,
        controllers: Sequence[str] = DEFAULT_CONTROLLERS,
        bin_dir: Path | str | None = None,
        detach: bool = False,
        keep_work_dir: bool = False,
        startup_timeout: float = 120.0,
        node_access: NodeAccess | None = None,
    ) -> None:
        self._work_dir = Path(work_dir).resolve() if work_dir is not None else None
        self.node_access = node_access
        self._owns_work_dir = work_dir is None
        self.fsync = fsync
        self.audit = audit
        self.controller_manager = controller_manager
        self.controllers = tuple(controllers)
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None
        self.detach = detach
        self.keep_work_dir = keep_work_dir
        self.startup_timeout = startup_timeout
        self._ports: Ports | None = None
        self._processes: dict[str, ManagedProcess] = {}
        self._started = False
        self._lock = threading.RLock()
        self.startup_seconds: float | None = None
        """Wall time of the last :meth:`start` (PKI, spawn and readiness of every component)."""

    # -- properties ----------------------------------------------------------------------------

    @property
    def work_dir(self) -> Path:
        if self._work_dir is None:
            raise ControlPlaneError("the control plane has no work directory until start()")
        return self._work_dir

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = ensure_binaries(controller_manager=self.controller_manager)
        return self._bin_dir

    @property
    def ports(self) -> Ports:
        if self._ports is None:
            raise ControlPlaneError("the control plane has not been started")
        return self._ports

    @property
    def server_url(self) -> str:
        host = self.node_access.address if self.node_access is not None else "127.0.0.1"
        return f"https://{host}:{self.ports.apiserver}"

    @property
    def etcd_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.etcd_client}"

    @property
    def etcd_certs_dir(self) -> Path:
        """etcd's serving certificate and the client certificate of whoever may talk to etcd."""
        return self.work_dir / "etcd-certs"

    @property
    def encryption_config_path(self) -> Path:
        return self.work_dir / "encryption-config.yaml"

    @property
    def audit_log_path(self) -> Path:
        return self.work_dir / "logs" / "audit.log"

    @property
    def kubeconfig_path(self) -> Path:
        """Kubeconfig of the admin user (group ``system:masters``)."""
        return self.work_dir / "admin.kubeconfig"

    @property
    def kubelet_client_cert_dir(self) -> Path:
        """The API server's client certificate for kubelets (only with ``node_access``)."""
        return self.work_dir / "pki" / "kubelet-client"

    @property
    def state_path(self) -> Path:
        return self.work_dir / STATE_FILE

    @property
    def pki_dir(self) -> Path:
        return self.work_dir / "pki"

    @property
    def pki_paths(self) -> PKIPaths:
        return ClusterPKI.paths(self.pki_dir)

    @property
    def processes(self) -> Mapping[str, ManagedProcess]:
        return dict(self._processes)

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._processes.items()}

    @property
    def started(self) -> bool:
        return self._started

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start every component and return once each is ready; on failure nothing is left running."""
        with self._lock:
            if self._started:
                raise ControlPlaneError("the control plane is already started")
            bin_dir = self.bin_dir  # may build (minutes, first time only): not part of startup_seconds
            began = time.monotonic()
            if self._work_dir is None:
                self._work_dir = Path(tempfile.mkdtemp(prefix="durable-agents-cp-"))
            self._refuse_if_running()
            self._reset_work_dir()
            self._started = True
            if not self.detach:
                with _live_lock:
                    _live_planes.add(self)
            try:
                self._write_pki_and_kubeconfigs()
                self._start_components(bin_dir)
            except BaseException:
                # Keep the work dir: the error names the logs in it.
                self._stop(remove_work_dir=False)
                raise
            self.startup_seconds = time.monotonic() - began

    def _start_components(self, bin_dir: Path) -> None:
        # A port picked free can be taken before the component binds it (another plane starting
        # on the same machine); that race is retried with fresh ports, nothing else is.
        attempts = 3
        for attempt in range(1, attempts + 1):
            self._ports = Ports.pick()
            self._write_component_kubeconfigs()
            self._processes = self._build_processes(bin_dir)
            try:
                self._spawn(ETCD)
                self._wait_etcd()
                self._spawn(APISERVER)
                self._wait_apiserver()
                if self.controller_manager:
                    self._spawn(CONTROLLER_MANAGER)
                    self._wait_controller_manager()
                return
            except ControlPlaneError as err:
                if attempt == attempts or "address already in use" not in str(err):
                    raise
                self._terminate_all()
                shutil.rmtree(self.work_dir / "etcd-data", ignore_errors=True)

    def stop(self) -> None:
        """Stop every component (controller manager, apiserver, then etcd); idempotent."""
        self._stop(remove_work_dir=not self.keep_work_dir)

    def _stop(self, *, remove_work_dir: bool) -> None:
        with self._lock:
            with _live_lock:
                _live_planes.discard(self)
            if not self._started:
                return
            self._terminate_all()
            self._started = False
            if self._work_dir is not None:
                self.state_path.unlink(missing_ok=True)
                if self._owns_work_dir and remove_work_dir:
                    shutil.rmtree(self._work_dir, ignore_errors=True)

    def _terminate_all(self) -> None:
        errors: list[str] = []
        for name in (CONTROLLER_MANAGER, APISERVER, ETCD):
            proc = self._processes.get(name)
            if proc is None:
                continue
            try:
                proc.terminate()
            except ControlPlaneError as err:
                errors.append(str(err))
        if errors:
            raise ControlPlaneError("; ".join(errors))

    def restart_apiserver(self, *, graceful: bool = True) -> None:
        """Stop and start kube-apiserver on the same port and flags; returns once it is ready."""
        self._restart(APISERVER, graceful, self._wait_apiserver)

    def restart_etcd(self, *, graceful: bool = True) -> None:
        """Stop and start etcd on the same ports and data dir; returns once the apiserver is ready."""

        def ready() -> None:
            self._wait_etcd()
            self._wait_apiserver()

        self._restart(ETCD, graceful, ready)

    def restart_controller_manager(self, *, graceful: bool = True) -> None:
        self._restart(CONTROLLER_MANAGER, graceful, self._wait_controller_manager)

    def _restart(self, name: str, graceful: bool, wait_ready: Callable[[], None]) -> None:
        with self._lock:
            if not self._started or name not in self._processes:
                raise ControlPlaneError(f"{name} is not part of a started control plane")
            self._processes[name].terminate(graceful=graceful)
            self._spawn(name)
            wait_ready()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every component answers its readiness endpoint."""
        self._wait_etcd(timeout)
        self._wait_apiserver(timeout)
        if CONTROLLER_MANAGER in self._processes:
            self._wait_controller_manager(timeout)

    def is_healthy(self) -> bool:
        """All recorded processes alive and the apiserver ready, from a single quick probe."""
        if not self._started or not self._processes:
            return False
        if not all(p.alive() for p in self._processes.values()):
            return False
        try:
            return self._get(self.server_url + "/readyz", self._client_ssl_context(), 5.0)[0] == 200
        except OSError:
            return False

    # -- detached mode -------------------------------------------------------------------------

    @classmethod
    def attach(cls, work_dir: Path | str) -> LocalControlPlane:
        """The plane recorded in ``work_dir/state.json`` by another (possibly exited) process.

        The result can be probed, used and stopped; it is not stopped at this process's exit.
        """
        directory = Path(work_dir).resolve()
        try:
            state = json.loads((directory / STATE_FILE).read_text())
        except FileNotFoundError:
            raise ControlPlaneError(f"no control plane state in {directory}") from None
        if state.get("version") != _STATE_VERSION:
            raise ControlPlaneError(f"unsupported state version in {directory / STATE_FILE}")
        plane = cls(
            directory,
            fsync=bool(state["fsync"]),
            audit=bool(state.get("audit", True)),
            controller_manager=bool(state["controller_manager"]),
            controllers=state["controllers"],
            bin_dir=state["bin_dir"],
            detach=True,
            keep_work_dir=True,
            node_access=NodeAccess(**state["node_access"]) if state.get("node_access") else None,
        )
        plane._ports = Ports(**state["ports"])
        plane._processes = {n: ManagedProcess.from_json(p) for n, p in state["processes"].items()}
        plane._started = True
        return plane

    def _write_state(self) -> None:
        state = {
            "version": _STATE_VERSION,
            "work_dir": str(self.work_dir),
            "kubeconfig": str(self.kubeconfig_path),
            "server_url": self.server_url,
            "bin_dir": str(self.bin_dir),
            "fsync": self.fsync,
            "audit": self.audit,
            "controller_manager": self.controller_manager,
            "controllers": list(self.controllers),
            "ports": asdict(self.ports),
            "processes": {n: p.to_json() for n, p in self._processes.items()},
        }
        if self.node_access is not None:
            state["node_access"] = asdict(self.node_access)
        write_file(self.state_path, json.dumps(state, indent=2).encode() + b"\n")

    def _refuse_if_running(self) -> None:
        # A fixed work dir (the CLI's) may hold a live plane: starting over it would orphan it.
        if not self.state_path.exists():
            return
        try:
            other = LocalControlPlane.attach(self.work_dir)
        except (ControlPlaneError, ValueError, KeyError, TypeError):
            return
        running = [n for n, p in other._processes.items() if p.alive()]
        if running:
            raise ControlPlaneError(
                f"{self.work_dir} already runs a control plane ({', '.join(running)}); stop it first"
            )

    def _reset_work_dir(self) -> None:
        # Only what this class creates; logs are kept (appended to) for post-mortems.
        for sub in ("etcd-data", "pki", "etcd-certs", "users", "apiserver-certs", "controller-manager-certs"):
            shutil.rmtree(self.work_dir / sub, ignore_errors=True)
        for f in (STATE_FILE, "admin.kubeconfig", "controller-manager.kubeconfig", "encryption-config.yaml"):
            (self.work_dir / f).unlink(missing_ok=True)

    # -- users and kubectl ---------------------------------------------------------------------

    def _pki(self) -> ClusterPKI:
        return ClusterPKI.load(self.pki_dir)

    def _write_pki_and_kubeconfigs(self) -> None:
        if self.node_access is None:
            pki = ClusterPKI.create()
        else:
            node = self.node_access
            pki = ClusterPKI.create(extra_ip_addresses=[node.address, node.kubernetes_service_ip])
        pki.write(self.pki_dir)
        if self.node_access is not None:
            cert, key = pki.mint_user("kube-apiserver-kubelet-client", ["system:masters"])
            write_file(self.kubelet_client_cert_dir / "tls.crt", cert)
            write_file(self.kubelet_client_cert_dir / "tls.key", key, secret=True)
        self._write_etcd_certs(pki)
        self._write_encryption_config()
        cm = pki.issue_serving(CONTROLLER_MANAGER)
        write_file(self.work_dir / "controller-manager-certs" / "tls.crt", cm.cert_pem)
        write_file(self.work_dir / "controller-manager-certs" / "tls.key", cm.key_pem, secret=True)

    def _write_etcd_certs(self, pki: ClusterPKI) -> None:
        """etcd serves TLS only and accepts only clients with a certificate from the cluster CA."""
        certs = self.etcd_certs_dir
        # Server and client usage both: etcd's gRPC gateway dials etcd's own gRPC port with it.
        serving = issue_leaf(
            pki.ca,
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "etcd")]),
            (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
        )
        client_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver-etcd-client")])
        client = issue_leaf(pki.ca, client_name, ExtendedKeyUsageOID.CLIENT_AUTH, None)
        write_file(certs / "server.crt", serving.cert_pem)
        write_file(certs / "server.key", serving.key_pem, secret=True)
        write_file(certs / "client.crt", client.cert_pem)
        write_file(certs / "client.key", client.key_pem, secret=True)

    def _write_encryption_config(self) -> None:
        key = base64.b64encode(os.urandom(32)).decode()
        config = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "EncryptionConfiguration",
            "resources": [
                {
                    "resources": list(ENCRYPTED_RESOURCES),
                    "providers": [
                        {"aescbc": {"keys": [{"name": ENCRYPTION_KEY_NAME, "secret": key}]}},
                        {"identity": {}},  # reads what was stored before encryption was on
                    ],
                }
            ],
        }
        write_file(self.encryption_config_path, yaml.safe_dump(config, sort_keys=False).encode(), secret=True)

    def etcd_ssl_context(self) -> ssl.SSLContext:
        """A client context etcd accepts (its client certificate): for probes and for tests that
        read etcd directly, as someone with a copy of the etcd client certificate would."""
        ctx = ssl.create_default_context(cafile=str(self.pki_paths.ca_cert))
        ctx.load_cert_chain(str(self.etcd_certs_dir / "client.crt"), str(self.etcd_certs_dir / "client.key"))
        return ctx

    def _etcd_call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One call to etcd's gRPC gateway (``/v3/...``) with this plane's client certificate."""
        request = urllib.request.Request(
            self.etcd_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self.etcd_ssl_context())
        )
        with opener.open(request, timeout=60) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
        return answer

    def etcd_range(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every key under ``prefix`` and its raw stored value, read from etcd's gRPC gateway."""
        return [kv for page in self.etcd_pages(prefix, 0) for kv in page]

    def etcd_pages(self, prefix: str, page: int = 1000) -> Iterator[list[tuple[str, bytes]]]:
        """The keys under ``prefix`` and their raw values, ``page`` at a time (0: all at once; a
        range of 100,000 runs is close to a gigabyte)."""
        end = base64.b64encode((prefix[:-1] + chr(ord(prefix[-1]) + 1)).encode()).decode()
        start = prefix.encode()
        while True:
            body: dict[str, Any] = {"key": base64.b64encode(start).decode(), "range_end": end}
            if page:
                body["limit"] = page
            answer = self._etcd_call("/v3/kv/range", body)
            kvs = answer.get("kvs", [])
            yield [
                (base64.b64decode(kv["key"]).decode(), base64.b64decode(kv.get("value", ""))) for kv in kvs
            ]
            if not page or not answer.get("more") or not kvs:
                return
            start = base64.b64decode(kvs[-1]["key"]) + b"\x00"

    def etcd_status(self) -> dict[str, int]:
        """etcd's database size on disk and in use, bytes (its maintenance status)."""
        answer = self._etcd_call("/v3/maintenance/status", {})
        return {"dbSize": int(answer.get("dbSize", 0)), "dbSizeInUse": int(answer.get("dbSizeInUse", 0))}

    def _write_component_kubeconfigs(self) -> None:
        # Written once ports are known (the server URL is in them).
        pki = self._pki()
        self._write_kubeconfig(
            self.kubeconfig_path, ADMIN_USER, pki.mint_user(ADMIN_USER, ["system:masters"]), pki
        )
        # The controller manager runs every controller under its own credential
        # (--use-service-account-credentials=false), and garbage collection must read and delete
        # every resource type, so it gets system:masters rather than its narrow bootstrap role.
        self._write_kubeconfig(
            self.work_dir / "controller-manager.kubeconfig",
            "system:kube-controller-manager",
            pki.mint_user("system:kube-controller-manager", ["system:masters"]),
            pki,
        )

    def _write_kubeconfig(
        self, path: Path, user: str, cert_key: tuple[bytes, bytes], pki: ClusterPKI
    ) -> None:
        doc = kubeconfig_document(self.server_url, pki.ca.cert_pem, user, KeyPair(*cert_key))
        write_file(path, yaml.safe_dump(doc, sort_keys=False).encode(), secret=True)

    def write_user_kubeconfig(self, name: str, groups: Sequence[str] = ()) -> Path:
        """Mint a client certificate for ``name`` in ``groups`` and write a kubeconfig for it.

        The user has no permissions beyond what RBAC grants ``name`` or its groups.
        """
        pki = self._pki()
        path = self.work_dir / "users" / f"{_safe_file_name(name)}.kubeconfig"
        self._write_kubeconfig(path, name, pki.mint_user(name, groups), pki)
        return path

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = False,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this plane (admin unless ``kubeconfig`` is given)."""
        argv = [str(self.bin_dir / KUBECTL), "--kubeconfig", str(kubeconfig or self.kubeconfig_path), *args]
        return subprocess.run(argv, input=input, capture_output=True, text=True, check=check, timeout=timeout)

    # -- processes -----------------------------------------------------------------------------

    def _build_processes(self, bin_dir: Path) -> dict[str, ManagedProcess]:
        ports = self.ports
        pki = self.pki_paths
        logs = self.work_dir / "logs"
        etcd_client = self.etcd_url
        # One member: peer traffic never happens, and stays on loopback.
        etcd_peer = f"http://127.0.0.1:{ports.etcd_peer}"
        etcd_certs = self.etcd_certs_dir
        etcd = [
            str(bin_dir / ETCD),
            "--name=default",
            f"--data-dir={self.work_dir / 'etcd-data'}",
            f"--listen-client-urls={etcd_client}",
            f"--advertise-client-urls={etcd_client}",
            f"--listen-peer-urls={etcd_peer}",
            f"--initial-advertise-peer-urls={etcd_peer}",
            f"--initial-cluster=default={etcd_peer}",
            "--initial-cluster-state=new",
            f"--cert-file={etcd_certs / 'server.crt'}",
            f"--key-file={etcd_certs / 'server.key'}",
            "--client-cert-auth=true",
            f"--trusted-ca-file={pki.ca_cert}",
        ]
        if not self.fsync:
            etcd.append("--unsafe-no-fsync")
        apiserver = [
            str(bin_dir / APISERVER),
            f"--etcd-servers={etcd_client}",
            f"--etcd-cafile={pki.ca_cert}",
            f"--etcd-certfile={etcd_certs / 'client.crt'}",
            f"--etcd-keyfile={etcd_certs / 'client.key'}",
            f"--encryption-provider-config={self.encryption_config_path}",
            f"--secure-port={ports.apiserver}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--cert-dir={self.work_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.client_ca_cert}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            "--disable-admission-plugins=ServiceAccount",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.sa_public_key}",
            f"--service-account-signing-key-file={pki.sa_private_key}",
            # On SIGTERM, answer new requests 429 + Retry-After while in-flight ones drain, then
            # close open watches after 2s. The default instead waits up to --request-timeout
            # (60s) for watch connections to go away, so a graceful restart with a controller
            # manager (or an operator) connected would take a minute.
            "--shutdown-send-retry-after=true",
        ]
        if self.node_access is not None:
            apiserver = self._node_apiserver_args(apiserver)
        if self.audit:
            # One JSON line per request (metadata only: who, verb, resource), so tests can count
            # exactly what one client did, e.g. the operator's writes per transition.
            policy = self.work_dir / "audit-policy.yaml"
            policy.write_text(AUDIT_POLICY)
            apiserver += [
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log_path}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                # 0 does not mean "never rotate": the rotating writer then rotates at 100 MB, which
                # a full suite passes, and a test reading the log would lose what moved away.
                "--audit-log-maxsize=1000000",
            ]
        processes = {
            ETCD: ManagedProcess(ETCD, etcd, logs / f"{ETCD}.log"),
            APISERVER: ManagedProcess(APISERVER, apiserver, logs / f"{APISERVER}.log"),
        }
        if self.controller_manager:
            cm_kubeconfig = self.work_dir / "controller-manager.kubeconfig"
            cm_certs = self.work_dir / "controller-manager-certs"
            processes[CONTROLLER_MANAGER] = ManagedProcess(
                CONTROLLER_MANAGER,
                [
                    str(bin_dir / CONTROLLER_MANAGER),
                    f"--kubeconfig={cm_kubeconfig}",
                    f"--authentication-kubeconfig={cm_kubeconfig}",
                    f"--authorization-kubeconfig={cm_kubeconfig}",
                    # No front proxy: do not look up a request-header CA that does not exist
                    # (it logs an error every few seconds otherwise); trust our client CA directly.
                    "--authentication-skip-lookup=true",
                    f"--client-ca-file={pki.client_ca_cert}",
                    f"--controllers={','.join(self.controllers)}",
                    f"--service-account-private-key-file={pki.sa_private_key}",
                    f"--root-ca-file={pki.ca_cert}",
                    "--use-service-account-credentials=false",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    # A free port, not the default 10257: several planes may share a machine.
                    f"--secure-port={ports.controller_manager}",
                    f"--cert-dir={cm_certs}",
                    f"--tls-cert-file={cm_certs / 'tls.crt'}",
                    f"--tls-private-key-file={cm_certs / 'tls.key'}",
                    *(
                        [f"--flex-volume-plugin-dir={self.work_dir / 'flexvolume'}"]
                        if self.node_access is not None
                        else []
                    ),
                ],
                logs / f"{CONTROLLER_MANAGER}.log",
            )
        return processes

    def _node_apiserver_args(self, args: list[str]) -> list[str]:
        """The API server's flags for a plane with a real node (see :class:`NodeAccess`)."""
        node = self.node_access
        assert node is not None
        replaced = {
            "--bind-address=127.0.0.1": f"--bind-address={node.address}",
            "--advertise-address=127.0.0.1": f"--advertise-address={node.address}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}": (
                f"--service-cluster-ip-range={node.service_cluster_ip_range}"
            ),
            "--disable-admission-plugins=ServiceAccount": "--enable-admission-plugins=NodeRestriction",
            "--authorization-mode=RBAC": "--authorization-mode=Node,RBAC",
        }
        if missing := [flag for flag in replaced if flag not in args]:
            raise ControlPlaneError(f"the node's API server flags replace flags no longer there: {missing}")
        kubelet_client = self.kubelet_client_cert_dir
        return [replaced.get(a, a) for a in args] + [
            f"--kubelet-client-certificate={kubelet_client / 'tls.crt'}",
            f"--kubelet-client-key={kubelet_client / 'tls.key'}",
            f"--kubelet-certificate-authority={self.pki_paths.ca_cert}",
            "--kubelet-preferred-address-types=InternalIP",
        ]

    def _spawn(self, name: str) -> None:
        self._processes[name].spawn()
        # Recorded right away, so a plane whose start is interrupted can still be found and stopped.
        self._write_state()

    # -- readiness -----------------------------------------------------------------------------

    def _client_ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki_paths.ca_cert))
        admin = self.work_dir / "pki" / "admin-probe"
        cert, key = admin / "tls.crt", admin / "tls.key"
        if not cert.exists():
            c, k = self._pki().mint_user(ADMIN_USER + "-probe", ["system:masters"])
            write_file(key, k, secret=True)
            write_file(cert, c)
        ctx.load_cert_chain(str(cert), str(key))
        return ctx

    @staticmethod
    def _get(url: str, ctx: ssl.SSLContext | None, timeout: float) -> tuple[int, str]:
        # No proxies: a probe of 127.0.0.1 must never go through an http_proxy from the environment.
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if ctx is not None:
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        opener = urllib.request.build_opener(*handlers)
        try:
            with opener.open(url, timeout=timeout) as resp:
                return int(resp.status), resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as err:
            return int(err.code), err.read().decode("utf-8", "replace")

    def _await(
        self,
        name: str,
        probe: Callable[[], tuple[bool, str]],
        timeout: float | None,
    ) -> None:
        proc = self._processes[name]
        budget = self.startup_timeout if timeout is None else timeout
        last = "no answer yet"

        def ready() -> bool:
            nonlocal last
            if not proc.alive():
                raise ControlPlaneError(
                    f"{name} exited with code {proc.exit_code()} before becoming ready; "
                    f"log {proc.log_path}:\n{_tail(proc.log_path)}"
                )
            try:
                ok, last = probe()
            except (OSError, ValueError, http.client.HTTPException) as err:
                ok, last = False, f"{type(err).__name__}: {err}"
            return ok

        try:
            eventually(ready, budget, f"{name} to be ready", interval=_POLL_INTERVAL)
        except TimeoutError:
            raise TimeoutError(
                f"{name} not ready after {budget:.0f}s (last probe: {last}); "
                f"log {proc.log_path}:\n{_tail(proc.log_path)}"
            ) from None

    def _wait_etcd(self, timeout: float | None = None) -> None:
        url = self.etcd_url + "/health"

        def probe() -> tuple[bool, str]:
            status, body = self._get(url, self.etcd_ssl_context(), 2.0)
            return status == 200 and json.loads(body).get("health") == "true", f"{status} {body.strip()}"

        self._await(ETCD, probe, timeout)

    def _wait_apiserver(self, timeout: float | None = None) -> None:
        url = self.server_url + "/readyz"
        ctx = self._client_ssl_context()

        def probe() -> tuple[bool, str]:
            status, body = self._get(url, ctx, 5.0)
            return status == 200, f"{status} {body.strip()[-500:]}"

        self._await(APISERVER, probe, timeout)

    def _wait_controller_manager(self, timeout: float | None = None) -> None:
        url = f"https://127.0.0.1:{self.ports.controller_manager}/healthz?verbose"
        ctx = ssl.create_default_context(cafile=str(self.pki_paths.ca_cert))

        def probe() -> tuple[bool, str]:
            # Each controller adds its health check once it has started; waiting for all of them
            # means garbage collection and namespace deletion are actually running.
            status, body = self._get(url, ctx, 5.0)
            started = "*" in self.controllers or all(f"[+]{c} ok" in body for c in self.controllers)
            return status == 200 and started, f"{status} {body.strip()[-500:]}"

        self._await(CONTROLLER_MANAGER, probe, timeout)


@contextlib.contextmanager
def local_control_plane(**kwargs: Any) -> Iterator[LocalControlPlane]:
    """``with local_control_plane(fsync=True) as plane:`` -- start, yield, always stop."""
    plane = LocalControlPlane(**kwargs)
    with plane:
        yield plane
