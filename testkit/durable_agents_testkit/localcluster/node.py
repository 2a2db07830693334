"""The optional node of the local control plane: a kubelet on which Pods really run.

This module owns the node test bed (``make cluster-up NODE=1``, ``make test-node``), built so that
every component is a host process, the Kubernetes
ones built by ``WITH_NODE=1 hack/build.sh`` from the same pinned module as the control plane,
containerd, runc and the CNI plugins from Debian (installed when missing), and the two images
(the Pod sandbox and the probe) made here from the static ``probe`` binary, with no registry.

Where it runs. The node (containerd and its shims, the kubelet, kube-proxy, the Pods' bridge)
lives in a network namespace and a mount namespace of its own, held by one ``sleep`` process
(the *holder*) and entered with ``nsenter``:

- the network namespace is joined to the machine by one veth pair: the host end carries the
  address the API server binds and advertises (``172.31.16k.1/30``, never loopback, never one
  of the machine's networks), the node end the node's; the machine routes only the Pod and
  Service ranges of this node to it, the node has no default route, and a guard in the node
  drops anything a Pod sends that is not for another Pod or for the API server's port. Every
  iptables chain kube-proxy, the kubelet and CNI add is inside the namespace;
- the mount namespace (a slave of the machine's) has its own empty ``/run``, ``/var/lib`` and
  ``/var/log``, so the fixed host paths the components write whatever they are told
  (``/var/lib/kubelet/device-plugins``, ``/var/lib/cni``, ``/var/log/containers``,
  ``/run/mount``, ``/run/containerd/s``, ``/run/netns``) stay inside it, and so does every mount
  the kubelet, containerd and runc make; and it shows the kubelet the kernel settings it wants
  (``vm.overcommit_memory=1``, ``kernel.panic=10``, ``kernel.panic_on_oops=1`` ...) as files,
  so it never writes the machine's;
- the kubelet's cgroups are under a cgroup root of the node's own in every hierarchy.

Before anything is made, the machine's state is recorded (:mod:`.hoststate`); :meth:`stop`
removes what was made (Pods and shims killed, ``kube-proxy --cleanup`` in the namespace, the
namespaces and the veth gone with the holder, cgroups removed, any guarded kernel setting or
fixed path that changed anyway put back) and then compares, raising
:class:`~.hoststate.HostStateChanged` with a readable diff if anything differs.

Pinned, and said so: the kubelet runs on cgroup v1 (``failCgroupV1: false``) with containerd
1.6 from Debian 12; later Kubernetes versions may drop both.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import ipaddress
import json
import os
import platform
import shutil
import signal
import ssl
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from durable_agents.shell.ground.certs import KeyPair, issue_serving_cert
from durable_agents_testkit.eventually import eventually
from durable_agents_testkit.localcluster import hoststate
from durable_agents_testkit.localcluster.certs import ClusterPKI, write_file
from durable_agents_testkit.localcluster.controlplane import (
    APISERVER,
    CONTROLLER_MANAGER,
    ControlPlaneError,
    LocalControlPlane,
    ManagedProcess,
    NodeAccess,
    _cache_dir,
    _free_ports,
    _proc_start_ticks,
    _tail,
    ensure_binaries,
    kubeconfig_document,
)

KUBELET = "kubelet"
SCHEDULER = "kube-scheduler"
PROXY = "kube-proxy"
PROBE = "probe"
CONTAINERD = "containerd"
HOLDER = "holder"
NODE_BINARIES = (KUBELET, SCHEDULER, PROXY, PROBE)
NODE_NAME = "durable-agents-node"
STATE_FILE = "state.json"
HOST_BEFORE_FILE = "host-before.json"

# Debian packages and a file each installs (checked, not assumed): installed only when missing.
DEBIAN_PACKAGES: Mapping[str, str] = {
    "containerd": "/usr/bin/containerd",
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "iptables": "/usr/sbin/iptables",
    "iproute2": "/usr/bin/ip",
    "nftables": "/usr/sbin/nft",
}
CNI_BIN_DIR = "/usr/lib/cni"

# What the kubelet sets when it finds another value (pkg/kubelet/cm setupKernelTunables): the
# node's mount namespace shows it these values, so it never writes the machine's.
KUBELET_SYSCTLS: Mapping[str, int] = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
# The node's mount namespace gets its own empty directories here (design pitfall 7).
PRIVATE_DIRS = ("/run", "/var/lib", "/var/log")

# What runs in the node: the holder (unshare, then sleep), nsenter, the components and the shims.
_NODE_PROGRAMS = frozenset(
    {
        "unshare",
        "sleep",
        "sh",
        "dash",
        "nsenter",
        CONTAINERD,
        "containerd-shim-runc-v2",
        KUBELET,
        PROXY,
        SCHEDULER,
    }
)
_SLOTS = 16
_POLL = 0.1
_STATE_VERSION = 1


class NodeError(ControlPlaneError):
    """The node could not be built, started or stopped."""


# ---------------------------------------------------------------------------------------------
# What the machine needs


def ensure_packages(packages: Mapping[str, str] = DEBIAN_PACKAGES) -> list[str]:
    """Install the Debian packages whose file is missing; returns those installed."""
    missing = [name for name, path in packages.items() if not os.path.exists(path)]
    if not missing:
        return []
    if shutil.which("apt-get") is None:
        raise NodeError(f"missing {', '.join(missing)} and no apt-get to install them")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print(f"node test bed: installing {' '.join(missing)}", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
        env=env,
        check=True,
        timeout=900,
    )
    still = [name for name in missing if not os.path.exists(packages[name])]
    if still:
        raise NodeError(
            f"installed {', '.join(missing)} but {', '.join(packages[n] for n in still)} is missing"
        )
    return missing


def ensure_node_binaries() -> Path:
    """The bin directory with the control plane's binaries and the node's (``WITH_NODE=1``)."""
    return ensure_binaries(controller_manager=True, extra=NODE_BINARIES, node=True)


# ---------------------------------------------------------------------------------------------
# Images: the probe binary alone in a layer, as an OCI archive for `ctr images import`


def _oci_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_image_archive(path: Path, probe: Path, images: Mapping[str, Sequence[str]]) -> None:
    """An OCI image-layout tar with one image per ``name -> cmd``, all ``/probe`` as entrypoint.

    The layer is the static probe and a few empty directories; ``ctr images import`` names each
    image from its ``io.containerd.image.name`` annotation.
    """
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for d, mode in (("etc", 0o755), ("tmp", 0o1777), ("proc", 0o555), ("sys", 0o555), ("dev", 0o755)):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, mode
            layer.addfile(info)
        info = tarfile.TarInfo("probe")
        data = probe.read_bytes()
        info.size, info.mode = len(data), 0o755
        layer.addfile(info, io.BytesIO(data))
    layer_bytes = layer_buf.getvalue()
    arch = _oci_arch()
    blobs: dict[str, bytes] = {_digest(layer_bytes): layer_bytes}
    manifests = []
    for name, cmd in images.items():
        config = {
            "architecture": arch,
            "os": "linux",
            "config": {"Entrypoint": ["/probe"], "Cmd": list(cmd), "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer_bytes)]},
        }
        config_bytes = json.dumps(config, sort_keys=True).encode()
        blobs[_digest(config_bytes)] = config_bytes
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _digest(config_bytes),
                "size": len(config_bytes),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _digest(layer_bytes),
                    "size": len(layer_bytes),
                }
            ],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        blobs[_digest(manifest_bytes)] = manifest_bytes
        manifests.append(
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": _digest(manifest_bytes),
                "size": len(manifest_bytes),
                "platform": {"architecture": arch, "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                },
            }
        )
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    }
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index).encode(),
    }
    files.update({f"blobs/sha256/{d.split(':', 1)[1]}": b for d, b in blobs.items()})
    with tarfile.open(path, "w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


# ---------------------------------------------------------------------------------------------
# The network


@dataclass(frozen=True)
class NodeNetwork:
    """Slot ``k`` of ``172.31.0.0/16``: a /20 per node, so several beds can share a machine."""

    slot: int

    def _net(self, offset: int) -> str:
        return f"172.31.{16 * self.slot + offset}"

    @property
    def block(self) -> str:
        return f"{self._net(0)}.0/20"

    @property
    def host_address(self) -> str:
        """The host end of the veth: the API server binds and advertises it."""
        return f"{self._net(0)}.1"

    @property
    def node_address(self) -> str:
        return f"{self._net(0)}.2"

    @property
    def link_prefix(self) -> int:
        return 30

    @property
    def pod_cidr(self) -> str:
        return f"{self._net(4)}.0/24"

    @property
    def service_cidr(self) -> str:
        return f"{self._net(8)}.0/24"

    @property
    def kubernetes_service_ip(self) -> str:
        return f"{self._net(8)}.1"

    @property
    def host_link(self) -> str:
        return f"da-node{self.slot}"

    @property
    def cgroup_root(self) -> str:
        return f"durable-agents-node{self.slot}"


def _ip(*args: str, check: bool = True) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise NodeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def _used_networks() -> tuple[list[ipaddress.IPv4Network], set[str]]:
    nets: list[ipaddress.IPv4Network] = []
    for link in json.loads(_ip("-j", "-4", "addr", "show") or "[]"):
        for a in link.get("addr_info", []):
            nets.append(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.IPv4Network(dst, strict=False))
    names = {link["ifname"] for link in json.loads(_ip("-j", "link", "show") or "[]")}
    return nets, names


def free_network() -> NodeNetwork:
    """The first slot whose /20, device name and cgroup root nothing on this machine uses."""
    nets, names = _used_networks()
    hierarchies = hoststate.cgroup_hierarchies()
    for slot in range(_SLOTS):
        net = NodeNetwork(slot)
        block = ipaddress.IPv4Network(net.block)
        if any(block.overlaps(n) for n in nets if n.prefixlen > 0) or net.host_link in names:
            continue
        if any((h / net.cgroup_root).exists() for h in hierarchies):
            continue
        return net
    raise NodeError("every node slot of 172.31.0.0/16 is in use on this machine")


# ---------------------------------------------------------------------------------------------
# The bed


def _ns_id(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _pids_in_namespace(kind: str, ns: str) -> list[int]:
    """Every process in namespace ``ns``; refuses this process's and init's (never the machine's)."""
    if not ns or ns in (_ns_id(os.getpid(), kind), _ns_id(1, kind)):
        raise NodeError(f"refusing to act on the machine's own {kind} namespace {ns!r}")
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _ns_id(int(entry), kind) == ns:
            pids.append(int(entry))
    return pids


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _registry() -> Path:
    """One file per started bed (its work dir and owner), so that a bed whose owner was killed
    (a test run stopped with SIGKILL) is found and removed by the next bed on this machine."""
    return _cache_dir() / "node-beds"


def reap_orphans() -> list[str]:
    """Stop every bed recorded here whose owning process is gone (detached beds have none)."""
    reaped: list[str] = []
    directory = _registry()
    if not directory.is_dir():
        return reaped
    for entry in sorted(directory.glob("*.json")):
        try:
            record = json.loads(entry.read_text())
        except (OSError, ValueError):
            entry.unlink(missing_ok=True)
            continue
        owner, ticks = record.get("owner_pid"), record.get("owner_ticks")
        if owner is None or (_proc_start_ticks(owner) is not None and _proc_start_ticks(owner) == ticks):
            continue  # detached (the CLI's) or its owner is alive
        try:
            bed = NodeTestBed.attach(record["work_dir"])
        except NodeError:
            entry.unlink(missing_ok=True)
            continue
        bed._owns_work_dir = bool(record.get("owns_work_dir"))
        print(f"node test bed: removing the bed left in {record['work_dir']} by process {owner}", flush=True)
        bed.stop(check_host=False)
        entry.unlink(missing_ok=True)
        reaped.append(str(record["work_dir"]))
    return reaped


_live_beds: set[NodeTestBed] = set()
_live_lock = threading.Lock()


def _stop_live_beds() -> None:
    with _live_lock:
        beds = list(_live_beds)
    for bed in beds:
        with contextlib.suppress(Exception):
            bed.stop(check_host=False)


atexit.register(_stop_live_beds)


class NodeTestBed:
    """A control plane bound to a non-loopback address and one real node, on this machine.

    ``work_dir`` holds the plane (as :class:`LocalControlPlane` lays it out) and ``node/``; a
    fresh temporary directory by default, removed by :meth:`stop`. ``detach=True`` (the CLI)
    leaves everything running when this process exits; :meth:`attach` finds it again.
    """

    def __init__(
        self,
        work_dir: Path | str | None = None,
        *,
        bin_dir: Path | str | None = None,
        detach: bool = False,
        ready_timeout: float = 180.0,
    ) -> None:
        self._work_dir = Path(work_dir).resolve() if work_dir is not None else None
        self._owns_work_dir = work_dir is None
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None
        self.detach = detach
        self.ready_timeout = ready_timeout
        self.network: NodeNetwork | None = None
        self.plane: LocalControlPlane | None = None
        self._processes: dict[str, ManagedProcess] = {}
        self._namespaces: dict[str, str] = {}
        self._before: hoststate.HostState | None = None
        self._sysctls_before: dict[str, str] = {}
        self._images: dict[str, str] = {}
        self._scheduler_port = 0
        self._lock = threading.RLock()
        self.timings: dict[str, float] = {}

    # -- paths ---------------------------------------------------------------------------------

    @property
    def work_dir(self) -> Path:
        if self._work_dir is None:
            raise NodeError("the node test bed has no work directory until start()")
        return self._work_dir

    @property
    def node_dir(self) -> Path:
        return self.work_dir / "node"

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = ensure_node_binaries()
        return self._bin_dir

    @property
    def kubeconfig_path(self) -> Path:
        """The admin kubeconfig (``system:masters``) of the plane the node belongs to."""
        return self._plane().kubeconfig_path

    @property
    def containerd_socket(self) -> Path:
        return self.node_dir / "containerd" / "containerd.sock"

    @property
    def probe_image(self) -> str:
        """The probe as an image on the node (``imagePullPolicy: Never``); args pick its mode."""
        return self._images["probe"]

    @property
    def pause_image(self) -> str:
        return self._images["pause"]

    @property
    def processes(self) -> Mapping[str, ManagedProcess]:
        return dict(self._processes)

    def _plane(self) -> LocalControlPlane:
        if self.plane is None:
            raise NodeError("the node test bed is not started")
        return self.plane

    def _net(self) -> NodeNetwork:
        if self.network is None:
            raise NodeError("the node test bed is not started")
        return self.network

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Everything from nothing to a Ready node; on failure, everything made is removed again."""
        with self._lock:
            if self.plane is not None:
                raise NodeError("the node test bed is already started")
            if os.geteuid() != 0:
                raise NodeError("the node test bed needs root (namespaces, veth, cgroups, containerd)")
            ensure_packages()
            bin_dir = self.bin_dir
            if self._work_dir is None:
                self._work_dir = Path(tempfile.mkdtemp(prefix="durable-agents-node-"))
            for private in PRIVATE_DIRS:
                if self.work_dir == Path(private) or Path(private) in self.work_dir.parents:
                    raise NodeError(f"the work directory may not be under {private} (the node hides it)")
            self._refuse_if_running()
            reap_orphans()
            shutil.rmtree(self.node_dir, ignore_errors=True)
            self.node_dir.mkdir(parents=True)
            began = time.monotonic()
            self._before = hoststate.snapshot()
            self._sysctls_before = {k: Path("/proc/sys", k).read_text() for k in KUBELET_SYSCTLS}
            write_file(self.node_dir / HOST_BEFORE_FILE, json.dumps(self._before.to_json()).encode())
            self.network = free_network()
            self._register()
            if not self.detach:
                with _live_lock:
                    _live_beds.add(self)
            try:
                self._start(bin_dir)
            except BaseException as err:
                # Keep the work dir (its logs explain the failure); the machine is put back.
                problems = self._teardown(remove_work_dir=False)
                before, self._before = self._before, None
                diff = hoststate.compare(before, hoststate.snapshot()) if before is not None else ""
                if problems or diff:
                    raise NodeError(
                        f"the node did not start ({err}; logs in {self.work_dir}), and its teardown "
                        "left things behind:\n" + "\n".join(problems) + diff
                    ) from err
                raise
            self.timings["ready_seconds"] = time.monotonic() - began

    def _start(self, bin_dir: Path) -> None:
        net = self._net()
        t0 = time.monotonic()
        self._start_holder()
        self._make_network()
        self._make_cgroup_root()
        self._images = self._image_names(bin_dir)
        self._write_node_files()
        self._spawn(
            CONTAINERD, [CONTAINERD, "--config", str(self.node_dir / "containerd" / "config.toml")], True
        )
        self.timings["network_seconds"] = time.monotonic() - t0
        plane = LocalControlPlane(
            self.work_dir,
            bin_dir=bin_dir,
            controllers=("*",),
            detach=self.detach,
            keep_work_dir=True,
            node_access=NodeAccess(net.host_address, net.service_cidr, net.kubernetes_service_ip),
        )
        self.plane = plane
        plane.start()
        self.timings["plane_seconds"] = plane.startup_seconds or 0.0
        self._install_guard(plane.ports.apiserver)  # the API server's port is known now
        self._write_component_credentials()
        self._wait_containerd()
        self._import_images(bin_dir)
        self._scheduler_port = _free_ports(1)[0]
        self._spawn(SCHEDULER, self._scheduler_argv(bin_dir), False)
        self._spawn(KUBELET, self._kubelet_argv(bin_dir), True)
        self._spawn(PROXY, [str(bin_dir / PROXY), f"--config={self.node_dir / 'kube-proxy.yaml'}"], True)
        self._write_state()
        self._wait_ready()

    def stop(self, *, check_host: bool = True) -> None:
        """Remove everything the bed made, then (``check_host``) compare the machine with before."""
        with self._lock:
            with _live_lock:
                _live_beds.discard(self)
            if self._before is None and not self._processes:
                return
            began = time.monotonic()
            problems = self._teardown()
            self.timings["teardown_seconds"] = time.monotonic() - began
            before, self._before = self._before, None
            if problems:
                raise NodeError("teardown left things behind:\n" + "\n".join(problems))
            if check_host and before is not None:
                hoststate.assert_unchanged(before, hoststate.snapshot(), "the node test bed")

    # -- start ---------------------------------------------------------------------------------

    def _in_node(self, argv: Sequence[str]) -> list[str]:
        holder = self._processes[HOLDER].pid
        return ["nsenter", f"--target={holder}", "--net", "--mount", "--", *argv]

    def _spawn(self, name: str, argv: Sequence[str], in_node: bool) -> None:
        proc = ManagedProcess(
            name, self._in_node(argv) if in_node else list(argv), self.node_dir / "logs" / f"{name}.log"
        )
        self._processes[name] = proc
        proc.spawn()
        self._write_state()

    def _start_holder(self) -> None:
        views = self.node_dir / "sysctl-view"
        views.mkdir(parents=True)
        lines = ["set -e"]
        for d in PRIVATE_DIRS:
            lines.append(f"mount -t tmpfs -o mode=0755,size=512m durable-agents-node {d}")
        lines.append("mkdir -p /run/lock")
        for key, value in KUBELET_SYSCTLS.items():
            view = views / key.replace("/", ".")
            view.write_text(f"{value}\n")
            lines.append(f"mount --bind {view} /proc/sys/{key}")
        lines += [
            "ip link set lo up",
            f"echo ready > {self.node_dir / 'holder.ready'}",
            "exec sleep infinity",
        ]
        argv = [
            "unshare",
            "--net",
            "--mount",
            "--propagation",
            "slave",
            "--",
            "/bin/sh",
            "-c",
            "\n".join(lines),
        ]
        proc = ManagedProcess(HOLDER, argv, self.node_dir / "logs" / "holder.log")
        self._processes[HOLDER] = proc
        proc.spawn()
        ready = self.node_dir / "holder.ready"

        def up() -> bool:
            if not proc.alive():
                raise NodeError(f"the namespace holder exited: {_tail(proc.log_path)}")
            return ready.exists()

        eventually(up, 30, "the node's namespaces", interval=0.02)
        self._namespaces = {k: _ns_id(proc.pid, k) or "" for k in ("net", "mnt")}
        self._write_state()

    def _make_network(self) -> None:
        net, holder = self._net(), self._processes[HOLDER].pid
        host, node, prefix = net.host_address, net.node_address, net.link_prefix
        _ip("link", "add", net.host_link, "type", "veth", "peer", "name", "eth0", "netns", str(holder))
        _ip("addr", "add", f"{host}/{prefix}", "dev", net.host_link)
        _ip("link", "set", net.host_link, "up")
        inside = self._in_node
        for argv in (
            ["ip", "addr", "add", f"{node}/{prefix}", "dev", "eth0"],
            ["ip", "link", "set", "eth0", "up"],
            # The node's own namespace's settings (net.* is per network namespace), not the machine's.
            ["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"],
            ["sh", "-c", "echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables"],
        ):
            self._run(inside(argv))
        # The machine routes only this node's Pod and Service ranges to it.
        _ip("route", "add", net.pod_cidr, "via", node, "dev", net.host_link)
        _ip("route", "add", net.service_cidr, "via", node, "dev", net.host_link)

    def _install_guard(self, apiserver_port: int) -> None:
        """A Pod may reach other Pods and the API server's port, nothing else (the node has no
        default route either). mangle FORWARD sees the destination after kube-proxy's DNAT and
        comes before every filter rule kube-proxy and CNI add."""
        net = self._net()
        rules = [
            ["-N", "DA-POD-GUARD"],
            ["-A", "DA-POD-GUARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
            ["-A", "DA-POD-GUARD", "-d", net.pod_cidr, "-j", "RETURN"],
            [
                "-A",
                "DA-POD-GUARD",
                "-d",
                net.host_address,
                "-p",
                "tcp",
                "--dport",
                str(apiserver_port),
                "-j",
                "RETURN",
            ],
            ["-A", "DA-POD-GUARD", "-j", "DROP"],
            ["-A", "FORWARD", "-s", net.pod_cidr, "-j", "DA-POD-GUARD"],
        ]
        for rule in rules:
            self._run(self._in_node(["iptables", "-w", "-t", "mangle", *rule]))

    def _make_cgroup_root(self) -> None:
        root = self._net().cgroup_root
        for hierarchy in hoststate.cgroup_hierarchies():
            path = hierarchy / root
            path.mkdir()
            # cgroup v1 cpuset: a new group has no CPUs or memory nodes until given its parent's.
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (hierarchy / name).exists():
                    (path / name).write_text((hierarchy / name).read_text())

    def _write_node_files(self) -> None:
        net, d = self._net(), self.node_dir
        (d / "cni" / "net.d").mkdir(parents=True)
        conflist = {
            "cniVersion": "0.4.0",
            "name": "durable-agents-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": net.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(d / "cni" / "ipam"),
                    },
                },
                # Docker sets the FORWARD policy to DROP on machines where it manages iptables.
                {"type": "firewall", "backend": "iptables"},
            ],
        }
        write_file(
            d / "cni" / "net.d" / "10-durable-agents.conflist", json.dumps(conflist, indent=2).encode()
        )
        self._write_containerd_config()

    def _write_containerd_config(self) -> None:
        d = self.node_dir / "containerd"
        d.mkdir(parents=True, exist_ok=True)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        sandbox = self._images["pause"]
        config = f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
# No /opt/containerd, no snapshotters this machine cannot use.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{self.containerd_socket}"

[{cri}]
  sandbox_image = "{sandbox}"
  # runc cannot set a sandbox's oom_score_adj here (no CAP_SYS_RESOURCE): design pitfall 1.
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{self.node_dir / "cni" / "net.d"}"
"""
        write_file(d / "config.toml", config.encode())

    def _ctr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", f"--address={self.containerd_socket}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _wait_containerd(self) -> None:
        proc = self._processes[CONTAINERD]

        def up() -> bool:
            if not proc.alive():
                raise NodeError(f"containerd exited: {_tail(proc.log_path)}")
            return self.containerd_socket.exists() and self._ctr("version", timeout=10).returncode == 0

        eventually(up, 60, "containerd", interval=_POLL)

    @staticmethod
    def _image_names(bin_dir: Path) -> dict[str, str]:
        # Tagged by the probe's digest: a rebuilt probe is a new image, never a stale one.
        tag = hashlib.sha256((bin_dir / PROBE).read_bytes()).hexdigest()[:12]
        return {
            "pause": f"localhost/durable-agents-pause:{tag}",
            "probe": f"localhost/durable-agents-probe:{tag}",
        }

    def _import_images(self, bin_dir: Path) -> None:
        probe = bin_dir / PROBE
        archive = self.node_dir / "images.tar"
        write_image_archive(
            archive, probe, {self._images["pause"]: ["pause"], self._images["probe"]: ["serve"]}
        )
        result = self._ctr("images", "import", str(archive))
        if result.returncode != 0:
            raise NodeError(f"ctr images import: {result.stderr.strip()}")
        archive.unlink()
        listed = self._ctr("images", "ls", "-q").stdout.split()
        missing = [i for i in self._images.values() if i not in listed]
        if missing:
            raise NodeError(f"ctr images import did not make {missing} (has {listed})")

    def import_image(self, archive: Path, *names: str) -> None:
        """Load an image archive (``docker save``, or OCI) into the node's containerd; ``names``
        must be there afterwards (Pods use them with imagePullPolicy Never)."""
        result = self._ctr("images", "import", str(archive), timeout=600)
        if result.returncode != 0:
            raise NodeError(f"ctr images import {archive}: {result.stderr.strip()}")
        listed = self._ctr("images", "ls", "-q").stdout.split()
        missing = [n for n in names if n not in listed]
        if missing:
            raise NodeError(f"ctr images import did not make {missing} (has {listed})")

    def _write_component_credentials(self) -> None:
        plane, net, d = self._plane(), self._net(), self.node_dir
        pki = ClusterPKI.load(plane.pki_dir)

        def kubeconfig(path: Path, user: str, groups: Sequence[str]) -> None:
            cert, key = pki.mint_user(user, groups)
            doc = kubeconfig_document(plane.server_url, pki.ca.cert_pem, user, KeyPair(cert, key))
            write_file(path, yaml.safe_dump(doc, sort_keys=False).encode(), secret=True)

        # The Node authorizer and NodeRestriction know a kubelet by this name and group.
        kubeconfig(d / "kubelet.kubeconfig", f"system:node:{NODE_NAME}", ["system:nodes"])
        kubeconfig(d / "kube-proxy.kubeconfig", "system:kube-proxy", [])
        kubeconfig(d / "kube-scheduler.kubeconfig", "system:kube-scheduler", [])
        serving = issue_serving_cert(pki.ca, NODE_NAME, [NODE_NAME], [net.node_address])
        write_file(d / "kubelet-certs" / "tls.crt", serving.cert_pem)
        write_file(d / "kubelet-certs" / "tls.key", serving.key_pem, secret=True)
        kubelet_config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": net.node_address,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": net.node_address,
            "healthzPort": 10248,
            "tlsCertFile": str(d / "kubelet-certs" / "tls.crt"),
            "tlsPrivateKeyFile": str(d / "kubelet-certs" / "tls.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(plane.pki_paths.client_ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            # cgroup v1 here (design pitfall 6), under a root of the node's own.
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": "/" + net.cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            # No DNS server in this cluster (pitfall 8): clients use KUBERNETES_SERVICE_HOST.
            "resolvConf": "",
            # Nothing can be pulled again: never collect an image.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "volumePluginDir": str(d / "volume-plugins"),
            "podLogsDir": str(d / "pod-logs"),
            "serializeImagePulls": False,
            "registerNode": True,
            "protectKernelDefaults": False,
            "maxPods": 32,
        }
        write_file(d / "kubelet.yaml", yaml.safe_dump(kubelet_config, sort_keys=False).encode())
        proxy_config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(d / "kube-proxy.kubeconfig")},
            "hostnameOverride": NODE_NAME,
            "mode": "iptables",
            "clusterCIDR": net.pod_cidr,
            "healthzBindAddress": f"{net.node_address}:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # 0: leave the machine's conntrack table size and timeouts as they are.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
        write_file(d / "kube-proxy.yaml", yaml.safe_dump(proxy_config, sort_keys=False).encode())

    def _kubelet_argv(self, bin_dir: Path) -> list[str]:
        d, net = self.node_dir, self._net()
        return [
            str(bin_dir / KUBELET),
            f"--config={d / 'kubelet.yaml'}",
            f"--kubeconfig={d / 'kubelet.kubeconfig'}",
            f"--root-dir={d / 'kubelet'}",
            f"--cert-dir={d / 'kubelet-certs'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={net.node_address}",
        ]

    def _scheduler_argv(self, bin_dir: Path) -> list[str]:
        kubeconfig = self.node_dir / "kube-scheduler.kubeconfig"
        return [
            str(bin_dir / SCHEDULER),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--authentication-skip-lookup=true",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={self._scheduler_port}",
            f"--cert-dir={self.node_dir / 'scheduler-certs'}",
        ]

    # -- readiness -----------------------------------------------------------------------------

    def _run(self, argv: Sequence[str], timeout: float = 60.0) -> str:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise NodeError(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout.strip()}")
        return result.stdout

    @staticmethod
    def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), *([urllib.request.HTTPSHandler(context=ctx)] if ctx else [])
        )
        try:
            with opener.open(url, timeout=3) as resp:
                return int(resp.status) == 200
        except (OSError, urllib.error.HTTPError):
            return False

    def _await(self, names: Sequence[str], probe: Callable[[], bool], what: str, budget: float) -> None:
        def ready() -> bool:
            for name in names:
                proc = self._processes[name]
                if not proc.alive():
                    raise NodeError(
                        f"{name} exited before {what}; log {proc.log_path}:\n{_tail(proc.log_path)}"
                    )
            return probe()

        try:
            eventually(ready, budget, what, interval=_POLL)
        except TimeoutError:
            logs = "\n".join(f"--- {n}:\n{_tail(self._processes[n].log_path, 15)}" for n in names)
            raise TimeoutError(f"{what} not within {budget:.0f}s\n{logs}") from None

    def node_ready(self) -> bool:
        result = self._plane().kubectl("get", "node", NODE_NAME, "-o", "json", timeout=10)
        if result.returncode != 0:
            return False
        conditions = json.loads(result.stdout).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _wait_ready(self) -> None:
        net = self._net()
        deadline = time.monotonic() + self.ready_timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
        sched = f"https://127.0.0.1:{self._scheduler_port}/healthz"
        self._await([SCHEDULER], lambda: self._http_ok(sched, insecure), "kube-scheduler /healthz", left())
        kubelet = f"http://{net.node_address}:10248/healthz"
        self._await([KUBELET, CONTAINERD], lambda: self._http_ok(kubelet), "kubelet /healthz", left())
        self._await([KUBELET, CONTAINERD, PROXY], self.node_ready, f"node {NODE_NAME} Ready", left())
        proxy = f"http://{net.node_address}:10256/healthz"
        self._await([PROXY], lambda: self._http_ok(proxy), "kube-proxy /healthz", left())

    # -- teardown ------------------------------------------------------------------------------

    def _cgroup_dirs(self) -> list[Path]:
        """Every cgroup under the node's root, deepest first."""
        if self.network is None:
            return []
        found: list[Path] = []
        for hierarchy in hoststate.cgroup_hierarchies():
            root = hierarchy / self.network.cgroup_root
            if root.is_dir():
                found += [Path(p) for p, _, _ in os.walk(root)]
        return sorted(found, key=lambda p: len(p.parts), reverse=True)

    def _cgroup_pids(self) -> set[int]:
        pids: set[int] = set()
        for cg in self._cgroup_dirs():
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in (cg / "cgroup.procs").read_text().split()}
        return pids

    def _kill_until_gone(self, find: Callable[[], set[int]], what: str) -> None:
        def gone() -> bool:
            pids = find()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return not pids

        eventually(gone, 30, what, interval=_POLL)

    def _register(self) -> None:
        owner = None if self.detach else os.getpid()
        record = {
            "work_dir": str(self.work_dir),
            "owner_pid": owner,
            "owner_ticks": None if owner is None else _proc_start_ticks(owner),
            "owns_work_dir": self._owns_work_dir,
        }
        write_file(_registry() / f"{self._net().slot}.json", json.dumps(record).encode())

    def _unregister(self) -> None:
        if self.network is None:
            return
        entry = _registry() / f"{self.network.slot}.json"
        with contextlib.suppress(OSError, ValueError):
            if json.loads(entry.read_text()).get("work_dir") == str(self.work_dir):
                entry.unlink()

    def _teardown(self, *, remove_work_dir: bool = True) -> list[str]:
        """Stop and remove everything; returns what could not be removed (empty when all went)."""
        problems: list[str] = []

        def step(what: str, action: Callable[[], object]) -> None:
            began = time.monotonic()
            try:
                action()
            except Exception as err:  # every step runs: one failure must not leave the rest behind
                problems.append(f"{what}: {err}")
            self.timings[f"teardown: {what}"] = round(time.monotonic() - began, 2)

        for name in (KUBELET, PROXY, SCHEDULER):
            if name in self._processes:
                step(f"stop {name}", self._processes[name].terminate)
        # Pods and their sandboxes: every process in the node's cgroups.
        step("kill the Pods", lambda: self._kill_until_gone(self._cgroup_pids, "the Pods' processes to exit"))
        holder = self._processes.get(HOLDER)
        # Namespace ids are only known to be the node's while its holder lives (after a reboot
        # the same ids may name someone else's); otherwise what is left is found by its command
        # line (the shims name the node's containerd socket).
        held = holder is not None and holder.alive()
        if not held:
            self._namespaces = {}
        if held and PROXY in self._processes:
            # The namespace goes with the holder anyway; this is kube-proxy's own cleanup, run
            # where its rules are.
            cleanup = self._in_node([str(self.bin_dir / PROXY), "--cleanup"])
            step("kube-proxy --cleanup", lambda: self._run(cleanup))
        if CONTAINERD in self._processes:
            step("stop containerd", self._processes[CONTAINERD].terminate)
        mnt = self._namespaces.get("mnt")
        if mnt:
            # The shims, the holder and anything else still inside the node's namespaces.
            step(
                "stop what is left in the node's namespaces",
                lambda: self._kill_until_gone(
                    lambda: set(_pids_in_namespace("mnt", mnt)), "the node's processes"
                ),
            )
        net = self._namespaces.get("net")
        if net:
            step(
                "stop what is left in the node's network",
                lambda: self._kill_until_gone(
                    lambda: set(_pids_in_namespace("net", net)), "the node's processes"
                ),
            )
        if holder is not None:
            step("stop the namespace holder", holder.terminate)
        step(
            "stop what is left of the node",
            lambda: self._kill_until_gone(lambda: set(self._marked_pids()), "the node's processes"),
        )
        step("remove the node's cgroups", self._remove_cgroups)
        step("remove the veth", self._remove_link)
        if self.plane is not None:
            plane = self.plane
            if CONTROLLER_MANAGER in plane.processes:
                step("stop the controller manager", plane.processes[CONTROLLER_MANAGER].terminate)
            if APISERVER in plane.processes:
                # A graceful stop would wait 20 s for the API server to take its own address out
                # of the kubernetes Endpoints (its loopback client is answered 429 while it shuts
                # down); this plane and its data are discarded, so nothing is lost by a kill.
                step("kill the API server", lambda: plane.processes[APISERVER].terminate(graceful=False))
            step("stop the control plane", plane.stop)
        step("restore kernel settings", self._restore_sysctls)
        step("remove fixed host paths", self._remove_fixed_paths)
        leftovers = self._leftover_processes()
        if leftovers:
            problems.append(f"processes still running: {leftovers}")
        if not problems:
            self._unregister()
        self._processes.clear()
        self.plane = None
        if self._work_dir is not None:
            (self.node_dir / STATE_FILE).unlink(missing_ok=True)
            if self._owns_work_dir and remove_work_dir and not problems:
                shutil.rmtree(self._work_dir, ignore_errors=True)
        return problems

    def _remove_cgroups(self) -> None:
        def removed() -> bool:
            for cg in self._cgroup_dirs():
                with contextlib.suppress(OSError):
                    cg.rmdir()  # fails while a dying process still counts in it; retried
            return not self._cgroup_dirs()

        eventually(removed, 30, "the node's cgroups to be removable", interval=_POLL)

    def _remove_link(self) -> None:
        if self.network is None:
            return
        link = self.network.host_link

        def exists() -> bool:
            return (
                subprocess.run(["ip", "link", "show", link], capture_output=True, check=False).returncode == 0
            )

        # The veth goes when the kernel frees the node's namespace (asynchronous, usually < 1 s).
        with contextlib.suppress(TimeoutError):
            eventually(lambda: not exists(), 10, f"{link} to go with the node's namespace", interval=_POLL)
        if exists():
            _ip("link", "del", link)

    def _restore_sysctls(self) -> None:
        changed = []
        for key, value in self._sysctls_before.items():
            path = Path("/proc/sys", key)
            if path.read_text() != value:
                changed.append(f"{key}: {path.read_text().strip()} -> {value.strip()}")
                path.write_text(value)
        if changed:
            print(f"node test bed: restored kernel settings {changed}", flush=True)

    def _remove_fixed_paths(self) -> None:
        if self._before is None:
            return
        absent = {ln.split()[0] for ln in self._before.sections.get("paths", []) if ln.endswith(" absent")}
        for raw in hoststate.FIXED_PATHS:
            if raw in absent and os.path.lexists(raw):
                print(f"node test bed: removing {raw}, made while the node ran", flush=True)
                if os.path.isdir(raw) and not os.path.islink(raw):
                    shutil.rmtree(raw)
                else:
                    os.unlink(raw)

    def _marked_pids(self) -> dict[int, str]:
        """The node's own programs still alive whose command line names the node's directory
        (pid -> command line); anyone else's (a ``tail -f`` of a log) is left alone."""
        if self._work_dir is None:
            return {}
        marker, found = str(self.node_dir), {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            cmdline = raw.replace(b"\0", b" ").decode(errors="replace")
            try:
                program = os.path.basename(os.readlink(f"/proc/{entry}/exe"))
            except OSError:
                continue
            if program not in _NODE_PROGRAMS:
                continue
            if marker in cmdline and _proc_start_ticks(int(entry)) is not None:
                found[int(entry)] = cmdline
        return found

    def _leftover_processes(self) -> list[str]:
        found = [f"{pid} {cmd[:120]}" for pid, cmd in self._marked_pids().items()]
        for kind, ns in self._namespaces.items():
            if ns:
                found += [f"{pid} (in the node's {kind} namespace)" for pid in _pids_in_namespace(kind, ns)]
        return found

    def host_diff(self) -> str:
        """What differs now from the machine as the bed found it (while it runs: its own veth,
        routes and cgroup root at least); the same comparison :meth:`stop` makes at the end."""
        if self._before is None:
            raise NodeError("the node test bed has no record of the machine (not started)")
        return hoststate.compare(self._before, hoststate.snapshot())

    # -- measurements --------------------------------------------------------------------------

    def rss_mib(self) -> dict[str, float]:
        """Resident memory of each component, and of the Pods and shims together (MiB)."""
        out = {n: _rss_kib(p.pid) / 1024 for n, p in self._plane().processes.items()}
        out |= {n: _rss_kib(p.pid) / 1024 for n, p in self._processes.items() if n != HOLDER}
        mnt = self._namespaces.get("mnt", "")
        known = {p.pid for p in self._processes.values()}
        shims = [p for p in _pids_in_namespace("mnt", mnt) if p not in known] if mnt else []
        out["shims"] = sum(_rss_kib(p) for p in shims) / 1024
        out["pods"] = sum(_rss_kib(p) for p in self._cgroup_pids()) / 1024
        return out

    # -- detached mode -------------------------------------------------------------------------

    def _write_state(self) -> None:
        state = {
            "version": _STATE_VERSION,
            "slot": self.network.slot if self.network else None,
            "bin_dir": str(self.bin_dir),
            "namespaces": self._namespaces,
            "sysctls_before": self._sysctls_before,
            "images": self._images,
            "scheduler_port": self._scheduler_port,
            "processes": {n: p.to_json() for n, p in self._processes.items()},
        }
        write_file(self.node_dir / STATE_FILE, json.dumps(state, indent=2).encode() + b"\n")

    @classmethod
    def attach(cls, work_dir: Path | str) -> NodeTestBed:
        """The bed recorded in ``work_dir/node/state.json`` by another (possibly exited) process."""
        directory = Path(work_dir).resolve()
        try:
            state = json.loads((directory / "node" / STATE_FILE).read_text())
        except FileNotFoundError:
            raise NodeError(f"no node recorded in {directory}") from None
        if state.get("version") != _STATE_VERSION:
            raise NodeError(f"unsupported node state version in {directory}")
        bed = cls(directory, bin_dir=state["bin_dir"], detach=True)
        bed._owns_work_dir = False
        bed.network = NodeNetwork(state["slot"]) if state.get("slot") is not None else None
        bed._namespaces = dict(state["namespaces"])
        bed._sysctls_before = dict(state["sysctls_before"])
        bed._images = dict(state["images"])
        bed._scheduler_port = int(state["scheduler_port"])
        bed._processes = {n: ManagedProcess.from_json(p) for n, p in state["processes"].items()}
        before = directory / "node" / HOST_BEFORE_FILE
        if before.exists():
            bed._before = hoststate.HostState.from_json(json.loads(before.read_text()))
        with contextlib.suppress(ControlPlaneError):
            bed.plane = LocalControlPlane.attach(directory)
        return bed

    def _refuse_if_running(self) -> None:
        if not (self.node_dir / STATE_FILE).exists():
            return
        with contextlib.suppress(NodeError, ValueError, KeyError, TypeError):
            other = NodeTestBed.attach(self.work_dir)
            running = [n for n, p in other._processes.items() if p.alive()]
            if running:
                raise NodeError(f"{self.work_dir} already runs a node ({', '.join(running)}); stop it first")

    def is_healthy(self) -> bool:
        if self.plane is None or not self._processes:
            return False
        return (
            all(p.alive() for p in self._processes.values()) and self.plane.is_healthy() and self.node_ready()
        )

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self._plane().kubectl(*args, **kwargs)


@contextlib.contextmanager
def node_test_bed(**kwargs: Any) -> Iterator[NodeTestBed]:
    """``with node_test_bed() as bed:`` -- a plane with a Ready node; removed and checked after."""
    bed = NodeTestBed(**kwargs)
    with bed:
        yield bed
