"""How hard the chaos scenarios push (``DURABLE_AGENTS_CHAOS_SIZE``), where the report goes, the seed."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

SIZE_ENV = "DURABLE_AGENTS_CHAOS_SIZE"
OUT_ENV = "DURABLE_AGENTS_CHAOS_OUT"
TUNE_ENV = "DURABLE_AGENTS_CHAOS_TUNE"
SEED_ENV = "DURABLE_AGENTS_CHAOS_SEED"


@dataclass(frozen=True)
class Size:
    """How hard each scenario pushes. ``ci`` runs on every CI run; ``full`` is the acceptance run."""

    name: str
    crash_chains: int  # namespaces killed in parallel, each with its own batches
    crash_batch: int  # runs per batch: one kill hits all of them
    crash_sweep: int  # values of N per chain (before:N and after:N); the chains share 1..all writes
    crash_extra: int  # further kills of the same batch at random boundaries
    dispatch_rounds: int
    dispatch_runs: int
    zombie_cycles: int
    zombie_runs: int
    zombie_dispatcher_cycles: int
    duplicate_runs: int
    duplicate_threads: int
    delayed_runs: int  # per case (expired, policy changed, evidence changed)
    policy_runs: int  # per group
    policy_changes: int
    upgrade_runs: int
    upgrade_kills: int  # old-release operators killed mid-flight
    ambiguous_runs: int  # per fault
    ambiguous_kills: int
    restart_runs: int
    restarts: int  # API server and etcd restarts, alternating
    restore_rounds: int
    restore_runs: int  # per group
    bad_runs: int
    min_total_kills: int = 0  # acceptance: kill points across all scenarios


SIZES = {
    "ci": Size(
        name="ci",
        crash_chains=4,
        crash_batch=3,
        crash_sweep=1,
        crash_extra=1,
        dispatch_rounds=1,
        dispatch_runs=6,
        zombie_cycles=1,
        zombie_runs=6,
        zombie_dispatcher_cycles=2,
        duplicate_runs=4,
        duplicate_threads=4,
        delayed_runs=2,
        policy_runs=2,
        policy_changes=2,
        upgrade_runs=2,
        upgrade_kills=2,
        ambiguous_runs=2,
        ambiguous_kills=2,
        restart_runs=6,
        restarts=2,
        restore_rounds=1,
        restore_runs=2,
        bad_runs=2,
    ),
    "full": Size(
        name="full",
        # 8 chains x 14 points x 2 phases: N = 1..25 (at least every write of a 5-run batch, whose
        # runs write at their semantic boundaries only; the larger N repeat 25), before and after.
        crash_chains=8,
        crash_batch=5,
        crash_sweep=14,
        crash_extra=3,
        dispatch_rounds=8,
        dispatch_runs=8,
        zombie_cycles=10,
        zombie_runs=8,
        zombie_dispatcher_cycles=3,
        duplicate_runs=16,
        duplicate_threads=8,
        delayed_runs=6,
        policy_runs=6,
        policy_changes=5,
        upgrade_runs=6,
        upgrade_kills=10,
        ambiguous_runs=6,
        ambiguous_kills=12,
        restart_runs=36,
        restarts=12,
        restore_rounds=3,
        restore_runs=4,
        bad_runs=6,
        min_total_kills=500,
    ),
}


def chaos_size() -> Size:
    """The size named by DURABLE_AGENTS_CHAOS_SIZE, with DURABLE_AGENTS_CHAOS_TUNE overrides
    (``crash_chains=4,restarts=6``: for tuning on another machine, not for CI)."""
    name = os.environ.get(SIZE_ENV, "ci") or "ci"
    if name not in SIZES:
        raise ValueError(f"{SIZE_ENV} must be one of {sorted(SIZES)}, got {name!r}")
    size = SIZES[name]
    tune = os.environ.get(TUNE_ENV, "")
    overrides = dict(item.split("=", 1) for item in tune.split(",") if item.strip())
    unknown = set(overrides) - {f.name for f in fields(Size)} - {"name"}
    if unknown:
        raise ValueError(f"{TUNE_ENV}: unknown knobs {sorted(unknown)}")
    knobs: dict[str, Any] = {k.strip(): int(v) for k, v in overrides.items()}
    return replace(size, **knobs)


def output_path() -> Path:
    """Where the session's report is written as JSON (DURABLE_AGENTS_CHAOS_OUT, or the temp dir)."""
    env = os.environ.get(OUT_ENV)
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"durable-agents-chaos-{chaos_size().name}.json"


def chaos_seed() -> int:
    """The seed of this session's random choices: DURABLE_AGENTS_CHAOS_SEED to replay one."""
    return int(os.environ.get(SEED_ENV) or time.time_ns() % 1_000_000)
