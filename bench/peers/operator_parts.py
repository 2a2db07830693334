"""The operator's py-spy flame graph (``make profile``) broken down by what its CPU was spent on.

py-spy writes an inferno flame graph (SVG): each frame a ``<rect>`` with ``fg:x`` and ``fg:w`` (its
first sample and its samples) at a depth given by its ``y``. The graph is turned back into stacks
(the samples of a frame that none of its children holds are that stack's), and each stack is
charged to one part: the part the deepest frame of it names (a request to the API server made
inside the engine is the request's, not the engine's). The webhook's process (a child of the
operator's, recorded with it) is one part of its own.

Why: issue 38's targets need the operator's CPU per run cut by a known fraction; this says which
parts that CPU is made of, and so what the most any one lever could save.
"""

from __future__ import annotations

import bisect
import html
import re
from collections import Counter

WEBHOOK = "webhook process (admission reviews)"
OTHER = "event loop, threads, other"

# (part, substrings of a frame): the deepest frame of a stack that names a part decides.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "HTTP to the API server (client, TLS)",
        (
            "Kube.request_json",
            "Kube._send_json",
            "RESTClientObject",
            "urllib3/",
            "Kube.get_as",
            "http/client.py",
            "ssl.py",
        ),
    ),
    ("HTTP to the model server", ("ModelClient.complete", "ModelTurns.answer")),
    ("watch streams (read, decode)", ("loop_watch", "reflector", "Reflector")),
    (
        "checkpoint load and verification",
        (
            "RunSnapshot.from_object",
            "load_checkpoint",
            "load_stored",
            "RunSnapshot.loaded",
            "RunSnapshot.memo",
        ),
    ),
    ("commit building (stamp, dump)", ("CommitBuilder.commit", "Commit.wire_status", "committed_read")),
    ("model request building", ("build_request", "ModelPlanner.request")),
    ("ledger dispatch (ActionRecords, the effect)", ("Dispatcher.",)),
    ("the engine's decisions (the rest of decide)", ("core/engine/decide.py",)),
    (
        "tracing, logging, metrics",
        ("run_traces", "logging/__init__", "prometheus_client", "opentelemetry", "CommitReporter"),
    ),
    ("the worker and its queue (the rest)", ("RunWorker", "WorkQueue")),
    ("kopf's reactor (its event loop, other resources' handlers)", ("kopf/",)),
)

_RECT = re.compile(
    r'<g><title>(.*?)</title><rect x="[\d.]+%" y="([\d.]+)" width="[\d.]+%" height="\d+"'
    r' fill="[^"]*" fg:x="(\d+)" fg:w="(\d+)"'
)
_TITLE = re.compile(r"(.*) \(([\d,]+) samples?, [\d.]+%\)$")


def stacks(svg: str) -> Counter[str]:
    """The graph's stacks (frames root first, ``;``-joined, line numbers dropped) and samples."""
    rows: dict[float, list[tuple[int, int, str]]] = {}
    for match in _RECT.finditer(svg):
        title = _TITLE.match(html.unescape(match.group(1)))
        if title is None:
            continue
        frame = re.sub(r":\d+\)$", ")", title.group(1))
        rows.setdefault(float(match.group(2)), []).append((int(match.group(3)), int(match.group(4)), frame))
    # inferno draws the root (the widest frame, ``all``) at the top, y growing with depth, or
    # inverted at the bottom: the levels are ordered from the root's row.
    ys = sorted(rows)
    root_y = max(rows, key=lambda y: max(width for _, width, _ in rows[y])) if rows else 0.0
    ordered = ys if root_y == ys[0] else ys[::-1]
    levels = [sorted(rows[y]) for y in ordered]
    starts = [[x for x, _, _ in level] for level in levels]
    out: Counter[str] = Counter()
    for depth, level in enumerate(levels):
        below = levels[depth + 1] if depth + 1 < len(levels) else []
        below_starts = starts[depth + 1] if depth + 1 < len(levels) else []
        for x, width, frame in level:
            lo = bisect.bisect_left(below_starts, x)
            hi = bisect.bisect_left(below_starts, x + width)
            own = width - sum(w for _, w, _ in below[lo:hi])
            if own <= 0:
                continue
            chain = [frame]
            for up in range(depth - 1, -1, -1):
                i = bisect.bisect_right(starts[up], x) - 1
                if i >= 0:
                    chain.append(levels[up][i][2])
            out[";".join(reversed(chain))] += own
    return out


def part_of(stack: str) -> str:
    """The part a stack is charged to: the webhook's process, else the part its deepest frame names."""
    if "webhook_process" in stack:
        return WEBHOOK
    for frame in reversed(stack.split(";")):
        for part, needles in PARTS:
            if any(needle in frame for needle in needles):
                return part
    return OTHER


def breakdown(svg: str) -> dict[str, float]:
    """Each part's share of the graph's samples (parts in table order, shares summing to 1)."""
    charged: Counter[str] = Counter()
    for stack, samples in stacks(svg).items():
        charged[part_of(stack)] += samples
    total = sum(charged.values())
    order = [WEBHOOK, *(part for part, _ in PARTS), OTHER]
    return {part: charged[part] / total for part in order if charged[part]} if total else {}
