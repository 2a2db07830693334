"""A detached local control plane for the demo, the docs and make targets (``make cluster-up``).

This module owns the command line only; the plane itself is
:class:`~durable_agents_testkit.localcluster.controlplane.LocalControlPlane` in detached mode, which
records its processes in ``DIR/state.json`` so that a later ``status`` or ``down`` (another
process) can find them.

    CLI=durable_agents_testkit.localcluster.cli
    python -m $CLI up [--dir DIR] [--fsync]   # last stdout line: the admin kubeconfig
    python -m $CLI up --node [--dir DIR]      # with a real node (root; see localcluster.node)
    python -m $CLI status [--dir DIR]
    python -m $CLI user NAME [--group G ...]  # last stdout line: that user's kubeconfig
    python -m $CLI down [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from durable_agents_testkit.localcluster.controlplane import (
    ControlPlaneError,
    LocalControlPlane,
    find_repo_root,
)
from durable_agents_testkit.localcluster.hoststate import HostStateChanged
from durable_agents_testkit.localcluster.node import NodeError, NodeTestBed


def default_dir() -> Path:
    """``<repo>/.cluster`` (git-ignored), or ``./.cluster`` outside a checkout."""
    root = find_repo_root()
    return (root if root is not None else Path.cwd()) / ".cluster"


def _attach(directory: Path) -> LocalControlPlane | None:
    try:
        return LocalControlPlane.attach(directory)
    except ControlPlaneError:
        return None


def _info(message: str) -> None:
    # Progress goes to stderr so stdout stays machine-readable (its last line is a path).
    print(message, file=sys.stderr, flush=True)


def _attach_node(directory: Path) -> NodeTestBed | None:
    try:
        return NodeTestBed.attach(directory)
    except NodeError:
        return None


def cmd_up_node(args: argparse.Namespace) -> int:
    directory: Path = args.dir
    existing = _attach_node(directory)
    if existing is not None:
        if existing.is_healthy():
            _info(f"already running with a node: {existing.kubeconfig_path}")
            print(existing.kubeconfig_path)
            return 0
        _info(f"a previous node in {directory} is unhealthy; removing what is left of it")
        existing.stop()
    elif _attach(directory) is not None:
        raise ControlPlaneError(f"{directory} runs a control plane without a node: make cluster-down first")
    directory.mkdir(parents=True, exist_ok=True)
    bed = NodeTestBed(directory, detach=True, ready_timeout=args.timeout)
    _info(f"starting the control plane with a node in {directory}")
    bed.start()
    assert bed.plane is not None
    assert bed.network is not None
    _info(f"node Ready in {bed.timings['ready_seconds']:.1f}s: {bed.plane.server_url}")
    _info(f"  Pods {bed.network.pod_cidr}, Services {bed.network.service_cidr}; image {bed.probe_image}")
    _info(f"  export KUBECONFIG={bed.kubeconfig_path}")
    print(bed.kubeconfig_path)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    if args.node:
        return cmd_up_node(args)
    directory: Path = args.dir
    existing = _attach(directory)
    if existing is not None:
        if existing.is_healthy():
            _info(f"already running: {existing.server_url}")
            print(existing.kubeconfig_path)
            return 0
        _info(f"a previous control plane in {directory} is unhealthy; stopping what is left of it")
        existing.stop()
    directory.mkdir(parents=True, exist_ok=True)
    plane = LocalControlPlane(
        directory,
        fsync=args.fsync,
        controller_manager=not args.no_controller_manager,
        detach=True,
        keep_work_dir=True,
        startup_timeout=args.timeout,
    )
    _info(f"starting the control plane in {directory} (etcd fsync {'on' if args.fsync else 'off'})")
    plane.start()
    _info(f"ready in {plane.startup_seconds:.1f}s: {plane.server_url}")
    _info(f"  export KUBECONFIG={plane.kubeconfig_path}")
    print(plane.kubeconfig_path)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    directory: Path = args.dir
    bed = _attach_node(directory)
    if bed is not None:
        # Stops the node and the plane, removes what the node made, and compares the machine
        # with what `up` recorded (HostStateChanged, with the diff, if it differs).
        bed.stop()
        shutil.rmtree(directory / "etcd-data", ignore_errors=True)
        _info(f"stopped the node and the control plane in {directory}; this machine is as it was before")
        return 0
    plane = _attach(directory)
    if plane is None:
        _info(f"no control plane recorded in {directory}")
        return 0
    plane.stop()  # waits (bounded) until every recorded process is gone, then removes state.json
    # The data goes too: the next `up` starts an empty cluster with fresh certificates anyway.
    shutil.rmtree(directory / "etcd-data", ignore_errors=True)
    _info(f"stopped the control plane in {directory}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    directory: Path = args.dir
    plane = _attach(directory)
    if plane is None:
        print(json.dumps({"dir": str(directory), "running": False}, indent=2))
        return 1
    healthy = plane.is_healthy()
    report = {
        "dir": str(directory),
        "running": True,
        "healthy": healthy,
        "server_url": plane.server_url,
        "kubeconfig": str(plane.kubeconfig_path),
        "processes": {n: {"pid": p.pid, "alive": p.alive()} for n, p in plane.processes.items()},
    }
    print(json.dumps(report, indent=2))
    return 0 if healthy else 1


def cmd_user(args: argparse.Namespace) -> int:
    plane = _attach(args.dir)
    if plane is None:
        _info(f"no control plane recorded in {args.dir}; run `make cluster-up` first")
        return 1
    print(plane.write_user_kubeconfig(args.name, args.group))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durable-agents-cluster",
        description="A local Kubernetes control plane (etcd + kube-apiserver + kube-controller-manager).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def with_dir(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--dir", type=Path, default=None, help="state directory (default: <repo>/.cluster)")
        return p

    up = with_dir(sub.add_parser("up", help="start (or reuse) a detached control plane"))
    up.add_argument("--fsync", action="store_true", help="let etcd fsync (benchmarks); default off")
    up.add_argument("--no-controller-manager", action="store_true", help="etcd and kube-apiserver only")
    up.add_argument("--timeout", type=float, default=120.0, help="readiness deadline per component (s)")
    up.add_argument(
        "--node",
        action="store_true",
        help="with a real node: kubelet, containerd, kube-proxy, scheduler (root; make cluster-up NODE=1)",
    )
    up.set_defaults(func=cmd_up)
    with_dir(sub.add_parser("down", help="stop the control plane and remove its state")).set_defaults(
        func=cmd_down
    )
    with_dir(sub.add_parser("status", help="report the recorded processes and readiness")).set_defaults(
        func=cmd_status
    )
    user = with_dir(sub.add_parser("user", help="mint a client-certificate user and write its kubeconfig"))
    user.add_argument("name")
    user.add_argument("--group", action="append", default=[], help="a group (repeatable)")
    user.set_defaults(func=cmd_user)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.dir = (args.dir or default_dir()).resolve()
    try:
        code: int = args.func(args)
    except (ControlPlaneError, TimeoutError, HostStateChanged) as err:
        print(f"durable-agents-cluster: {err}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
