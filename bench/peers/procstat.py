"""CPU time of process trees and of the whole machine, from /proc (Linux).

Every system's CPU is charged to it: its worker process and all its descendants (the operator and
the control plane for durable-agents), plus the PostgreSQL server's processes for the systems that
use it. The machine's total busy time over the same window shows how much CPU other work (other
people's tests on a shared machine) took meanwhile.
"""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(command name, parent pid, CPU seconds incl. reaped children) of one process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return name, ppid, (utime + stime + cutime + cstime) / CLK_TCK


def tree_cpu(roots: list[int], labels: dict[int, str] | None = None) -> dict[str, float]:
    """CPU seconds of ``roots`` and all their descendants, by command name (or label of a root)."""
    stats: dict[int, tuple[str, int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            stats[int(entry)] = st
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[str, float] = {}
    stack = [r for r in roots if r in stats]
    seen: set[int] = set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        name, _, cpu = stats[pid]
        label = (labels or {}).get(pid) or _python_module(pid, name)
        out[label] = out.get(label, 0.0) + cpu
        stack.extend(children.get(pid, []))
    return out


def _python_module(pid: int, name: str) -> str:
    """``python -m MODULE`` processes by their module (the operator is one), others by name."""
    if not name.startswith("python"):
        return name
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return name
    if b"-m" in argv[:-1]:
        return f"python -m {argv[argv.index(b'-m') + 1].decode(errors='replace')}"
    return name


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (from the aggregate line of /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(x) for x in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    # guest time is already included in user and nice.
    total = sum(values[:8])
    return (total - idle) / CLK_TCK


def memory_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def tree_memory_bytes(root: int) -> tuple[int, int]:
    """(RSS summed, PSS summed) of ``root`` and all its descendants. The RSS sum counts a page two
    processes share (a forked child's) twice; the PSS sum shares it out, so it is what the
    processes hold together, as their container's memory accounting sees it (page cache aside)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            parents[int(entry)] = st[1]
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    rss = pss = 0
    for pid in tree:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in rollup.splitlines():
            if line.startswith("Rss:"):
                rss += int(line.split()[1]) * 1024
            elif line.startswith("Pss:"):
                pss += int(line.split()[1]) * 1024
    return rss, pss


class RssSampler:
    """The peak and mean of :func:`tree_memory_bytes` of one process tree, sampled on a thread."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        import threading

        self.root, self.interval = root, interval
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(tree_memory_bytes(self.root))
            self._stop.wait(self.interval)

    def summary(self) -> dict[str, float]:
        rss = [r / 2**20 for r, _ in self.samples if r] or [0.0]
        pss = [p / 2**20 for _, p in self.samples if p] or [0.0]
        return {
            "peak_mib": round(max(pss), 1),  # PSS: what the container holds
            "mean_mib": round(sum(pss) / len(pss), 1),
            "rss_sum_peak_mib": round(max(rss), 1),
            "samples": len(pss),
        }
