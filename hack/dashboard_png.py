"""The chart's Grafana dashboard drawn as one PNG, without Grafana: every panel's PromQL evaluated
against a Prometheus (query_range), or read from what e2e/test_prometheus.py saved.

    .venv/bin/python hack/dashboard_png.py --data /tmp/dashboard-data.json --out /tmp/dashboard.png
    .venv/bin/python hack/dashboard_png.py --prometheus http://127.0.0.1:9090 --minutes 30

matplotlib is in the optional ``bench`` extra (``pip install -e '.[bench]'``), not in the dev
dependencies: the e2e test only saves the data (``DASHBOARD_DATA=/tmp/dashboard-data.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "charts" / "durable-agents" / "files" / "dashboard.json"
COLUMNS = 3


def from_prometheus(url: str, dashboard: dict[str, Any], minutes: float, step: float) -> dict[str, Any]:
    from durable_agents_testkit.prometheus import PrometheusAPI, dashboard_data

    end = datetime.now(UTC)
    start = end - timedelta(minutes=minutes)
    # Grafana's $__rate_interval: at least four scrape intervals; a minute suits a 15-30 s scrape.
    rate = f"{max(5, int(step * 4))}s"
    return dashboard_data(PrometheusAPI(url), dashboard, start, end, step=step, rate_interval=rate)


def draw(data: dict[str, Any], out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        sys.exit("matplotlib is missing: it is in the bench extra (.venv/bin/pip install -e '.[bench]')")
    matplotlib.use("Agg")  # no display on the machines that make it
    import matplotlib.pyplot as plt

    panels = data["panels"]
    rows = max(1, math.ceil(len(panels) / COLUMNS))
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(6 * COLUMNS, 3.2 * rows), squeeze=False)
    t0 = min(
        (point[0] for panel in panels for series in panel["series"] for point in series["points"]),
        default=0.0,
    )
    for index, ax in enumerate(axes.flat):
        if index >= len(panels):
            ax.axis("off")
            continue
        panel = panels[index]
        ax.set_title(panel["title"], fontsize=10)
        drawn = 0
        for series in panel["series"]:
            points = [(t - t0, v) for t, v in series["points"] if not math.isnan(v)]
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker=".", label=series["legend"][:40])
            drawn += 1
        if drawn:
            ax.legend(fontsize=7, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_xlabel("seconds", fontsize=8)
        ax.set_ylabel(panel.get("unit") or "", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{data.get('title', '')}: {data.get('start', '')} to {data.get('end', '')}", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # room for the title
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    print(f"wrote {out} ({len(panels)} panels)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", type=Path, help="panels saved by e2e/test_prometheus.py (JSON)")
    source.add_argument("--prometheus", help="a Prometheus URL to evaluate the panels against")
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD, help="the Grafana dashboard JSON")
    parser.add_argument("--minutes", type=float, default=30.0, help="with --prometheus: the range drawn")
    parser.add_argument("--step", type=float, default=15.0, help="with --prometheus: seconds per point")
    parser.add_argument("--out", type=Path, default=Path("dashboard.png"))
    args = parser.parse_args(argv)
    if args.data is not None:
        data = json.loads(args.data.read_text())
    else:
        dashboard = json.loads(args.dashboard.read_text())
        data = from_prometheus(args.prometheus, dashboard, args.minutes, args.step)
    draw(data, args.out)


if __name__ == "__main__":
    main()
