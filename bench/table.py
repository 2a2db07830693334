"""The table of measured ratios of docs/proofs/benchmarks.md, from bench/results/core.json (and
peers.json if present).

.venv/bin/python -m bench.table
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _ok(held: bool) -> str:
    return "yes" if held else "**no**"


def core_rows(core: dict[str, Any]) -> list[str]:
    t, a, k, idle = core["transitions"], core["approval_to_resume"], core["takeover"], core["idle"]
    rate, raw = t["transitions_per_second"], t["raw_status_writes_per_second"]
    writes, status = t["api_writes_per_transition"], t["status_writes_per_transition"]
    takeover, lease = k["seconds"], k["lease_seconds"]
    base, loaded = idle["baseline_0_runs"], idle["n_runs"]
    n = idle["runs"]
    p50, p99 = a["p50_seconds"] * 1000, a["p99_seconds"] * 1000
    raw50, raw99 = a["raw_write_rtt_p50_seconds"] * 1000, a["raw_write_rtt_p99_seconds"] * 1000
    quiet = loaded["writes_per_minute"] == 0
    return [
        "| figure | measured (median, min-max) | same-run baseline | target | holds |",
        "|---|---|---|---|---|",
        f"| transitions/s, {t['runs']} runs in flight | {_spread(rate, '.1f')} "
        f"| raw status writes/s {_spread(raw, '.1f')}; ratio {t['ratio_median']:.2f} "
        f"| >= 0.6 of raw | {_ok(t['ratio_median'] >= 0.6)} |",
        f"| API writes per transition | {_spread(writes, '.2f')} (status {status['median']:.2f}) "
        f"| ideal 1 | <= 1.2 | {_ok(writes['median'] <= 1.2)} |",
        f"| approval to resume p50 / p99 | {p50:.0f} / {p99:.0f} ms "
        f"| raw status write {raw50:.0f} / {raw99:.0f} ms "
        f"| p50 < 100 ms | {_ok(p50 < 100)} |",
        f"| crash takeover | {_spread(takeover, '.2f')} s | lease {lease} s "
        f"| <= lease + 1 s | {_ok(takeover['median'] <= lease + 1)} |",
        f"| idle, {n} waiting runs | {loaded['rss_mib']:.0f} MiB RSS, CPU {loaded['cpu_percent']:.2f} %, "
        f"{loaded['requests_per_minute']:.0f} req/min, {loaded['writes_per_minute']:.0f} writes/min "
        f"| 0 runs: {base['rss_mib']:.0f} MiB, {base['requests_per_minute']:.0f} req/min "
        f"| < 250 MB, no periodic writes | {_ok(loaded['rss_mib'] * 1.048576 < 250 and quiet)} |",
        f"| cold start, {n} runs (all expiries armed) | {idle['cold_start_seconds']:.1f} s "
        f"| raw list: {idle['raw_list_seconds']:.1f} s | < 30 s | {_ok(idle['cold_start_seconds'] < 30)} |",
    ]


def _spread(values: dict[str, float], spec: str) -> str:
    return f"{values['median']:{spec}} ({values['min']:{spec}}-{values['max']:{spec}})"


def peer_rows(peers: dict[str, Any]) -> list[str]:
    rows = [
        "| system | runs/s, 20 in flight | approval p50 / p99 ms | durable commits/run | CPU s/run |",
        "|---|---|---|---|---|",
    ]
    for name, r in peers["systems"].items():
        rate = r["runs_per_second"]
        rows.append(
            f"| {name} | {rate['median']:.1f} ({rate['min']:.1f}-{rate['max']:.1f}) "
            f"| {r['approval_p50_ms']['median']:.0f} / {r['approval_p99_ms']['median']:.0f} "
            f"| {r['durable_commits_per_run']['median']:.1f} | {r['cpu_seconds_per_run']['median']:.3f} |"
        )
    return rows


def main() -> int:
    core = json.loads((RESULTS / "core.json").read_text())
    machine = core["machine"]
    print(
        f"Measured {core['date'][:10]} on {machine['cores']} cores / {machine['memory_gib']} GiB, "
        f"etcd fsync on, {core['repeat']} repetitions.\n"
    )
    print("\n".join(core_rows(core)))
    peers_path = RESULTS / "peers.json"
    if peers_path.exists():
        print()
        print("\n".join(peer_rows(json.loads(peers_path.read_text()))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
