"""The chaos session's report: one :class:`ScenarioResult` per scenario, printed as a table and
written as JSON (with the full size's acceptance verdict)."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from durable_agents_testkit.chaos.sizes import Size


@dataclass
class ScenarioResult:
    scenario: str
    runs: int = 0
    kills: int = 0
    faults: int = 0  # injected faults that are not process deaths: freezes, bad answers, duplicates
    duplicates: list[str] = field(default_factory=list)  # idempotency keys applied more than once
    business_duplicates: list[str] = field(default_factory=list)  # one run's payment made twice
    stuck: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    passed: bool = False

    @property
    def duplicated_effects(self) -> int:
        """Effects applied more than once: every payment carries an invoice, and a duplicate key is
        a duplicate invoice too, unless the same invoice went out under two keys."""
        return max(len(self.duplicates), len(self.business_duplicates))


class ChaosReport:
    """Results of every scenario of this session: printed as a table, written as JSON."""

    def __init__(self, size: Size, seed: int) -> None:
        self.size = size
        self.seed = seed
        self.results: list[ScenarioResult] = []
        self.started = datetime.now(UTC)

    def add(self, result: ScenarioResult) -> None:
        self.results.append(result)

    @property
    def total_kills(self) -> int:
        return sum(r.kills for r in self.results)

    def acceptance(self) -> dict[str, Any]:
        """The full size's acceptance: enough kill points, no duplicate, no stuck run, nothing failed."""
        duplicates = sum(r.duplicated_effects for r in self.results)
        stuck = sum(len(r.stuck) for r in self.results)
        failed = [r.scenario for r in self.results if not r.passed]
        return {
            "killsRequired": self.size.min_total_kills,
            "kills": self.total_kills,
            "duplicates": duplicates,
            "stuck": stuck,
            "failed": failed,
            "met": self.total_kills >= self.size.min_total_kills and not (duplicates or stuck or failed),
        }

    def verdict(self) -> str:
        return "FAILED" if any(not r.passed for r in self.results) else "ok"

    def table(self) -> str:
        header = ("scenario", "runs", "kills", "faults", "duplicates", "stuck runs", "wall time", "result")
        rows = [
            (
                r.scenario,
                str(r.runs),
                str(r.kills),
                str(r.faults),
                str(r.duplicated_effects),
                str(len(r.stuck)),
                f"{r.wall_seconds:.1f}s",
                "ok" if r.passed else "FAILED",
            )
            for r in self.results
        ]
        total = (
            "total",
            str(sum(r.runs for r in self.results)),
            str(self.total_kills),
            str(sum(r.faults for r in self.results)),
            str(sum(r.duplicated_effects for r in self.results)),
            str(sum(len(r.stuck) for r in self.results)),
            f"{sum(r.wall_seconds for r in self.results):.1f}s",
            self.verdict(),
        )
        widths = [max(len(row[i]) for row in (header, *rows, total)) for i in range(len(header))]

        def line(row: tuple[str, ...]) -> str:
            cells = enumerate(zip(row, widths, strict=True))
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in cells)

        rule = "  ".join("-" * w for w in widths)
        return "\n".join([line(header), rule, *(line(r) for r in rows), rule, line(total)])

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size.name,
            "seed": self.seed,
            "knobs": asdict(self.size),
            "startedAt": self.started.isoformat(),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "totals": {
                "runs": sum(r.runs for r in self.results),
                "kills": self.total_kills,
                "duplicates": sum(r.duplicated_effects for r in self.results),
                "stuck": sum(len(r.stuck) for r in self.results),
                "wallSeconds": round(sum(r.wall_seconds for r in self.results), 1),
                "minKillsRequired": self.size.min_total_kills,
            },
            "acceptance": self.acceptance(),
            "scenarios": [asdict(r) | {"wall_seconds": round(r.wall_seconds, 1)} for r in self.results],
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


class DuplicateEffects(AssertionError):
    """The authoritative system applied an effect more than once: global assertion (2) failed."""
