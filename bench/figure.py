"""The figure of docs/proofs/benchmarks.md: each benchmark beside its same-run baseline, from
bench/results/*.json.

.venv/bin/python -m bench.figure            # writes bench/results/figure.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on the machines that make it
import matplotlib.pyplot as plt

RESULTS = Path(__file__).resolve().parent / "results"


def _panel(
    ax: Any, title: str, labels: list[str], values: list[float], unit: str, target: float | None
) -> None:
    colors = ["#1f77b4", "#bbbbbb", "#ff7f0e", "#2ca02c", "#9467bd"][: len(values)]
    bars = ax.bar(labels, values, color=colors)
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(
            f"{value:.3g}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom"
        )
    if target is not None:
        ax.axhline(target, color="red", linestyle="--", linewidth=1, label=f"target {target:.3g}")
        ax.legend(loc="upper right", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(unit, fontsize=8)
    ax.tick_params(labelsize=7)
    if len(labels) > 3:
        ax.tick_params(axis="x", labelrotation=25)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    ax.set_ylim(0, max([*values, target or 0]) * 1.25 or 1)


def render(core: dict[str, Any], peers: dict[str, Any] | None, out: Path) -> None:
    t, a, k, idle = core["transitions"], core["approval_to_resume"], core["takeover"], core["idle"]
    panels = 7 if peers else 6
    fig, axes = plt.subplots(2, 4 if peers else 3, figsize=(13 if peers else 11, 6.5))
    flat = list(axes.flat)
    raw = t["raw_status_writes_per_second"]["median"]
    _panel(
        flat[0],
        "transitions/s vs raw status writes/s",
        ["operator", "raw writes"],
        [t["transitions_per_second"]["median"], raw],
        "per second",
        0.6 * raw,
    )
    _panel(
        flat[1],
        "API writes per transition",
        ["all writes", "status", "ideal"],
        [t["api_writes_per_transition"]["median"], t["status_writes_per_transition"]["median"], 1.0],
        "writes",
        1.2,
    )
    _panel(
        flat[2],
        "approval to resume (ms)",
        ["p50", "p99", "raw write p50"],
        [a["p50_seconds"] * 1000, a["p99_seconds"] * 1000, a["raw_write_rtt_p50_seconds"] * 1000],
        "ms",
        100,
    )
    _panel(
        flat[3],
        "crash takeover (s)",
        ["takeover", "lease"],
        [k["seconds"]["median"], float(k["lease_seconds"])],
        "seconds",
        k["lease_seconds"] + 1,
    )
    _panel(
        flat[4],
        f"idle operator memory, {idle['runs']} waiting runs",
        ["0 runs", f"{idle['runs']} runs"],
        [idle["baseline_0_runs"]["rss_mib"], idle["n_runs"]["rss_mib"]],
        "MiB RSS",
        250,
    )
    _panel(
        flat[5],
        f"cold start with {idle['runs']} runs (s)",
        ["operator ready", "raw list"],
        [idle["cold_start_seconds"], idle["raw_list_seconds"]],
        "seconds",
        30,
    )
    if peers:
        systems = peers.get("systems", {})
        names = list(systems)
        _panel(
            flat[6],
            "peer workload: runs/s, 20 in flight",
            names,
            [float(systems[n]["runs_per_second"]["median"]) for n in names],
            "runs/s",
            None,
        )
    for ax in flat[panels:]:
        ax.axis("off")
    machine = core["machine"]
    fig.suptitle(
        f"durable-agents {core['operator_version']} on {machine['cores']} cores / "
        f"{machine['memory_gib']} GiB, "
        f"etcd fsync on, {core['date'][:10]} (medians of {core['repeat']}; red: target)",
        fontsize=10,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", type=Path, default=RESULTS / "core.json")
    parser.add_argument("--peers", type=Path, default=RESULTS / "peers.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "figure.png")
    args = parser.parse_args(argv)
    core = json.loads(args.core.read_text())
    peers = json.loads(args.peers.read_text()) if args.peers.exists() else None
    render(core, peers, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
