"""What issue 38's throughput targets leave the operator, from one `make bench-peers` run.

A durable-agents row is CPU-bound on this machine (its repetitions keep the cores busy) while DBOS
is not. So a row reaches ``target x DBOS's runs/s`` only if its CPU per run fits in what the
cores give at that rate. The Kubernetes side of a run (kube-apiserver, etcd, the kube-controller
and the driver that creates and approves the runs) is fixed by the requests a run makes; what is
left of the budget is the operator's (its process and its webhook's). This prints, per row:

- the budget per run at the target, at the busy fraction the row's repetitions reached, and at
  every core busy (the most generous bound);
- the Kubernetes side's CPU per run, and the operator's;
- the cut of the operator's CPU the target needs, and the most the row could reach with an
  operator that cost nothing.

Run: ``python -m bench.peers.budget [bench/results/peers.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PEER = "dbos-postgres"
TARGETS = {"durable-agents-boundaries": 1.0, "durable-agents-model": 0.5}
OPERATOR = ("python -m durable_agents_controllers", "python -m durable_agents_controllers.webhook_process")
NOT_COUNTED = ("reference model server",)  # stands in for a remote model: never in a run's CPU


@dataclass(frozen=True)
class Budget:
    row: str
    target: float  # x the peer's runs/s
    peer_runs_per_second: float
    runs_per_second: float
    cores: int
    busy: float  # the row's repetitions: the cores' busy fraction (median)
    kubernetes: float  # CPU s per run: kube-apiserver, etcd, kube-controller, the driver
    operator: float  # CPU s per run: the operator's process and its webhook's

    @property
    def target_runs_per_second(self) -> float:
        return self.target * self.peer_runs_per_second

    def per_run(self, busy: float) -> float:
        """CPU s a run may cost for the target to hold with the cores ``busy`` (0..1)."""
        return self.cores * busy / self.target_runs_per_second

    def operator_budget(self, busy: float) -> float:
        return self.per_run(busy) - self.kubernetes

    def operator_cut(self, busy: float) -> float:
        """The fraction of today's operator CPU per run the target needs removed (>1: impossible)."""
        return 1.0 - self.operator_budget(busy) / self.operator

    def without_operator(self, busy: float) -> float:
        """Runs/s with an operator that cost nothing, as a multiple of the peer's."""
        return self.cores * busy / self.kubernetes / self.peer_runs_per_second


def budgets(peers: dict[str, Any]) -> list[Budget]:
    """A budget per durable-agents row with a target, when the peer was measured too."""
    systems = {name: data for name, data in peers["systems"].items() if data.get("reps")}
    if PEER not in systems:
        return []
    cores = int(peers["machine"]["cores"])
    peer = float(systems[PEER]["summary"]["runs_per_second"]["median"])
    out = []
    for row, target in TARGETS.items():
        if row not in systems:
            continue
        summary = systems[row]["summary"]
        by_process: dict[str, float] = summary["cpu_seconds_per_run_by_process"]
        operator = sum(by_process.get(name, 0.0) for name in OPERATOR)
        kubernetes = sum(
            cpu for name, cpu in by_process.items() if name not in OPERATOR and name not in NOT_COUNTED
        )
        busy = statistics.median(rep["machine"]["busy_fraction"] for rep in systems[row]["reps"])
        out.append(
            Budget(
                row=row,
                target=target,
                peer_runs_per_second=peer,
                runs_per_second=float(summary["runs_per_second"]["median"]),
                cores=cores,
                busy=busy,
                kubernetes=kubernetes,
                operator=operator,
            )
        )
    return out


def records(rows: list[Budget]) -> list[dict[str, Any]]:
    """The budgets as peers.json keeps them (``budget``): each bound at the row's busy fraction
    (``as_measured``) and with every core busy (``all_cores``)."""

    def both(b: Budget, of: Callable[[float], float], digits: int) -> dict[str, float]:
        return {"as_measured": round(of(b.busy), digits), "all_cores": round(of(1.0), digits)}

    return [
        {
            "row": b.row,
            "target_x_peer": b.target,
            "target_runs_per_second": round(b.target_runs_per_second, 2),
            "busy_fraction": round(b.busy, 3),
            "cpu_seconds_per_run_allowed": both(b, b.per_run, 4),
            "kubernetes_cpu_seconds_per_run": round(b.kubernetes, 4),
            "operator_cpu_seconds_per_run": round(b.operator, 4),
            "operator_cut_needed": both(b, b.operator_cut, 3),
            "x_peer_with_an_operator_costing_nothing": both(b, b.without_operator, 3),
        }
        for b in rows
    ]


def table(rows: list[Budget]) -> list[str]:
    lines = [
        "| row | runs/s (target) | CPU s a run may cost at the target (busy as measured / all cores) "
        "| Kubernetes side a run | operator a run "
        "| operator's cut the target needs (as measured / all cores) "
        "| with an operator costing nothing |",
        "|---|---|---|---|---|---|---|",
    ]
    for b in rows:
        lines.append(
            f"| {b.row} | {b.runs_per_second:.1f} ({b.target_runs_per_second:.1f}) "
            f"| {b.per_run(b.busy):.4f} ({b.busy:.0%} busy) / {b.per_run(1.0):.4f} "
            f"| {b.kubernetes:.4f} | {b.operator:.4f} "
            f"| {b.operator_cut(b.busy):.0%} / {b.operator_cut(1.0):.0%} "
            f"| {b.without_operator(b.busy):.2f}x / {b.without_operator(1.0):.2f}x {PEER} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peers", type=Path, nargs="?", default=Path("bench/results/peers.json"))
    args = parser.parse_args(argv)
    peers = json.loads(args.peers.read_text())
    print("\n".join(table(budgets(peers))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
