"""``make bench``: the core benchmarks (commit throughput, recovery, idle cost), each beside its
baseline from the same run.

One local control plane (etcd with fsync ON), the operator as a separate process, as its own user
(so the API server's audit log attributes every request). Each figure is repeated; the JSON keeps
every sample, the median and the spread (min, max). Ratios against the baseline are what matter:
the machine is shared and noisy.

    .venv/bin/python -m bench.core --scale small --repeat 3 --out bench/results/core.json

``--scale full`` sizes the idle and cold-start figures at 10,000 runs (the issue's target);
``small`` at 1,000 (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from durable_agents import __version__
from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.retention import FINALIZER
from durable_agents_testkit.audit import read_audit
from durable_agents_testkit.cluster import KubeEnv, install_crds
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import admitted
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.scrape import free_port, metric, scrape

REPO = Path(__file__).resolve().parents[1]
OPERATOR_USER = "durable-agents-operator"
SCALES = {"small": {"idle_runs": 1000}, "full": {"idle_runs": 10000}}


def log(message: str) -> None:
    """A benchmark's progress line, timestamped (runs take minutes to hours)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Env:
    plane: LocalControlPlane
    kube: KubeEnv
    operator_kubeconfig: Path
    work: Path
    operator_env: dict[str, str] = field(default_factory=dict)  # e.g. PYTHONPATH of another release

    @property
    def custom(self) -> client.CustomObjectsApi:
        return self.kube.custom()

    def namespace(self) -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        client.CoreV1Api(self.kube.api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
        )
        return name

    def operator(self, namespace: str, name: str, lease: int = 15, **env: str) -> OperatorProcess:
        """An operator process watching ``namespace``; the lease defaults to the operator's own (15s)."""
        env.setdefault("DURABLE_AGENTS_NAMESPACE", namespace)
        env = {**self.operator_env, **env}
        op = OperatorProcess(
            self.operator_kubeconfig, self.work / "operators", name=name, lease_duration=lease, env=env
        )
        return op.start()

    def operator_requests(self, since: datetime, until: datetime, writes_only: bool) -> list[Any]:
        entries = read_audit(self.plane.audit_log_path, user=OPERATOR_USER, since=since, until=until)
        return [e for e in entries if e.is_write or not writes_only]


@contextmanager
def environment() -> Iterator[Env]:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp, LocalControlPlane(fsync=True) as plane:
        kube = KubeEnv.local(plane)
        install_crds(kube.api, REPO / "crds")
        # The operator as its own user (audit attribution); full rights keep the bench about speed.
        kubeconfig = Path(plane.write_user_kubeconfig(OPERATOR_USER, ["system:masters"]))
        yield Env(plane, kube, kubeconfig, Path(tmp))


