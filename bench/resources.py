"""``make bench-resources``: what the operator's container needs, measured, against the chart's
requests and limits (issue 37, item 7).

The container's memory is the operator process and its children (the admission webhook's own
process): their proportional set sizes summed (PSS, :func:`bench.peers.procstat.tree_memory_bytes`;
the RSS sum, which counts shared pages twice, is kept beside it), sampled every 0.2 s; the figure
a memory limit meets is the peak. Two loads, as the chart's defaults must hold
for both:

* ``parked``: ``--parked`` runs (default 10,000) created at once and taken to their wait for
  input by one operator (parking), then a fresh operator's cold start (every run listed, every
  expiry armed) and ``--window`` seconds idle; the webhook on, as the chart installs it.
* ``busy``: the peer workload's durable-agents rows (``bench.peers.run``: 20 runs in flight, the
  webhook on, approvals through it; the scripted row and the model-planner row), one repetition
  each, the same sampler on the operator's tree.

The JSON (``bench/results/resources.json``) holds both peaks, the CPU, and the chart's requests and
limits read from ``charts/durable-agents/values.yaml`` with the headroom each leaves.

    .venv/bin/python -m bench.resources --parked 10000 --out bench/results/resources.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench.core import REPO, await_finalized, await_states, create_runs, environment, log, parked, proc_sample
from bench.peers import procstat
from bench.peers import run as peers
from durable_agents import __version__
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.governance import permissive_default
from durable_agents_testkit.scrape import free_port

VALUES = REPO / "charts/durable-agents/values.yaml"
ASK = {
    "taskType": "bench",
    "objective": "wait for a human",
    "steps": [{"name": "confirm", "ask": {"question": "go on?", "expiresIn": "72h"}}],
}


def mebibytes(quantity: str) -> float:
    """A Kubernetes memory quantity (``320Mi``, ``1Gi``, ``500M``) in MiB."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor / 2**20
    return float(quantity) / 2**20


def chart_resources() -> dict[str, Any]:
    resources: dict[str, Any] = yaml.safe_load(VALUES.read_text())["resources"]
    return resources


def measure_parked(count: int, window: float) -> dict[str, Any]:
    with environment() as env:
        namespace = env.namespace()
        permissive_default(env.kube.api, namespace)
        started = time.perf_counter()
        create_runs(env, namespace, {f"w{i:05d}": ASK for i in range(count)})
        created = time.perf_counter() - started
        # Parking: one operator takes every new run to its wait (each run's first commits).
        op = env.operator(namespace, "parking", DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
        started = time.perf_counter()
        try:
            with procstat.RssSampler(op.pid) as parking:
                await_states(env, namespace, "waiting_input", count, timeout=60 * 60, interval=2)
                parking_seconds = time.perf_counter() - started
                # Retention's finalizer, one paced write per parked run, lags the parking: the
                # cold start and the idle window begin once it is done (else they measure it).
                await_finalized(env, namespace, count, timeout=60 * 60)
            finalized_seconds = time.perf_counter() - started
        finally:
            op.stop()
        # Cold start: a fresh operator, every run already waiting; ready when every expiry is armed.
        port = free_port()
        started = time.perf_counter()
        op = env.operator(
            namespace,
            "cold",
            DURABLE_AGENTS_METRICS_PORT=str(port),
            DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()),
        )
        try:
            with procstat.RssSampler(op.pid) as cold:
                eventually(
                    lambda: parked(port) >= count, 2 * Within.SETTLE, f"{count} wake-ups armed", interval=0.5
                )
            cold_seconds = time.perf_counter() - started
            _, cpu0 = proc_sample(op.pid)
            with procstat.RssSampler(op.pid) as idle:
                time.sleep(window)  # the idle window is what is measured
            cpu_percent = 100 * (proc_sample(op.pid)[1] - cpu0) / window
        finally:
            op.stop()
    return {
        "runs": count,
        "seconds_to_create": round(created, 1),
        "seconds_to_park_all": round(parking_seconds, 1),
        "seconds_to_finalize_all": round(finalized_seconds, 1),
        "parking_memory": parking.summary(),
        "cold_start_seconds": round(cold_seconds, 1),
        "cold_start_memory": cold.summary(),
        "idle_memory": idle.summary(),
        "idle_window_seconds": window,
        "idle_cpu_percent_of_one_core": round(cpu_percent, 1),
    }


def measure_busy(runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-resources-") as tmp:
        out = Path(tmp) / "peers.json"
        argv = ["--systems", "durable-agents,durable-agents-model", "--repeat", "1", "--unloaded-runs", "0"]
        status = peers.main(
            [*argv, "--runs", str(runs), "--out", str(out), "--plot", str(Path(tmp) / "p.png")]
        )
        record = json.loads(out.read_text())
    rows: dict[str, Any] = {}
    for name, system in record["systems"].items():
        [rep] = system["reps"]
        cpu = {k: v for k, v in rep["cpu_by_process"].items() if "durable_agents_controllers" in k}
        rows[name] = {
            "runs": rep["runs"],
            "ok": rep["ok"],
            "runs_per_second": rep["runs_per_second"],
            "operator_memory": rep.get("operator_memory"),
            "operator_cpu_seconds": cpu,
            "operator_cpu_cores_while_busy": round(sum(cpu.values()) / rep["machine"]["window_seconds"], 2),
        }
    return {"ok": status == 0, "rows": rows}


def verdict(parked_run: dict[str, Any], busy: dict[str, Any], resources: dict[str, Any]) -> dict[str, Any]:
    peaks = {
        "parking": parked_run["parking_memory"]["peak_mib"],
        "parked cold start": parked_run["cold_start_memory"]["peak_mib"],
        "parked idle": parked_run["idle_memory"]["peak_mib"],
        **{
            f"busy {row}": (v["operator_memory"] or {}).get("peak_mib", 0.0)
            for row, v in busy["rows"].items()
        },
    }
    limit = mebibytes(resources["limits"]["memory"])
    request = mebibytes(resources["requests"]["memory"])
    peak = max(peaks.values())
    return {
        "peaks_mib": peaks,
        "peak_mib": peak,
        "limit_mib": limit,
        "request_mib": request,
        "limit_headroom": round(limit / peak, 2) if peak else None,
        "request_covers_idle": request >= parked_run["idle_memory"]["peak_mib"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parked", type=int, default=10_000, help="runs parked for the cold start and idle")
    parser.add_argument("--window", type=float, default=60.0, help="idle window, seconds")
    parser.add_argument("--busy-runs", type=int, default=100, help="runs per peer row")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/resources.json")
    args = parser.parse_args(argv)
    resources = chart_resources()
    log(f"parked: {args.parked} runs, cold start then {args.window:.0f} s idle")
    parked_run = measure_parked(args.parked, args.window)
    log(f"parked: {json.dumps(parked_run)}")
    log(f"busy: the peer workload's durable-agents rows, {args.busy_runs} runs each")
    busy = measure_busy(args.busy_runs)
    log(f"busy: {json.dumps(busy)}")
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "load": os.getloadavg()},
        "operator_version": __version__,
        "chart_resources": resources,
        "parked": parked_run,
        "busy": busy,
        "verdict": verdict(parked_run, busy, resources),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"verdict: {json.dumps(result['verdict'])}")
    log(f"wrote {args.out}")
    return 0 if busy["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
