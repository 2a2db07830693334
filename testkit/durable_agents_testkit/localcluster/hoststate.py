"""What a test bed may change on this machine, recorded before and compared after.

This module owns the host-state check of the node test bed (:mod:`.node`): a :class:`HostState`
is a set of named sections, each a sorted list of normalised text lines, read from the machine
as root:

- ``iptables``/``ip6tables``: ``*-save`` of every table, for the nft and the legacy backend
  (packet counters and the generated-at comments removed);
- ``nft``: ``nft list ruleset`` (every nft table, including those iptables never shows);
- ``mounts``: ``/proc/self/mountinfo`` (mount point, root, type, source, options, propagation);
- ``links``, ``addresses``, ``routes``, ``rules``, ``netns``: network devices with their kind,
  addresses, routes of every table, policy rules, named network namespaces;
- ``sysctl``: every readable file under ``/proc/sys`` except the counters that move on their
  own (:data:`VOLATILE_SYSCTLS`) and the per-device entries (devices are compared as links),
  plus the conntrack table size (``/sys/module/nf_conntrack/parameters/hashsize``);
- ``cgroups``: the top-level directories of every cgroup hierarchy (a kubelet adds its root
  there);
- ``paths``: the fixed host paths a kubelet, containerd and CNI write whatever they are told
  (:data:`FIXED_PATHS`), each absent or listed two levels deep.

Loaded kernel modules are not compared: a kernel that loads ``veth`` or ``br_netfilter`` on
first use cannot be put back safely, and on these machines they are built in.

Another container engine on the machine (the image build's dockerd) mounts, unmounts and makes
cgroups under its own names at any time: those (:data:`OTHER_ENGINES`) are left out, and so is
nothing else. :func:`compare` returns a readable diff, empty when nothing changed.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Files under /proc/sys whose values move without anyone changing a setting.
VOLATILE_SYSCTLS: tuple[str, ...] = (
    "fs/dentry-state",
    "fs/file-nr",
    "fs/inode-nr",
    "fs/inode-state",
    "fs/aio-nr",
    "fs/quota/",
    "kernel/ns_last_pid",
    "kernel/random/",
    "kernel/pty/nr",
    "kernel/tainted",
    "kernel/sched_domain/",
    "net/netfilter/nf_conntrack_count",
    "net/ipv4/tcp_fastopen_key",
    "net/ipv4/route/flush",
    "net/ipv6/route/flush",
    "vm/drop_caches",
    "vm/compact_memory",
    "vm/stat_refresh",
    "fs/binfmt_misc/",
    "kernel/perf_event_max_sample_rate",
    "user/",
)
# Per-device sysctl directories: a device and its settings go together, compared as links.
_PER_DEVICE = re.compile(r"^net/ipv[46]/(conf|neigh)/(?!all/|default/)[^/]+/")

# The host paths the node's components use whatever they are told (the kubelet's and containerd's
# fixed directories), and the defaults of every other path they would use if not told otherwise.
FIXED_PATHS: tuple[str, ...] = (
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/var/lib/containerd",
    "/var/lib/kube-proxy",
    "/var/log/containers",
    "/var/log/pods",
    "/run/mount",
    "/run/netns",
    "/run/kubernetes",
    "/run/xtables.lock",
    "/usr/libexec/kubernetes",
    "/etc/cni",
    "/etc/kubernetes",
    "/etc/containerd",
    "/opt/cni",
    "/opt/containerd",
)
# Present or not, never listed: another engine's containerd writes shim sockets there.
PRESENCE_ONLY_PATHS: tuple[str, ...] = ("/run/containerd",)

# Another container engine's own mounts and cgroups (mount point prefixes, cgroup names).
OTHER_ENGINES_MOUNTS: tuple[str, ...] = ("/var/lib/docker", "/run/docker", "/var/run/docker")
OTHER_ENGINES_CGROUPS: tuple[str, ...] = ("docker",)

_LISTING_LIMIT = 200


class HostStateChanged(AssertionError):
    """The machine is not as the test bed found it."""


@dataclass(frozen=True)
class HostState:
    """Named sections of normalised lines; equal states mean nothing checked has changed."""

    sections: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, list[str]]:
        return dict(self.sections)

    @classmethod
    def from_json(cls, data: Mapping[str, Sequence[str]]) -> HostState:
        return cls({k: list(v) for k, v in data.items()})


def _run(argv: Sequence[str]) -> str | None:
    """stdout of ``argv``, None if the tool is missing; a failing tool is an error (not silence)."""
    if shutil.which(argv[0]) is None:
        return None
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


_COUNTERS = re.compile(r"\s*\[\d+:\d+\]")


def _iptables(tool: str) -> list[str] | None:
    out = _run([tool])
    if out is None:
        return None
    lines = []
    for line in out.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        lines.append(_COUNTERS.sub("", line))
    return lines  # order within a chain matters: not sorted


def _nft() -> list[str] | None:
    out = _run(["nft", "list", "ruleset"])
    return None if out is None else [ln.rstrip() for ln in out.splitlines() if ln.strip()]


def _mounts(ignore: Sequence[str]) -> list[str]:
    lines = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        f = left.split()
        mount_point, root, options, optional = f[4], f[3], f[5], f[6:]
        if any(mount_point == p or mount_point.startswith(p + "/") for p in ignore):
            continue
        # Peer-group numbers are renumbered by the kernel; the kind of propagation is kept.
        propagation = ",".join(sorted(re.sub(r":\d+$", "", o) for o in optional)) or "private"
        fstype, source, super_options = ([*right.split(), "", "", ""])[:3]
        lines.append(f"{mount_point} root={root} {fstype} {source} {options} {super_options} {propagation}")
    return sorted(lines)


def _ip_json(*args: str) -> list[dict[str, Any]]:
    out = _run(["ip", "-j", *args])
    return json.loads(out) if out and out.strip() else []


def _links() -> list[str]:
    lines = []
    for link in _ip_json("-d", "link", "show"):
        info = link.get("linkinfo")
        kind = info.get("info_kind", "") if isinstance(info, dict) else ""
        flags = ",".join(sorted(str(f) for f in link.get("flags", []) if f != "LOWER_UP"))
        lines.append(
            f"{link.get('ifname')} kind={kind or link.get('link_type')} mtu={link.get('mtu')} "
            f"master={link.get('master', '-')} flags={flags} address={link.get('address', '-')}"
        )
    return sorted(lines)


def _addresses() -> list[str]:
    lines = []
    for link in _ip_json("addr", "show"):
        for a in link.get("addr_info", []):
            lines.append(f"{link.get('ifname')} {a.get('family')} {a.get('local')}/{a.get('prefixlen')}")
    return sorted(lines)


def _routes() -> list[str]:
    lines = []
    for family in ("-4", "-6"):
        out = _run(["ip", family, "route", "show", "table", "all"]) or ""
        for line in out.splitlines():
            # Lifetimes count down on their own.
            line = re.sub(r"\s+expires \S+", "", line).strip()
            if line:
                lines.append(f"{family} {line}")
    return sorted(lines)


def _rules() -> list[str]:
    out = (_run(["ip", "-4", "rule"]) or "") + (_run(["ip", "-6", "rule"]) or "")
    return sorted(ln.strip() for ln in out.splitlines() if ln.strip())


def _netns() -> list[str]:
    out = _run(["ip", "netns", "list"]) or ""
    return sorted(ln.split()[0] for ln in out.splitlines() if ln.strip())


def _sysctls(root: Path = Path("/proc/sys")) -> list[str]:
    lines = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        if _PER_DEVICE.match(rel_dir) or any(
            rel_dir.startswith(v) for v in VOLATILE_SYSCTLS if v.endswith("/")
        ):
            dirnames[:] = []
            continue
        for name in filenames:
            rel = rel_dir + name
            if rel in VOLATILE_SYSCTLS:
                continue
            try:
                value = (Path(dirpath) / name).read_text()
            except OSError:
                continue  # write-only or unreadable
            lines.append(f"{rel.replace('/', '.')} = {' '.join(value.split())}")
    hashsize = Path("/sys/module/nf_conntrack/parameters/hashsize")
    if hashsize.exists():
        lines.append(f"nf_conntrack.hashsize = {hashsize.read_text().strip()}")
    return sorted(lines)


def cgroup_hierarchies() -> list[Path]:
    """The mount point of every cgroup (v1 and v2) hierarchy of this machine."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] in ("cgroup", "cgroup2"):
            points.append(Path(left.split()[4]))
    return sorted(set(points))