def summary(samples: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRun", "metadata": {"name": name}, "spec": spec}


def create_runs(
    env: Env,
    namespace: str,
    specs: dict[str, dict[str, Any]],
    threads: int = 8,
    per_second: float = 0,
    finalizers: tuple[str, ...] = (),
) -> None:
    """Create the runs, stamped as the webhook stamps them; at most ``per_second`` (0: at once);
    with ``finalizers`` already in their metadata."""
    custom = env.custom
    began = time.monotonic()

    def create(numbered: tuple[int, tuple[str, dict[str, Any]]]) -> None:
        index, item = numbered
        if per_second > 0:
            time.sleep(max(0.0, began + index / per_second - time.monotonic()))
        body = run_body(*item)
        body["metadata"]["namespace"] = namespace
        if finalizers:
            body["metadata"]["finalizers"] = list(finalizers)
        body["spec"] = {**body["spec"], **admitted("CREATE", body, None)}  # as the webhook stamps it
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", body)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, enumerate(specs.items())))


def list_runs(env: Env, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = env.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "agentruns", limit=500, _continue=token
        )
        items += page["items"]
        token = page["metadata"].get("continue")
        if not token:
            return items


def states(env: Env, namespace: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for run in list_runs(env, namespace):
        state = (run.get("status") or {}).get("state", "pending")
        counts[state] = counts.get(state, 0) + 1
    return counts


def await_states(
    env: Env, namespace: str, state: str, count: int, timeout: float, interval: float = 0.5
) -> None:
    eventually(
        lambda: states(env, namespace).get(state, 0) >= count,
        timeout,
        f"{count} runs in {state} in {namespace}",
        interval=interval,
    )


def await_finalized(env: Env, namespace: str, count: int, timeout: float, interval: float = 2.0) -> None:
    """Until ``count`` runs carry the retention finalizer. Retention adds it to each parked run, one
    paced write per run, behind the parking itself: until it has, the operator is catching up
    (a write and its watch event per run), not idle, and an idle window would measure that."""

    def finalized() -> int:
        return sum(FINALIZER in (r["metadata"].get("finalizers") or []) for r in list_runs(env, namespace))

    eventually(
        lambda: finalized() >= count,
        timeout,
        f"{count} runs with {FINALIZER} in {namespace}",
        interval=interval,
    )


# --- transitions per second vs raw status writes per second -----------------------------------

STEPS = 8


def await_steps(steps: int) -> dict[str, Any]:
    """Steps that commit and never wait: each event is delivered up front (3 transitions a step)."""
    return {
        "taskType": "bench",
        "objective": "transitions per second",
        "steps": [{"name": f"s{i}", "await": {"event": f"e{i}"}} for i in range(steps)]
        + [{"name": "done", "complete": {"result": "ok"}}],
        "events": {f"e{i}": "now" for i in range(steps)},
    }


def bench_transitions(env: Env, runs: int) -> dict[str, Any]:
    namespace = env.namespace()
    op = env.operator(namespace, "transitions")
    try:
        names = {f"r{i}": await_steps(STEPS) for i in range(runs)}
        since = datetime.now(UTC)
        started = time.perf_counter()
        create_runs(env, namespace, names)
        await_states(env, namespace, "completed", runs, timeout=600, interval=0.1)
        elapsed = time.perf_counter() - started
        until = datetime.now(UTC)
    finally:
        op.stop()
    done = list_runs(env, namespace)
    transitions = sum(r["status"]["stateVersion"] for r in done)
    writes = env.operator_requests(since, until, writes_only=True)
    by_kind: dict[str, int] = {}
    for entry in writes:
        by_kind[f"{entry.what} {entry.verb}"] = by_kind.get(f"{entry.what} {entry.verb}", 0) + 1
    return {
        "runs": runs,
        "transitions": transitions,
        "seconds": elapsed,
        "transitions_per_second": transitions / elapsed,
        "api_writes": len(writes),
        "api_writes_per_transition": len(writes) / transitions,
        "status_writes_per_transition": by_kind.get("agentruns/status update", 0) / transitions,
        "writes_by_kind": by_kind,
        "sample_status": done[0]["status"],
    }


def bench_raw_writes(env: Env, objects: int, writes: int, status: dict[str, Any]) -> float:
    """Status writes per second by a minimal client: PUT status with the last resourceVersion, one
    thread per object (as many writers as the operator has runs in flight)."""
    threads = objects
    namespace = env.namespace()
    custom = env.custom
    create_runs(env, namespace, {f"raw{i}": await_steps(STEPS) for i in range(objects)})
    per_object = max(1, writes // objects)

    def hammer(i: int) -> None:
        body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", f"raw{i}")
        for n in range(per_object):
            body["status"] = {**status, "stateVersion": n + 1}
            body = custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, namespace, "agentruns", f"raw{i}", body
            )

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(hammer, range(objects)))
    return per_object * objects / (time.perf_counter() - started)


def bench_write_rtt(env: Env, status: dict[str, Any], count: int = 100) -> list[float]:
    namespace = env.namespace()
    custom = env.custom
    create_runs(env, namespace, {"rtt": await_steps(1)})
    body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", "rtt")
    samples = []
    for n in range(count):
        body["status"] = {**status, "stateVersion": n + 1}
        started = time.perf_counter()
        body = custom.replace_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "agentruns", "rtt", body
        )
        samples.append(time.perf_counter() - started)
    return samples


# --- approval-to-resume latency ------------------------------------------------------------------


