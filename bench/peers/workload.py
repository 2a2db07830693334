"""The peer workload, shared by every system, and the record of one measured repetition.

A run has 10 steps. Steps 1-4, 5 (after its wait), 6, 7, 9 and 10 are a small deterministic
computation (:func:`compute`): replayable from the run's inputs, so a durable design needs no
commit for it unless it is a semantic boundary. Step 5 first waits durably for an approval
delivered from outside the run. Step 8 POSTs to the counting server (the project's reference
system) with an idempotency key; the server counts applications per key and never deduplicates.

Every system folds the step results into one digest; :func:`expected_digest` recomputes it, so a
run whose steps were skipped, repeated with other inputs or reordered does not verify.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

STEPS = 10
APPROVAL_STEP = 5
POST_STEP = 8
COMPUTE_STEPS = tuple(i for i in range(1, STEPS + 1) if i != POST_STEP)
APPROVAL_TOPIC = "approval"
APPROVAL_DECISION = "approve"
IN_FLIGHT = 20
# SHA-256 rounds per compute step: tens of microseconds, "a small deterministic computation".
ROUNDS = 64
RESULT_MARK = "@@PEERS-RESULT "


def compute(prev: str, run_id: str, step: int, extra: str = "") -> str:
    """The small deterministic computation of one step."""
    h = f"{run_id}|{step}|{prev}|{extra}".encode()
    for _ in range(ROUNDS):
        h = hashlib.sha256(h).digest()
    return h.hex()


def receipt_for(key: str) -> str:
    """The counting server's receipt for a key (see durable_agents_testkit.refsystem.receipt_for)."""
    return "rcpt-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def expected_digest(run_id: str, key: str) -> str:
    state = ""
    for step in range(1, STEPS + 1):
        if step == APPROVAL_STEP:
            state = compute(state, run_id, step, APPROVAL_DECISION)
        elif step == POST_STEP:
            state = compute(state, run_id, step, receipt_for(key))
        else:
            state = compute(state, run_id, step)
    return state


def post_effect(url: str, key: str, body: dict[str, Any], timeout: float = 30.0) -> str:
    """Step 8 for the synchronous peers: POST with the idempotency key, return the receipt."""
    request = urllib.request.Request(
        f"{url}/effects",
        data=json.dumps(body).encode(),
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: dict[str, Any] = json.load(response)
    return str(answer["receipt"])


@dataclass
class RunTiming:
    """One run as the driver saw it; times are ``time.time()`` seconds of this machine."""

    run_id: str
    key: str = ""
    started: float = 0.0
    paused: float = 0.0  # the run was observed parked in its approval wait
    delivered: float = 0.0  # the approval was accepted (a durable write returned, or handed over)
    resumed: float = 0.0  # the run was observed past its wait (code after the wait, or its commit)
    finished: float = 0.0
    ok: bool = False
    error: str = ""

    @property
    def approval_latency(self) -> float:
        return self.resumed - self.delivered


@dataclass
class RepResult:
    """What a worker reports for one repetition."""

    system: str
    rep: int
    runs: int
    in_flight: int
    wall_seconds: float
    runs_per_s: float | None  # steady state: 20 in flight throughout (see steady_throughput)
    steady_window_runs: int
    completed: int
    failures: list[str]
    keys: list[str]
    approval_latencies_ms: list[float]
    commits: float | None  # durable commits counted in the repetition's window (all runs)
    commits_detail: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_timings(
        cls,
        system: str,
        rep: int,
        timings: list[RunTiming],
        in_flight: int,
        commits: float | None,
        commits_detail: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> RepResult:
        ok = [t for t in timings if t.ok]
        start = min((t.started for t in timings), default=0.0)
        end = max((t.finished for t in timings), default=0.0)
        rate, window = steady_throughput([t.finished for t in ok], in_flight)
        return cls(
            system=system,
            rep=rep,
            runs=len(timings),
            in_flight=in_flight,
            wall_seconds=end - start,
            runs_per_s=rate,
            steady_window_runs=window,
            completed=len(ok),
            failures=[f"{t.run_id}: {t.error}" for t in timings if not t.ok][:20],
            keys=[t.key for t in ok],
            approval_latencies_ms=[round(t.approval_latency * 1000, 3) for t in ok],
            commits=commits,
            commits_detail=commits_detail or {},
            extra=extra or {},
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def steady_throughput(finished: list[float], in_flight: int) -> tuple[float | None, int]:
    """Completions per second while ``in_flight`` runs were in flight throughout.

    A closed loop of ``in_flight`` slots ramps up until the first ``in_flight`` runs finish and
    drains during the last ``in_flight``; between the ``in_flight``-th completion and the
    ``in_flight``-th from last, every completion was replaced by a start. Returns the rate over
    that window and the number of completions in it (None if the repetition is too short).
    """
    ends = sorted(finished)
    first, last = in_flight - 1, len(ends) - in_flight - 1
    if last - first < max(5, in_flight // 2) or ends[last] <= ends[first]:
        return None, 0
    return (last - first) / (ends[last] - ends[first]), last - first


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary(values: list[float]) -> dict[str, float | None]:
    """Median and spread of repeated measurements."""
    if not values:
        return {"median": None, "min": None, "max": None, "spread_pct": None, "n": 0}
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    return {
        "median": round(med, 4),
        "min": round(lo, 4),
        "max": round(hi, 4),
        # (max - min) / median: the relative range across repetitions.
        "spread_pct": round((hi - lo) / med * 100, 1) if med else None,
        "n": len(values),
    }