def _cgroups(ignore: Sequence[str]) -> list[str]:
    lines = []
    for hierarchy in cgroup_hierarchies():
        with os.scandir(hierarchy) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) and entry.name not in ignore:
                    lines.append(f"{hierarchy}/{entry.name}")
    return sorted(lines)


def _listing(path: Path, depth: int = 2) -> list[str]:
    out: list[str] = []

    def walk(p: Path, level: int) -> None:
        try:
            entries = sorted(os.scandir(p), key=lambda e: e.name)
        except OSError as err:
            out.append(f"{p} (unreadable: {err.strerror})")
            return
        for e in entries:
            if len(out) >= _LISTING_LIMIT:
                return
            kind = "d" if e.is_dir(follow_symlinks=False) else "l" if e.is_symlink() else "f"
            out.append(f"{e.path} {kind}")
            if kind == "d" and level < depth:
                walk(Path(e.path), level + 1)

    walk(path, 1)
    return out


def _paths(paths: Iterable[str], presence_only: Iterable[str]) -> list[str]:
    lines = []
    for raw in paths:
        p = Path(raw)
        if not os.path.lexists(p):
            lines.append(f"{p} absent")
        elif p.is_dir() and not p.is_symlink():
            lines.append(f"{p} d")
            lines.extend(_listing(p))
        else:
            lines.append(f"{p} f")
    for raw in presence_only:
        lines.append(f"{raw} {'present' if os.path.lexists(raw) else 'absent'}")
    return sorted(lines)


