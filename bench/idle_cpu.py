"""``make bench-idle-cpu``: the idle operator's CPU with many runs parked, and where it goes (issue 38,
item 2).

``--parked`` runs (default 10,000) are created and taken to their wait for input by one operator,
as in ``make bench-resources``. Then, for each label of ``--rounds`` (e.g. ``before,after``), a fresh
operator starts cold on the same parked runs (the webhook on, as the chart installs it), waits until
every expiry is armed, lets ``--settle`` seconds pass (its first passes of the periodic loops),
measures its CPU over ``--windows`` windows of ``--window`` seconds each (median and range: the
machine is shared), then records ``--flame`` seconds with py-spy (a flame graph per round, written
after the windows so the sampler's own cost is not measured).

The runs parked once serve every round, so "before" and "after" are measured in one session on the
same objects: a round whose label starts with ``old`` runs the operator of ``--old-tree`` (a tree
with the previous release's ``operator/`` and ``controllers/``, e.g. ``git archive HEAD~1 operator
controllers | tar -x -C DIR``), the others the working tree's; alternate them (``old1,new1,old2,
new2``) so the machine's noise falls on both. With ``--gated``, rounds after the first wait for a
file ``<out>.go-<label>`` to appear (to change the code, or the runs, between rounds).

    .venv/bin/python -m bench.idle_cpu --parked 5000 --rounds old1,new1,old2,new2 --old-tree DIR
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.core import REPO, await_finalized, await_states, create_runs, environment, log, parked, proc_sample
from bench.resources import ASK
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.governance import permissive_default
from durable_agents_testkit.scrape import free_port


def recorder(pid: int, out: Path, *, gil: bool = False) -> subprocess.Popen[bytes]:
    """py-spy recording the operator process into a flame graph until it is sent SIGINT (``gil``:
    only the thread holding the GIL, the CPU a Python process spends, not its waiting threads)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    command = [spy, "record", "--pid", str(pid), "--rate", "100", "--format", "flamegraph"]
    command += ["--gil"] if gil else []
    return subprocess.Popen(
        [*command, "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def stop_recorder(recording: subprocess.Popen[bytes]) -> None:
    recording.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
    recording.wait(timeout=120)


def flame(pid: int, seconds: float, out: Path) -> None:
    """py-spy's flame graph of the operator process over ``seconds`` (idle: the loops' own work)."""
    recording = recorder(pid, out)
    try:
        time.sleep(seconds)
    finally:
        stop_recorder(recording)


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def measure_round(
    env: Any, namespace: str, count: int, args: argparse.Namespace, label: str
) -> dict[str, Any]:
    port = free_port()
    tree: dict[str, str] = {}
    if label.startswith("old") and args.old_tree is not None:
        tree["PYTHONPATH"] = f"{args.old_tree / 'operator'}:{args.old_tree / 'controllers'}"
    started = time.perf_counter()
    op = env.operator(
        namespace,
        f"idle-{label}",
        DURABLE_AGENTS_METRICS_PORT=str(port),
        DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()),
        **tree,
    )
    cold_svg = args.out.parent / f"cold_start_{label}.svg"
    cold_recording = recorder(op.pid, cold_svg, gil=True) if args.flame_cold else None
    try:
        try:
            eventually(
                lambda: parked(port) >= count, 2 * Within.SETTLE, f"{count} wake-ups armed", interval=0.5
            )
            cold = time.perf_counter() - started
        finally:
            if cold_recording is not None:
                stop_recorder(cold_recording)
        time.sleep(args.settle)  # the first passes of the periodic loops are start-up, not idle
        windows: list[float] = []
        for _ in range(args.windows):
            _, cpu0 = proc_sample(op.pid)
            time.sleep(args.window)
            windows.append(round(100 * (proc_sample(op.pid)[1] - cpu0) / args.window, 1))
            log(f"{label}: {windows[-1]} % of one core")
        svg = args.out.parent / f"idle_cpu_{label}.svg"
        flame(op.pid, args.flame, svg)
    finally:
        op.stop()
    return {
        "code": str(args.old_tree) if tree else "working tree",
        "cold_start_seconds": round(cold, 1),
        "idle_cpu_percent_of_one_core": {
            "median": statistics.median(windows),
            "min": min(windows),
            "max": max(windows),
            "samples": windows,
        },
        "window_seconds": args.window,
        "flame_graph": shown(svg),
        **({"cold_start_flame_graph": shown(cold_svg)} if cold_recording is not None else {}),
        "load_after": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parked", type=int, default=10_000, help="runs parked in a wait for input")
    parser.add_argument("--rounds", default="now", help="comma-separated labels, one fresh operator each")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after cold start, not measured")
    parser.add_argument("--windows", type=int, default=6, help="CPU windows per round")
    parser.add_argument("--window", type=float, default=20.0, help="seconds per CPU window")
    parser.add_argument("--flame", type=float, default=30.0, help="seconds py-spy records per round")
    parser.add_argument(
        "--flame-cold", action="store_true", help="also a flame graph of each cold start (py-spy --gil)"
    )
    parser.add_argument("--old-tree", type=Path, help="the previous operator/ and controllers/: rounds old*")
    parser.add_argument(
        "--gated", action="store_true", help="rounds after the first wait for <out>.go-<label>"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/idle_cpu.json")
    args = parser.parse_args(argv)
    labels = [label for label in args.rounds.split(",") if label]
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "platform": platform.platform()},
        "parked": args.parked,
        "rounds": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with environment() as env:
        namespace = env.namespace()
        permissive_default(env.kube.api, namespace)
        create_runs(env, namespace, {f"w{i:05d}": ASK for i in range(args.parked)})
        log(f"created {args.parked} runs; parking")
        op = env.operator(namespace, "parking", DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
        started = time.perf_counter()
        try:
            await_states(env, namespace, "waiting_input", args.parked, timeout=60 * 60, interval=2)
            result["seconds_to_park_all"] = round(time.perf_counter() - started, 1)
            # Retention's finalizer (one paced write per parked run) lags the parking: idle is after it.
            await_finalized(env, namespace, args.parked, timeout=60 * 60)
            result["seconds_to_finalize_all"] = round(time.perf_counter() - started, 1)
        finally:
            op.stop()
        log(
            f"parked in {result['seconds_to_park_all']} s, finalized in {result['seconds_to_finalize_all']} s"
        )
        for index, label in enumerate(labels):
            gate = args.out.with_name(f"{args.out.name}.go-{label}")
            if index > 0 and args.gated:
                log(f"waiting for {gate}")
                while not gate.exists():
                    time.sleep(2)
            result["rounds"][label] = measure_round(env, namespace, args.parked, args, label)
            log(f"{label}: {json.dumps(result['rounds'][label])}")
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
