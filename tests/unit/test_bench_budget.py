"""Issue 38's budget arithmetic (bench/peers/budget.py) and the operator's flame graph broken down
by part (bench/peers/operator_parts.py), on small inputs whose answers are worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest
from bench.peers.budget import budgets, records, table
from bench.peers.operator_parts import OTHER, WEBHOOK, breakdown, part_of, stacks


def _system(runs: float, by_process: dict[str, float], busy: list[float]) -> dict[str, Any]:
    return {
        "summary": {
            "runs_per_second": {"median": runs},
            "cpu_seconds_per_run_by_process": by_process,
        },
        "reps": [{"machine": {"busy_fraction": b}} for b in busy],
    }


PEERS = {
    "machine": {"cores": 2},
    "systems": {
        "dbos-postgres": _system(20.0, {"driver": 0.06}, [0.7]),
        "durable-agents-boundaries": _system(
            14.0,
            {
                "kube-apiserver": 0.06,
                "etcd": 0.012,
                "driver": 0.008,
                "python -m durable_agents_controllers": 0.03,
                "python -m durable_agents_controllers.webhook_process": 0.01,
            },
            [0.9, 0.8, 1.0],
        ),
        "durable-agents-model": _system(
            8.0,
            {
                "kube-apiserver": 0.1,
                "python -m durable_agents_controllers": 0.08,
                "reference model server": 0.5,  # a remote model's stand-in: not the run's
            },
            [0.9],
        ),
    },
}


def test_the_budget_is_what_the_cores_give_at_the_target_rate_less_the_kubernetes_side() -> None:
    boundaries, model = budgets(PEERS)
    assert boundaries.busy == 0.9  # the median of the repetitions
    assert boundaries.target_runs_per_second == 20.0
    assert boundaries.per_run(0.9) == pytest.approx(2 * 0.9 / 20.0)  # 0.09 CPU s a run
    assert boundaries.kubernetes == pytest.approx(0.08)
    assert boundaries.operator == pytest.approx(0.04)
    assert boundaries.operator_budget(0.9) == pytest.approx(0.01)
    assert boundaries.operator_cut(0.9) == pytest.approx(0.75)
    assert boundaries.without_operator(1.0) == pytest.approx(2 / 0.08 / 20.0)  # 1.25x the peer
    # The model row's target is half the peer; the model server's CPU is counted nowhere.
    assert model.target_runs_per_second == 10.0
    assert model.kubernetes == pytest.approx(0.1)
    assert model.operator_budget(0.9) == pytest.approx(0.18 - 0.1)
    assert model.operator_cut(0.9) == pytest.approx(0.0)


def test_the_table_has_a_row_per_durable_agents_row_with_its_figures() -> None:
    lines = table(budgets(PEERS))
    assert len(lines) == 4
    assert lines[2].startswith("| durable-agents-boundaries | 14.0 (20.0) | 0.0900 (90% busy) / 0.1000 |")
    assert "| 75% / 50% |" in lines[2]


def test_peers_json_keeps_the_budgets_and_none_without_the_peer() -> None:
    kept = records(budgets(PEERS))
    assert [r["row"] for r in kept] == ["durable-agents-boundaries", "durable-agents-model"]
    assert kept[0]["operator_cut_needed"] == {"as_measured": 0.75, "all_cores": 0.5}
    unmeasured = {**PEERS, "systems": {**PEERS["systems"], "dbos-postgres": {"reps": []}}}
    assert budgets(unmeasured) == []


SVG = (
    '<svg><g><title>all (10 samples, 100%)</title><rect x="0%" y="20" width="100%" height="15"'
    ' fill="rgb(1,2,3)" fg:x="0" fg:w="10"/></g>'
    '<g><title>main (app.py:1) (10 samples, 100%)</title><rect x="0%" y="36" width="100%" height="15"'
    ' fill="rgb(1,2,3)" fg:x="0" fg:w="10"/></g>'
    "<g><title>RunWorker.process (durable_agents/shell/runs/worker.py:9) (6 samples, 60%)</title>"
    '<rect x="0%" y="52" width="60%" height="15" fill="rgb(1,2,3)" fg:x="0" fg:w="6"/></g>'
    "<g><title>Kube.request_json (durable_agents/shell/ground/kube.py:5) (4 samples, 40%)</title>"
    '<rect x="0%" y="68" width="40%" height="15" fill="rgb(1,2,3)" fg:x="0" fg:w="4"/></g>'
    "<g><title>webhook_process (x.py:1) (3 samples, 30%)</title>"
    '<rect x="60%" y="52" width="30%" height="15" fill="rgb(1,2,3)" fg:x="6" fg:w="3"/></g>'
    "</svg>"
)


def test_a_flame_graph_is_turned_back_into_stacks_with_their_own_samples() -> None:
    assert stacks(SVG) == {
        "all;main (app.py)": 1,  # the sample no child holds
        "all;main (app.py);RunWorker.process (durable_agents/shell/runs/worker.py)": 2,
        "all;main (app.py);RunWorker.process (durable_agents/shell/runs/worker.py);"
        "Kube.request_json (durable_agents/shell/ground/kube.py)": 4,
        "all;main (app.py);webhook_process (x.py)": 3,
    }


def test_each_stack_is_charged_to_the_part_its_deepest_frame_names() -> None:
    # A request made inside the engine is the request's.
    assert part_of("run (kopf/x.py);RunWorker.process (w.py);Kube.request_json (k.py)") == (
        "HTTP to the API server (client, TLS)"
    )
    assert part_of("run (kopf/x.py);RunWorker.process (w.py)") == "the worker and its queue (the rest)"
    assert part_of("main (m.py);webhook_process (w.py);Kube.request_json (k.py)") == WEBHOOK
    assert part_of("main (m.py)") == OTHER
    shares = breakdown(SVG)
    assert shares == {
        WEBHOOK: 0.3,
        "HTTP to the API server (client, TLS)": 0.4,
        "the worker and its queue (the rest)": 0.2,
        OTHER: 0.1,
    }