def bench_approval(env: Env, runs: int) -> list[float]:
    """Patch accepted -> approval_decided committed, per run (the history entry's instant)."""
    namespace = env.namespace()
    policy = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "payments"},
        "spec": {
            "version": "v1",
            "tiers": {"http.post": "consequential"},
            "approvalRequiredTiers": ["consequential"],
        },
    }
    env.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", policy)
    latencies: list[float] = []
    with ReferenceSystemThread() as refsystem:
        op = env.operator(namespace, "approvals")
        try:
            pay = {
                "name": "pay",
                "effect": {
                    "effect": "http.post",
                    "target": {"url": f"{refsystem.url}/effects", "queryUrl": f"{refsystem.url}/effects"},
                    "arguments": {"amount": 1},
                },
            }
            spec = {
                "taskType": "bench",
                "objective": "approval latency",
                "policyRef": {"name": "payments"},
                "steps": [pay, {"name": "done", "complete": {"result": "ok"}}],
            }
            create_runs(env, namespace, {f"a{i}": spec for i in range(runs)})
            await_states(env, namespace, "waiting_approval", runs, timeout=300)
            for run in list_runs(env, namespace):
                request = run["status"]["approvalRequest"]
                decision = {
                    "digest": request["digest"],
                    "decision": "approve",
                    "approver": {"username": "bench"},
                    "decidedAt": datetime.now(UTC).isoformat(),
                }
                decided_run = {**run, "spec": {**run["spec"], "approvals": {request["requestId"]: decision}}}
                patch = {"spec": admitted("UPDATE", decided_run, run)}  # stamped as the webhook does
                env.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, "agentruns", run["metadata"]["name"], patch
                )
                accepted = datetime.now(UTC)  # the patch's answer: the API server has stored it

                def decided(name: str = run["metadata"]["name"]) -> datetime | None:
                    body = env.custom.get_namespaced_custom_object(
                        GROUP, VERSION, namespace, "agentruns", name
                    )
                    # When the committed decision is seen (polled every 10 ms), not the history
                    # entry's time: a batch decides in memory, then writes at its boundary.
                    for h in body["status"]["history"]:
                        if h["event"] == "approval_decided":
                            return datetime.now(UTC)
                    return None

                at = eventually(decided, Within.TAKEOVER, "the approval to be committed", interval=0.01)
                latencies.append(max(0.0, (at - accepted).total_seconds()))
            await_states(env, namespace, "completed", runs, timeout=300)
            assert refsystem.duplicates() == [], refsystem.duplicates()
        finally:
            op.stop()
    return latencies


# --- crash takeover ----------------------------------------------------------------------------------


def bench_takeover(env: Env, lease: int) -> float:
    """SIGKILL the holder of a run mid-flight; seconds until another process advances it again."""
    namespace = env.namespace()
    slow = env.operator(namespace, "holder", lease, DURABLE_AGENTS_TEST_COMMIT_DELAY="0.3")
    create_runs(env, namespace, {"long": await_steps(60)})

    def version() -> int:
        body = env.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", "long")
        return int((body.get("status") or {}).get("stateVersion", 0))

    standby = env.operator(namespace, "standby", lease)
    try:
        eventually(lambda: version() >= 4, Within.TAKEOVER, "the holder to be mid-flight", interval=0.05)
        slow.kill()
        killed_at = time.perf_counter()
        seen = version()

        def advanced() -> bool:
            body = env.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", "long")
            history = body["status"]["history"]
            return bool(body["status"]["stateVersion"] > seen and history[-1]["holder"] == standby.identity)

        eventually(advanced, lease * 4 + 30.0, "the standby to take over", interval=0.02)
        return time.perf_counter() - killed_at
    finally:
        standby.stop()
        slow.stop()


# --- idle cost and cold start --------------------------------------------------------------------


