"""A run's states over time, from ``status.history``, as the geometry of a picture (pure).

Each stretch between two committed transitions is a segment: the state the run was in, from when
to when, whether it was a wait, and what ended it (the next transition's event, detail and the
operator process that committed it). The last segment runs to now, unless the run has ended.
Widths are proportional to time, with a floor so that a short stretch stays visible and
clickable; the page draws them as an inline SVG, and lists the same segments as a table.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from durable_agents.api.v1alpha1.states import TERMINAL_STATES, WAITING_STATES, RunState

WIDTH: Final = 960.0
MIN_WIDTH: Final = 14.0
WAITS: Final = frozenset(s.value for s in WAITING_STATES) | {"quarantined"}
ENDS: Final = frozenset(s.value for s in TERMINAL_STATES)


@dataclass(frozen=True)
class Segment:
    state: str
    start: datetime
    end: datetime | None  # None: still in it
    ended_by: str  # the transition that ended it, for people ("" while it lasts)
    x: float = 0.0
    width: float = 0.0

    @property
    def waiting(self) -> bool:
        return self.state in WAITS

    @property
    def kind(self) -> str:
        """The picture's class: wait, ok, failed, ended, work."""
        if self.waiting:
            return "wait"
        if self.state == RunState.COMPLETED.value:
            return "ok"
        if self.state in (RunState.FAILED.value, RunState.EXPIRED.value):
            return "failed"
        return "ended" if self.state in ENDS else "work"

    def seconds(self, now: datetime) -> float:
        return max(0.0, ((self.end or now) - self.start).total_seconds())


def _at(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


def ended_by(entry: Mapping[str, Any]) -> str:
    """What a transition says about who or what ended the state before it."""
    words = [str(entry.get("event") or "?")]
    if entry.get("detail"):
        words.append(f"({entry['detail']})")
    if entry.get("holder"):
        words.append(f"committed by {entry['holder']}")
    return " ".join(words)


def segments(run: Mapping[str, Any], now: datetime) -> list[Segment]:
    """The run's segments, oldest first, laid out over :data:`WIDTH`."""
    status = run.get("status") or {}
    history = [h for h in status.get("history") or [] if isinstance(h, Mapping) and _at(h.get("at"))]
    created = _at((run.get("metadata") or {}).get("creationTimestamp"))
    points: list[tuple[datetime, str, Mapping[str, Any] | None]] = []
    if history:
        first = history[0]
        start = created if created is not None and created <= _at(first["at"]) else _at(first["at"])  # type: ignore[operator]
        points.append((start, str(first.get("from") or "pending"), None))  # type: ignore[arg-type]
    for entry in history:
        points.append((_at(entry["at"]), str(entry.get("to") or "?"), entry))  # type: ignore[arg-type]
    if not points:
        since = _at(status.get("stateSince")) or created or now
        points.append((since, str(status.get("state") or "pending"), None))
    raw: list[Segment] = []
    for (start, state, _), following in zip(points, [*points[1:], None], strict=True):
        if following is None:
            end = start if state in ENDS else None
            raw.append(Segment(state, start, end, ""))
        else:
            raw.append(Segment(state, start, following[0], ended_by(following[2] or {})))
    return layout(raw, now)


def layout(raw: Sequence[Segment], now: datetime) -> list[Segment]:
    """Proportional widths with a floor, scaled to fill :data:`WIDTH`."""
    total = sum(s.seconds(now) for s in raw) or 1.0
    free = WIDTH - MIN_WIDTH * len(raw)
    widths = [MIN_WIDTH + max(0.0, free) * s.seconds(now) / total for s in raw]
    scale = WIDTH / sum(widths) if sum(widths) > WIDTH else 1.0
    out, x = [], 0.0
    for segment, width in zip(raw, widths, strict=True):
        out.append(Segment(segment.state, segment.start, segment.end, segment.ended_by, x, width * scale))
        x += width * scale
    return out


def span(seconds: float) -> str:
    """A duration for people: 45s, 3m05s, 2h10m."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