def snapshot(
    *,
    ignore_mounts: Sequence[str] = OTHER_ENGINES_MOUNTS,
    ignore_cgroups: Sequence[str] = OTHER_ENGINES_CGROUPS,
    paths: Sequence[str] = FIXED_PATHS,
) -> HostState:
    """The machine's state now (root needed to read iptables and nft)."""
    sections: dict[str, list[str]] = {}
    for tool in ("iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"):
        lines = _iptables(tool)
        if lines is not None:
            sections[tool] = lines
    if (nft := _nft()) is not None:
        sections["nft"] = nft
    sections["mounts"] = _mounts(ignore_mounts)
    sections["links"] = _links()
    sections["addresses"] = _addresses()
    sections["routes"] = _routes()
    sections["rules"] = _rules()
    sections["netns"] = _netns()
    sections["sysctl"] = _sysctls()
    sections["cgroups"] = _cgroups(ignore_cgroups)
    sections["paths"] = _paths(paths, PRESENCE_ONLY_PATHS)
    return HostState(sections)


def compare(before: HostState, after: HostState) -> str:
    """A unified diff per section that changed (``-`` before, ``+`` after); empty if none did."""
    parts = []
    for name in sorted(set(before.sections) | set(after.sections)):
        a, b = before.sections.get(name), after.sections.get(name)
        if a == b:
            continue
        if a is None or b is None:
            parts.append(
                f"== {name}: {'appeared' if a is None else 'disappeared'} (tool installed or removed?)"
            )
            continue
        diff = difflib.unified_diff(a, b, "before", "after", n=1, lineterm="")
        parts.append(f"== {name}\n" + "\n".join(list(diff)[2:]))
    return "\n".join(parts)


def assert_unchanged(before: HostState, after: HostState, what: str = "the test bed") -> None:
    """Raise :class:`HostStateChanged` with the readable diff if anything differs."""
    diff = compare(before, after)
    if diff:
        raise HostStateChanged(f"{what} left this machine changed:\n{diff}")