def proc_sample(pid: int) -> tuple[float, float]:
    """(RSS in MiB, CPU seconds so far) of a process."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / ticks


def idle_window(env: Env, op: OperatorProcess, seconds: float) -> dict[str, float]:
    rss0, cpu0 = proc_sample(op.pid)
    since = datetime.now(UTC)
    time.sleep(seconds)  # the window itself is what is measured
    until = datetime.now(UTC)
    rss1, cpu1 = proc_sample(op.pid)
    requests = env.operator_requests(since, until, writes_only=False)
    writes = [e for e in requests if e.is_write]
    return {
        "rss_mib": max(rss0, rss1),
        "cpu_percent": 100 * (cpu1 - cpu0) / seconds,
        "requests_per_minute": len([e for e in requests if e.verb != "watch"]) * 60 / seconds,
        "writes_per_minute": len(writes) * 60 / seconds,
    }


def parked(port: int) -> float:
    try:
        return metric(scrape(port), 'durable_agents_scheduled_wakeups{queue="run-worker"}')
    except (OSError, AssertionError):
        return -1.0


def bench_idle_and_cold_start(env: Env, runs: int, window: float) -> dict[str, Any]:
    empty = env.namespace()
    port = free_port()
    op = env.operator(empty, "idle-0", DURABLE_AGENTS_METRICS_PORT=str(port))
    try:
        time.sleep(5)  # let start-up requests (discovery, initial lists) pass: idle is what is measured
        baseline = idle_window(env, op, window)
    finally:
        op.stop()
    namespace = env.namespace()
    ask = {
        "taskType": "bench",
        "objective": "wait for a human",
        "steps": [{"name": "confirm", "ask": {"question": "go on?", "expiresIn": "72h"}}],
    }
    port = free_port()
    op = env.operator(namespace, "idle-n", DURABLE_AGENTS_METRICS_PORT=str(port))
    started = time.perf_counter()
    try:
        create_runs(env, namespace, {f"w{i:05d}": ask for i in range(runs)})
        await_states(env, namespace, "waiting_input", runs, timeout=60 * 60, interval=5)
        parking = time.perf_counter() - started
        loaded = idle_window(env, op, window)
    finally:
        op.stop()
    # Cold start: a fresh process, all runs already waiting; ready when every expiry is armed.
    port = free_port()
    started = time.perf_counter()
    op = env.operator(namespace, "cold", DURABLE_AGENTS_METRICS_PORT=str(port))
    try:
        eventually(lambda: parked(port) >= runs, 2 * Within.SETTLE, f"{runs} wake-ups armed", interval=0.1)
        cold = time.perf_counter() - started
        after_cold = idle_window(env, op, min(window, 30))
    finally:
        op.stop()
    listed = time.perf_counter()
    assert len(list_runs(env, namespace)) == runs
    raw_list = time.perf_counter() - listed
    return {
        "runs": runs,
        "window_seconds": window,
        "baseline_0_runs": baseline,
        "n_runs": loaded,
        "seconds_to_park_all": parking,
        "cold_start_seconds": cold,
        "raw_list_seconds": raw_list,
        "after_cold_start": after_cold,
    }


# --- the run -------------------------------------------------------------------------------------


def repeat(times: int, fn: Callable[[], float]) -> dict[str, Any]:
    return summary([fn() for _ in range(times)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="small")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20, help="concurrent runs for transitions and approvals")
    parser.add_argument("--lease", type=int, default=5)
    parser.add_argument("--window", type=float, default=60.0, help="idle measurement window, seconds")
    parser.add_argument("--idle-runs", type=int, help="override the scale's number of waiting runs")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/core.json")
    args = parser.parse_args(argv)
    scale = dict(SCALES[args.scale])
    if args.idle_runs is not None:
        scale["idle_runs"] = args.idle_runs
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cores": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "platform": platform.platform(),
        },
        "operator_version": __version__,
        "scale": args.scale,
        "repeat": args.repeat,
        "etcd_fsync": True,
    }
    with environment() as env:
        log("transitions per second")
        transitions = [bench_transitions(env, args.runs) for _ in range(args.repeat)]
        status = transitions[0].pop("sample_status")
        for t in transitions[1:]:
            t.pop("sample_status")
        log("raw status writes per second (baseline)")
        total = transitions[0]["transitions"]
        raw = repeat(args.repeat, lambda: bench_raw_writes(env, args.runs, total, status))
        log("raw minimal status writes per second (the limit of this design on this machine)")
        minimal = repeat(
            args.repeat,
            lambda: bench_raw_writes(env, args.runs, total, {"state": "ready", "stateVersion": 1}),
        )
        rate = summary([t["transitions_per_second"] for t in transitions])
        log(
            f"transitions/s {rate['median']:.1f}; raw writes of the operator's status shape "
            f"{raw['median']:.1f}/s (ratio {rate['median'] / raw['median']:.2f}); raw writes of a minimal "
            f"status {minimal['median']:.1f}/s (shape/minimal {raw['median'] / minimal['median']:.2f})"
        )
        results["transitions"] = {
            "transitions_per_second": rate,
            "raw_status_writes_per_second": raw,
            "ratio_median": rate["median"] / raw["median"],
            "raw_minimal_status_writes_per_second": minimal,
            "shape_to_minimal_ratio_median": raw["median"] / minimal["median"],
            "api_writes_per_transition": summary([t["api_writes_per_transition"] for t in transitions]),
            "status_writes_per_transition": summary([t["status_writes_per_transition"] for t in transitions]),
            "writes_by_kind_first_run": transitions[0]["writes_by_kind"],
            "runs": args.runs,
            "steps_per_run": STEPS,
        }
        log("approval-to-resume latency")
        approvals: list[float] = []
        for _ in range(args.repeat):
            approvals += bench_approval(env, args.runs)
        rtt = bench_write_rtt(env, status)
        results["approval_to_resume"] = {
            "p50_seconds": percentile(approvals, 0.5),
            "p99_seconds": percentile(approvals, 0.99),
            "samples": approvals,
            "raw_write_rtt_p50_seconds": percentile(rtt, 0.5),
            "raw_write_rtt_p99_seconds": percentile(rtt, 0.99),
        }
        log("crash takeover")
        takeover = repeat(args.repeat, lambda: bench_takeover(env, args.lease))
        results["takeover"] = {"seconds": takeover, "lease_seconds": args.lease}
        log(f"idle cost and cold start with {scale['idle_runs']} runs")
        results["idle"] = bench_idle_and_cold_start(env, scale["idle_runs"], args.window)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "approval_to_resume"}, indent=2)[:4000])
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    raise SystemExit(main())
