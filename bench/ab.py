"""``python -m bench.ab --base REV``: the working tree against another revision, on one control plane.

For a change made to move a benchmark figure: both operators run the same workload on the same
local control plane (etcd fsync on), interleaved (base, change, base, change, ...), so the noise
of a shared machine falls on both alike. Figures: transitions per second (20 runs of 8 steps) and
the cold start of a fresh process over N runs already waiting (all wake-ups armed), beside a raw
list of the same runs. The base revision is extracted with ``git archive`` and imported through
``PYTHONPATH`` (durable_agents_testkit.releases), exactly as the upgrade tests run a previous release.

    .venv/bin/python -m bench.ab --base HEAD~1 --repeat 3 --cold-runs 3000
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.core import (
    REPO,
    Env,
    await_states,
    bench_transitions,
    create_runs,
    environment,
    list_runs,
    parked,
)
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.releases import materialize_release
from durable_agents_testkit.scrape import free_port

ASK = {
    "taskType": "bench",
    "objective": "wait for a human",
    "steps": [{"name": "confirm", "ask": {"question": "go on?", "expiresIn": "72h"}}],
}


def cold_start(env: Env, namespace: str, runs: int, name: str) -> float:
    port = free_port()
    started = time.perf_counter()
    op = env.operator(namespace, name, DURABLE_AGENTS_METRICS_PORT=str(port))
    try:
        eventually(
            lambda: parked(port) >= runs, 3 * Within.SETTLE, f"{runs} wake-ups armed by {name}", interval=0.1
        )
        return time.perf_counter() - started
    finally:
        op.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git revision to compare the working tree with")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--cold-runs", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/ab.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"base": args.base, "change": "working tree", "samples": {}}
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp, environment() as env:
        base = replace(env, operator_env=materialize_release(REPO, args.base, Path(tmp)).env())
        sides = {"base": base, "change": env}
        samples: dict[str, dict[str, list[float]]] = {k: {"transitions_per_second": []} for k in sides}
        for i in range(args.repeat):
            for side, e in sides.items():
                rate = bench_transitions(e, args.runs)["transitions_per_second"]
                samples[side]["transitions_per_second"].append(rate)
                print(f"[{i}] {side}: {rate:.1f} transitions/s", flush=True)
        if args.cold_runs:
            namespace = env.namespace()
            create_runs(env, namespace, {f"w{i:05d}": ASK for i in range(args.cold_runs)})
            # Parked once by the change's operator; each cold start below finds them all waiting.
            op = env.operator(namespace, "parker")
            try:
                await_states(env, namespace, "waiting_input", args.cold_runs, timeout=3600, interval=2)
            finally:
                op.stop()
            for side in sides:
                samples[side]["cold_start_seconds"] = []
            raw: list[float] = []
            for i in range(args.repeat):
                for side, e in sides.items():
                    seconds = cold_start(e, namespace, args.cold_runs, f"cold-{side}-{i}")
                    samples[side]["cold_start_seconds"].append(seconds)
                    print(f"[{i}] {side}: cold start {seconds:.1f}s over {args.cold_runs} runs", flush=True)
                listed = time.perf_counter()
                assert len(list_runs(env, namespace)) == args.cold_runs
                raw.append(time.perf_counter() - listed)
            results["raw_list_seconds"] = raw
        results["samples"] = samples
        results["medians"] = {
            side: {figure: statistics.median(values) for figure, values in figures.items()}
            for side, figures in samples.items()
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["medians"], indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
