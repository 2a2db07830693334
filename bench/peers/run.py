"""The peer comparison: one workload, six systems, same machine, same invocation.

    .venv/bin/python -m bench.peers.run --out bench/results/peers.json

Systems (``--systems``, default all): ``durable-agents`` (the workload mapped onto the step kinds
the scripted planner has: every computation a committed ``read`` step), ``durable-agents-boundaries``
(computations left uncommitted: only the semantic boundaries), ``durable-agents-model`` (the model
planner driven by the reference model server: the computations are model calls between semantic
boundaries), ``dbos-postgres``, ``langgraph-sqlite`` and ``langgraph-postgres``. See
:mod:`bench.peers.workload` for the workload and each system's module for its mapping and for what
"delivered", "resumed" and "durable commit" mean there.

Each system runs in a worker process of its own; after a warm-up, the repetitions are interleaved
(the order rotates every repetition), so slow drifts of a shared machine's load hit every system
alike. Per repetition: runs per second in steady state with ``--in-flight`` runs in flight,
approval-to-resume p50/p99, durable commits per run and CPU seconds per run (the system's processes
only; the machine's other load is reported next to it; a process that stands in for a remote
service, the reference model server, is reported by itself and not counted). Every run must
complete, and the counting server must have seen every run's idempotency key exactly once:
otherwise the exit status is 1.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from bench.peers import budget, operator_parts, procstat
from bench.peers.apiserver_pprof import ApiServerProfile
from bench.peers.budget import OPERATOR as OPERATOR_PROCESSES
from bench.peers.workload import IN_FLIGHT, RESULT_MARK, percentile, summary

if TYPE_CHECKING:
    from bench.peers.postgres import ThrowawayPostgres

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "bench" / "results" / "peers.json"
HEADLINE = (
    "runs_per_second",
    "approval_p50_ms",
    "approval_p99_ms",
    "durable_commits_per_run",
    "cpu_seconds_per_run",
    "cpu_bound_runs_per_second",
)


@dataclass(frozen=True)
class SystemSpec:
    name: str
    worker: str  # which worker process serves it
    module: str
    config: dict[str, Any] = field(default_factory=dict)
    variant: str | None = None
    uses_postgres: bool = False
    peer: bool = True  # a peer, as opposed to durable-agents itself


SYSTEMS: dict[str, SystemSpec] = {
    s.name: s
    for s in (
        SystemSpec("durable-agents", "durable-agents", "durable_agents_peer", variant="reads", peer=False),
        SystemSpec(
            "durable-agents-boundaries",
            "durable-agents",
            "durable_agents_peer",
            variant="boundaries",
            peer=False,
        ),
        SystemSpec(
            "durable-agents-model", "durable-agents", "durable_agents_peer", variant="model", peer=False
        ),
        SystemSpec("dbos-postgres", "dbos", "dbos_peer", uses_postgres=True),
        SystemSpec("langgraph-sqlite", "langgraph-sqlite", "langgraph_peer", {"variant": "sqlite"}),
        SystemSpec(
            "langgraph-postgres",
            "langgraph-postgres",
            "langgraph_peer",
            {"variant": "postgres"},
            uses_postgres=True,
        ),
    )
}


def spec_of(name: str) -> SystemSpec:
    """A row's system, a ``ROW@base`` row's (``--base``) too."""
    return SYSTEMS[name.removesuffix("@base")]


class WorkerError(RuntimeError):
    pass


class Worker:
    """One worker process and its line protocol (see :mod:`bench.peers.worker`)."""

    def __init__(self, key: str, module: str, config: dict[str, Any], log_path: Path) -> None:
        self.key = key
        self.module = module
        self.config = config
        self.log_path = log_path
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.proc: subprocess.Popen[str] | None = None
        self.info: dict[str, Any] = {}

    def start(self, timeout: float) -> Worker:
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        )
        self._log: IO[str] = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"bench.peers.{self.module}", json.dumps(self.config)],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        threading.Thread(target=self._pump, name=f"{self.key}-stdout", daemon=True).start()
        ready = self.receive(timeout)
        if ready.get("op") != "ready":
            raise WorkerError(f"{self.key} did not start: {ready.get('error')}\n{self.log_tail()}")
        self.info = ready["info"]
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _pump(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(RESULT_MARK):
                self.lines.put(line[len(RESULT_MARK) :])
            else:
                self._log.write(line)
        self.lines.put(None)

    def receive(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise WorkerError(f"{self.key}: no answer within {timeout:.0f}s\n{self.log_tail()}") from None
        if line is None:
            raise WorkerError(f"{self.key} exited\n{self.log_tail()}")
        message: dict[str, Any] = json.loads(line)
        return message

    def command(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        return self.receive(timeout)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.flush()
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            self._log.flush()
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


def package_versions() -> dict[str, str]:
    found = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions() if d.metadata["Name"]}
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def machine() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cores": os.cpu_count(),
        "memory_bytes": procstat.memory_total_bytes(),
        "memory_gib": round(procstat.memory_total_bytes() / 2**30, 1),
        "cpu_model": procstat.cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }


def run_one_rep(
    spec: SystemSpec,
    worker: Worker,
    rep: int,
    runs: int,
    in_flight: int,
    postmaster: int | None,
    refsystem: Any,
    timeout: float,
) -> dict[str, Any]:
    roots = [worker.pid] + ([postmaster] if spec.uses_postgres and postmaster else [])
    # Processes standing in for a remote service (the reference model server): not the system's CPU.
    uncounted = {int(pid): label for pid, label in (worker.info.get("uncounted_processes") or {}).items()}
    labels = {worker.pid: "driver", **uncounted}
    cpu_before = procstat.tree_cpu(roots, labels)
    busy_before = procstat.machine_busy_seconds()
    self_before = sum(os.times()[:2])
    started = time.monotonic()
    operator_pid = worker.info.get("operator_pid")
    with contextlib.ExitStack() as stack:
        # The operator's memory (with its webhook process), for the chart's limits (make bench-resources).
        sampler = stack.enter_context(procstat.RssSampler(operator_pid)) if operator_pid else None
        answer = worker.command(
            {"op": "rep", "rep": rep, "runs": runs, "in_flight": in_flight, "variant": spec.variant}, timeout
        )
    elapsed = time.monotonic() - started
    cpu_after = procstat.tree_cpu(roots, labels)
    busy = procstat.machine_busy_seconds() - busy_before
    self_cpu = sum(os.times()[:2]) - self_before
    if answer.get("op") != "result":
        raise WorkerError(f"{spec.name} rep {rep} failed: {answer.get('error')}\n{worker.log_tail()}")
    result: dict[str, Any] = answer["result"]
    cpu = {
        k: round(cpu_after[k] - cpu_before.get(k, 0.0), 3)
        for k in cpu_after
        if cpu_after[k] - cpu_before.get(k, 0.0) > 0
    }
    measured = sum(cpu.values())
    not_counted = {label: cpu[label] for label in uncounted.values() if label in cpu}
    ours = measured - sum(not_counted.values())
    counts = refsystem.counts()
    keys: list[str] = result.pop("keys")
    wrong = {k: counts.get(k, 0) for k in keys if counts.get(k, 0) != 1}
    latencies: list[float] = result.pop("approval_latencies_ms")
    completed = int(result["completed"])
    capacity = elapsed * (os.cpu_count() or 1)
    return {
        "rep": rep,
        "runs": result["runs"],
        "completed": completed,
        "failures": result["failures"],
        "keys_applied_once": len(keys) - len(wrong),
        "keys_not_applied_once": dict(list(wrong.items())[:20]),
        "ok": completed == runs and not wrong and len(keys) == runs,
        "runs_per_second": result["runs_per_s"],
        "steady_window_runs": result["steady_window_runs"],
        "runs_per_second_overall": round(completed / result["wall_seconds"], 3)
        if result["wall_seconds"]
        else None,
        "wall_seconds": round(result["wall_seconds"], 3),
        "approval_to_resume_ms": {
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies, default=None),
            "n": len(latencies),
        },
        "latencies_ms": latencies,
        "durable_commits": result["commits"],
        "durable_commits_per_run": (
            round(result["commits"] / runs, 2) if result["commits"] is not None else None
        ),
        "commits_detail": result["commits_detail"],
        "cpu_seconds": round(ours, 3),
        "cpu_seconds_per_run": round(ours / runs, 4),
        "cpu_by_process": dict(sorted(cpu.items(), key=lambda kv: -kv[1])),
        **(
            {
                "cpu_not_counted": {
                    label: "stands in for a remote model: in cpu_by_process, NOT included in "
                    "cpu_seconds or cpu_seconds_per_run"
                    for label in sorted(not_counted)
                }
            }
            if not_counted
            else {}
        ),
        "machine": {
            "window_seconds": round(elapsed, 3),
            "busy_fraction": round(busy / capacity, 3),
            "others_fraction": round(max(0.0, busy - measured - self_cpu) / capacity, 3),
            "loadavg": procstat.loadavg(),
        },
        **(result.get("extra") or {}),  # the model mapping's model calls
        **({"operator_memory": sampler.summary()} if sampler is not None else {}),
    }


def summarize(reps: list[dict[str, Any]]) -> dict[str, Any]:
    def metric(get: Any) -> dict[str, Any]:
        return summary([float(v) for r in reps if (v := get(r)) is not None])

    pooled = [x for r in reps for x in r["latencies_ms"]]
    return {
        "runs_per_second": metric(lambda r: r["runs_per_second"]),
        "runs_per_second_overall": metric(lambda r: r["runs_per_second_overall"]),
        "approval_p50_ms": metric(lambda r: r["approval_to_resume_ms"]["p50"]),
        "approval_p99_ms": metric(lambda r: r["approval_to_resume_ms"]["p99"]),
        "approval_pooled_ms": {
            "p50": percentile(pooled, 50),
            "p99": percentile(pooled, 99),
            "n": len(pooled),
        },
        "durable_commits_per_run": metric(lambda r: r["durable_commits_per_run"]),
        "cpu_seconds_per_run": metric(lambda r: r["cpu_seconds_per_run"]),
        # Derived, robust to other load: the rate at which this system's own CPU use alone would
        # saturate every core of this machine (its processes only; an upper bound, not a measurement).
        "cpu_bound_runs_per_second": metric(
            lambda r: (os.cpu_count() or 1) / r["cpu_seconds_per_run"] if r["cpu_seconds_per_run"] else None
        ),
        "cpu_seconds_per_run_by_process": {
            name: summary([r["cpu_by_process"].get(name, 0.0) / r["runs"] for r in reps])["median"]
            for name in sorted({n for r in reps for n in r["cpu_by_process"]})
        },
        "others_cpu_fraction": metric(lambda r: r["machine"]["others_fraction"]),
        **(
            {"model_calls_per_run": metric(lambda r: r["model_calls"]["per_run"])}
            if any("model_calls" in r for r in reps)
            else {}
        ),
    }


def comparison(systems: dict[str, Any]) -> dict[str, Any]:
    """durable-agents' medians divided by each peer's (runs/s > 1 is better; the others < 1)."""
    out: dict[str, Any] = {}

    def med(name: str, key: str) -> float | None:
        value = systems[name]["summary"][key]["median"]
        return float(value) if value is not None else None

    ours = [n for n in systems if not spec_of(n).peer]
    peers = [n for n in systems if spec_of(n).peer]
    for mine in ours:
        for peer in peers:
            row: dict[str, float | None] = {}
            for key in (
                "runs_per_second",
                "approval_p50_ms",
                "approval_p99_ms",
                "durable_commits_per_run",
                "cpu_seconds_per_run",
            ):
                a, b = med(mine, key), med(peer, key)
                row[key] = round(a / b, 3) if a is not None and b else None
            out[f"{mine} / {peer}"] = row
    return out


def table(systems: dict[str, Any]) -> str:
    def fmt(s: dict[str, Any], digits: int = 1) -> str:
        if s["median"] is None:
            return "-"
        spread = f" ±{s['spread_pct'] / 2:.0f}%" if s["spread_pct"] is not None else ""
        return f"{s['median']:.{digits}f}{spread}"

    head = (
        f"{'system':<27} {'runs/s':>11} {'appr p50 ms':>12} {'appr p99 ms':>12} {'commits/run':>12} "
        f"{'CPU s/run':>13} {'CPU-bound/s':>12} {'p50 alone':>10}"
    )
    rows = [head, "-" * len(head)]
    for name, record in systems.items():
        s = record["summary"]
        alone = ((record.get("unloaded") or {}).get("approval_to_resume_ms") or {}).get("p50")
        rows.append(
            f"{name:<27} {fmt(s['runs_per_second']):>11} {fmt(s['approval_p50_ms'], 0):>12} "
            f"{fmt(s['approval_p99_ms'], 0):>12} {fmt(s['durable_commits_per_run']):>12} "
            f"{fmt(s['cpu_seconds_per_run'], 3):>13} {fmt(s['cpu_bound_runs_per_second']):>12} "
            f"{f'{alone:.0f}' if alone is not None else '-':>10}"
        )
    rows.append(
        "median over repetitions, ± half the min-max range relative to the median; CPU-bound/s = cores / "
        "CPU s per run (derived); p50 alone = approval-to-resume p50 with 1 run in flight (ms)"
    )
    return "\n".join(rows)


def plot(systems: dict[str, Any], path: Path, caption: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = list(systems)
    panels = [
        ("runs_per_second", "runs per second (20 in flight)"),
        ("approval_p50_ms", "approval-to-resume p50 (ms)"),
        ("approval_p99_ms", "approval-to-resume p99 (ms)"),
        ("durable_commits_per_run", "durable commits per run"),
        ("cpu_seconds_per_run", "CPU seconds per run (its processes)"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.8 * len(panels), 4.2))
    colors = ["#1f77b4" if not spec_of(n).peer else "#999999" for n in names]
    for ax, (key, title) in zip(axes, panels, strict=True):
        med = [systems[n]["summary"][key]["median"] or 0 for n in names]
        lo = [m - (systems[n]["summary"][key]["min"] or m) for n, m in zip(names, med, strict=True)]
        hi = [(systems[n]["summary"][key]["max"] or m) - m for n, m in zip(names, med, strict=True)]
        ax.bar(range(len(names)), med, yerr=[lo, hi], color=colors, capsize=4)
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.suptitle(caption, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def base_rows(rev: str, specs: list[SystemSpec], tree: Path) -> list[SystemSpec]:
    """The durable-agents rows again, as ``ROW@base``, served by a worker whose operator imports the
    source roots of ``rev`` (``git archive``, as the upgrade tests run a previous release)."""
    from durable_agents_testkit.releases import SOURCE_ROOTS, materialize_release

    # The base's own CRDs too: a change of the stored schema is part of what is compared.
    release = materialize_release(REPO, rev, tree, parts=(*SOURCE_ROOTS, "crds"))
    crds = tree / "crds"
    base = {"operator_pythonpath": release.pythonpath, "operator_revision": release.sha, "crd_dir": str(crds)}
    return [
        replace(s, name=f"{s.name}@base", worker="durable-agents@base", config={**s.config, **base})
        for s in specs
        if not s.peer
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results JSON (default %(default)s)")
    parser.add_argument("--plot", type=Path, default=None, help="PNG plot (default: --out with .png)")
    parser.add_argument("--repeat", "--runs-repeat", type=int, default=3, help="measured repetitions")
    parser.add_argument("--runs", type=int, default=100, help="runs per repetition for durable-agents")
    parser.add_argument("--peer-runs", type=int, default=300, help="runs per repetition for each peer")
    parser.add_argument("--warmup-runs", type=int, default=20, help="runs of the unmeasured warm-up")
    parser.add_argument("--in-flight", type=int, default=IN_FLIGHT)
    parser.add_argument(
        "--unloaded-runs",
        type=int,
        default=10,
        help="after the repetitions, runs with 1 in flight: approval-to-resume without queueing (0: skip)",
    )
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated, from: " + ", ".join(SYSTEMS)
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the workers' logs and work directories"
    )
    parser.add_argument("--rep-timeout", type=float, default=900.0, help="seconds one repetition may take")
    parser.add_argument(
        "--base",
        default=None,
        metavar="REV",
        help="each durable-agents row also run by the operator of git revision REV (as ROW@base, its"
        " own control plane), interleaved with the others: a change's effect measured in one run",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="after the repetitions, one more repetition of each durable-agents row (not counted in its"
        " figures) with py-spy recording the operator: DIR/<row>.svg flame graphs (make profile)",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    args.system_names = names
    if args.in_flight < 1 or args.repeat < 1:
        parser.error("--in-flight and --repeat must be at least 1")
    return args


def profile_rows(
    args: argparse.Namespace,
    specs: list[SystemSpec],
    workers: dict[str, Worker],
    systems: dict[str, Any],
    postmaster: int | None,
    refsystem: Any,
) -> dict[str, str]:
    """One more repetition of each durable-agents row with py-spy recording the operator process and
    its children (the webhook's process) at 100 Hz: a flame graph per row. Its figures are kept apart
    (``profiled``): the sampler's own cost would bend the measured repetitions."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    args.profile.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    for spec in specs:
        pid = workers[spec.worker].info.get("operator_pid")
        if pid is None:
            continue  # a peer: not ours to profile
        out = args.profile / f"{spec.name}.svg"
        # --gil: only the thread holding the GIL is sampled, so the graph shows Python CPU, not the
        # thread pool and sockets waiting (without it, idle pool threads were two thirds of it).
        command = [spy, "record", "--pid", str(pid), "--subprocesses", "--gil", "--rate", "100"]
        command += ["--output", str(out)]
        recorder = subprocess.Popen([*command, "--format", "flamegraph"], stdout=subprocess.DEVNULL)
        kubeconfig = workers[spec.worker].info.get("apiserver_kubeconfig")
        apiserver = (
            ApiServerProfile(Path(kubeconfig), args.profile / f"{spec.name}.apiserver").start()
            if kubeconfig
            else None
        )
        try:
            result = run_one_rep(
                spec,
                workers[spec.worker],
                -3,
                args.runs,
                args.in_flight,
                postmaster,
                refsystem,
                args.rep_timeout,
            )
        finally:
            recorder.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
            recorder.wait(timeout=120)
            pprof = apiserver.stop() if apiserver is not None else None
        if pprof is not None:
            result["apiserver_profile"] = pprof
        if out.exists():
            result["operator_parts"] = _operator_parts(out, result)
        result.pop("latencies_ms")
        systems[spec.name]["profiled"] = result
        written[spec.name] = str(out)
        print(f"  profiled {spec.name:<26} -> {out} ok={result['ok']}", flush=True)
    return written


def _operator_parts(svg: Path, result: dict[str, Any]) -> dict[str, Any]:
    """The flame graph's parts (operator_parts.breakdown), as shares of its samples and as CPU s
    per run of the operator's two processes in this repetition."""
    shares = operator_parts.breakdown(svg.read_text())
    cpu = result["cpu_by_process"]
    per_run = sum(cpu.get(name, 0.0) for name in OPERATOR_PROCESSES) / max(result["runs"], 1)
    return {
        "share": {part: round(share, 4) for part, share in shares.items()},
        "cpu_seconds_per_run": {part: round(share * per_run, 5) for part, share in shares.items()},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from durable_agents_testkit.refsystem import ReferenceSystemThread

    began = time.monotonic()
    specs = [SYSTEMS[n] for n in args.system_names]
    work = Path(tempfile.mkdtemp(prefix="peers-bench-"))
    if args.base is not None:
        specs += base_rows(args.base, specs, work / "base-tree")
    load_start = procstat.loadavg()
    record: dict[str, Any] = {
        "benchmark": "peers",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "-m", "bench.peers.run", *(argv or sys.argv[1:])]),
        "machine": machine(),
        "parameters": {
            "repeat": args.repeat,
            "runs_per_rep": {s.name: args.runs if not s.peer else args.peer_runs for s in specs},
            "warmup_runs": args.warmup_runs,
            "in_flight": args.in_flight,
            "order": "interleaved: each repetition runs every system once, the order rotating",
        },
        "workload": workload_description(),
    }
    pg: ThrowawayPostgres | None = None
    workers: dict[str, Worker] = {}
    systems: dict[str, Any] = {
        s.name: {"info": {}, "warmup": None, "reps": [], "unloaded": None, "profiled": None} for s in specs
    }
    ok = True
    failure = ""
    print(f"peers benchmark: {', '.join(s.name for s in specs)}; logs in {work}", flush=True)
    with ReferenceSystemThread() as refsystem:
        try:
            if any(s.uses_postgres for s in specs):
                # Imported here: the durable-agents rows alone need no PostgreSQL driver (bench extra).
                from bench.peers.postgres import ThrowawayPostgres

                pg = ThrowawayPostgres().start()
                record["postgres"] = pg.facts()
                print(
                    f"  PostgreSQL {record['postgres']['server_version']} on port {pg.port} (fsync on)",
                    flush=True,
                )
            for spec in specs:
                if spec.worker in workers:
                    continue
                variants = [s.variant for s in specs if s.worker == spec.worker and s.variant]
                config = {
                    "refsystem_url": refsystem.url,
                    "work_dir": str(work / spec.worker),
                    **({"variants": variants} if variants else {}),
                    **({"postgres": pg.descriptor()} if pg is not None and spec.uses_postgres else {}),
                    **spec.config,
                }
                (work / spec.worker).mkdir(parents=True, exist_ok=True)
                t = time.monotonic()
                workers[spec.worker] = Worker(
                    spec.worker, spec.module, config, work / f"{spec.worker}.log"
                ).start(600)
                print(f"  {spec.worker} ready in {time.monotonic() - t:.1f}s", flush=True)
            postmaster = pg.postmaster_pid() if pg is not None else None
            for spec in specs:
                systems[spec.name]["info"] = workers[spec.worker].info
                warm = run_one_rep(
                    spec,
                    workers[spec.worker],
                    -1,
                    args.warmup_runs,
                    args.in_flight,
                    postmaster,
                    refsystem,
                    args.rep_timeout,
                )
                warm.pop("latencies_ms")
                systems[spec.name]["warmup"] = warm
                ok &= warm["ok"]
                print(
                    f"  warm-up {spec.name}: {warm['completed']}/{warm['runs']} ok={warm['ok']}", flush=True
                )
            for rep in range(args.repeat):
                order = specs[rep % len(specs) :] + specs[: rep % len(specs)]
                for spec in order:
                    runs = args.runs if not spec.peer else args.peer_runs
                    result = run_one_rep(
                        spec,
                        workers[spec.worker],
                        rep,
                        runs,
                        args.in_flight,
                        postmaster,
                        refsystem,
                        args.rep_timeout,
                    )
                    systems[spec.name]["reps"].append(result)
                    ok &= result["ok"]
                    lat = result["approval_to_resume_ms"]
                    calls = result.get("model_calls")
                    print(
                        f"  rep {rep} {spec.name:<26} {result['runs_per_second'] or 0:7.2f} runs/s  "
                        f"p50 {lat['p50'] or 0:7.1f} ms  p99 {lat['p99'] or 0:7.1f} ms  "
                        f"{result['durable_commits_per_run']} commits/run  "
                        f"{result['cpu_seconds_per_run']:.4f} CPU s/run  "
                        + (f"{calls['per_run']} model calls/run  " if calls else "")
                        + f"others {result['machine']['others_fraction']:.0%}  ok={result['ok']}",
                        flush=True,
                    )
            for spec in specs if args.unloaded_runs > 0 else []:
                alone = run_one_rep(
                    spec,
                    workers[spec.worker],
                    -2,
                    args.unloaded_runs,
                    1,
                    postmaster,
                    refsystem,
                    args.rep_timeout,
                )
                alone.pop("latencies_ms")
                systems[spec.name]["unloaded"] = alone
                ok &= alone["ok"]
                lat = alone["approval_to_resume_ms"]
                print(
                    f"  1 in flight {spec.name:<26} approval p50 {lat['p50'] or 0:7.1f} ms  "
                    f"max {lat['max'] or 0:7.1f} ms  ok={alone['ok']}",
                    flush=True,
                )
            if args.profile is not None:
                record["profiles"] = profile_rows(args, specs, workers, systems, postmaster, refsystem)
                ok &= all((systems[name]["profiled"] or {}).get("ok", False) for name in record["profiles"])
        except Exception as err:
            ok = False
            failure = f"{type(err).__name__}: {err}"
            print(f"FAILED: {failure}", file=sys.stderr, flush=True)
        finally:
            for worker in workers.values():
                worker.stop()
            if pg is not None:
                pg.stop()
        counts = refsystem.counts()
        duplicates = refsystem.duplicates()
    expected = sum(
        (s["warmup"] or {}).get("completed", 0)
        + (s["unloaded"] or {}).get("completed", 0)
        + (s["profiled"] or {}).get("completed", 0)
        + sum(r["completed"] for r in s["reps"])
        for s in systems.values()
    )
    record["verification"] = {
        "ok": ok and not duplicates and sum(counts.values()) == expected,
        "failure": failure,
        "runs_completed": expected,
        "applications_seen_by_counting_server": sum(counts.values()),
        "keys_seen": len(counts),
        "duplicate_keys": duplicates[:20],
        "rule": "every run completes; the counting server saw each run's key exactly once, and nothing else",
    }
    for data in systems.values():
        data["summary"] = summarize(data["reps"])
        # The headline figures also at the top of each record (bench/figure.py reads runs_per_second).
        data.update(
            {k: data["summary"][k] for k in (*HEADLINE, "model_calls_per_run") if k in data["summary"]}
        )
        for r in data["reps"]:
            r.pop("latencies_ms")
    record["systems"] = systems
    record["comparison"] = comparison({n: d for n, d in systems.items() if d["reps"]})
    record["budget"] = budget.records(budget.budgets(record))  # issue 38's targets, what they leave
    record["versions"] = {
        "python": platform.python_version(),
        "postgresql": (record.get("postgres") or {}).get("server_version"),
        "sqlite": sqlite3.sqlite_version,
        "control_plane": next(
            (
                s["info"].get("versions", {}).get("control plane binaries")
                for name, s in systems.items()
                if not spec_of(name).peer and s["info"]
            ),
            None,
        ),
        "packages": package_versions(),
    }
    record["loadavg"] = {"start": load_start, "end": procstat.loadavg()}
    record["wall_seconds"] = round(time.monotonic() - began, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    measured = {n: d for n, d in systems.items() if d["reps"]}
    print()
    print(table(measured))
    png = args.plot or args.out.with_suffix(".png")
    caption = (
        f"peer workload, {args.in_flight} in flight, {record['machine']['nproc']} cores, {record['date']}"
    )
    if measured and plot(measured, png, caption):
        print(f"plot: {png}")
    print(f"results: {args.out}  ({record['wall_seconds']:.0f}s)")
    verified = record["verification"]["ok"]
    print(
        "verification: "
        + (
            "every run completed; every key applied exactly once"
            if verified
            else f"FAILED {record['verification']}"
        )
    )
    if not args.keep_logs and verified:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if verified else 1


def workload_description() -> dict[str, Any]:
    return {
        "steps": 10,
        "computation": "steps 1-4, 5 (after the wait), 6, 7, 9, 10: 64 rounds of SHA-256 over the "
        "run's state",
        "approval": "step 5 waits durably for an approval delivered from outside the run",
        "effect": "step 8 POSTs with an idempotency key to a counting server (testkit refsystem)",
        "approval_to_resume": "from the approval's delivery being accepted (a durable write returned; for "
        "LangGraph, the resume call made) to the run observed past its wait (code after the wait; for "
        "durable-agents, the next committed state seen through a watch)",
        "durable_commits": {
            "durable-agents": "successful write requests in the run's namespace (API server audit log), "
            "each an etcd transaction: status commits, Leases, Events, ActionRecords, the create and the "
            "approval patch",
            "postgres": "COMMIT records in the WAL between the repetition's start and end (pg_waldump); "
            "read-only transactions write none",
            "sqlite": "COMMIT statements on the checkpointer's connection (trace callback); WAL journal, "
            "synchronous=FULL",
        },
        "mapping": {
            "durable-agents": "no pure-computation step kind exists, so steps 1-4, 6, 7, 9 are read steps "
            "(a ConfigMap read as the run's ServiceAccount), decided between semantic boundaries and "
            "committed with them (a crash repeats them). Steps 5 and 8 are one http.post effect step made "
            "consequential by the AgentPolicy: the run parks in waiting_approval and the approval is bound "
            "to the POST's digest, so the wait happens at the POST (steps 6-7 run after it). Step 10 is "
            "complete.",
            "durable-agents-boundaries": "the replayable computations need no commit and are left out: the "
            "run is the approval-gated http.post step and complete: what a user of this operator writes for "
            "the workload (with the model planner, the computations are model calls between boundaries: "
            "durable-agents-model).",
            "durable-agents-model": (
                "what a user of this operator writes: the model planner (spec.agent) driven by the "
                "reference model server (a scripted OpenAI-compatible server, run as its own process; its "
                "CPU is reported apart and not counted: it stands in for a remote model). Tools: "
                "read_input (a ConfigMap read by name, non-consequential) and post_result (http.post, "
                "consequential by the same AgentPolicy). 8 model calls per run where the 8 computations "
                "stand: 3 reads, the POST proposed (the run waits for an approval bound to its digest), "
                "after its outcome 3 reads and the final answer. Model calls are no commits of their own: "
                "what the model proposed is written with the next boundary, or when the policy's bound "
                "of model calls between two writes (default 4) is reached."
            ),
            "dbos-postgres": "@DBOS.workflow with 10 @DBOS.step steps (step 8 the POST); DBOS.recv before "
            "step 5, DBOS.send from the driver",
            "langgraph": "a linear StateGraph of 10 nodes, durability='sync'; interrupt() in node 5, resumed "
            "with Command(resume=...); node 8 the POST",
        },
    }


if __name__ == "__main__":
    raise SystemExit(main())
