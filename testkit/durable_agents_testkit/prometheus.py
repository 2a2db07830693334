"""A real Prometheus server for tests (Debian's ``prometheus`` package: ``make prometheus``), and
what the chart's dashboard shows, read back from it.

:class:`PrometheusServer` runs ``/usr/bin/prometheus`` with a generated configuration in a
directory of its own (its TSDB there too), on a free loopback port, scraping the given targets
every second and evaluating the given rule files every second. :func:`dashboard_data` evaluates
every panel's PromQL of a Grafana dashboard over a time range (``query_range``), the data
``hack/dashboard_png.py`` draws.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.scrape import free_port

PROMETHEUS = "/usr/bin/prometheus"
MISSING = "`make prometheus` installs it (Debian's prometheus package); `make test` runs it first"
METRIC = re.compile(r"\bdurable_agents_[a-z0-9_]+")


def metric_names(expressions: list[str]) -> set[str]:
    """The operator's metric names an expression uses (histograms by their _bucket series etc.)."""
    return {name for expression in expressions for name in METRIC.findall(expression)}


def find_prometheus() -> str | None:
    return shutil.which("prometheus") or (PROMETHEUS if Path(PROMETHEUS).is_file() else None)


class PrometheusAPI:
    """Prometheus's HTTP API at ``url``."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def api(self, path: str, **params: str | float) -> Any:
        """One HTTP API call's ``data`` (an error answer raises, with Prometheus's message)."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
            answer = json.loads(resp.read())
        if answer.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {answer}")
        return answer["data"]

    def names(self) -> set[str]:
        """Every metric name Prometheus has a series of."""
        return set(self.api("label/__name__/values"))

    def query(self, promql: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=promql)["result"]
        return result

    def targets_up(self) -> bool:
        active = self.api("targets")["activeTargets"]
        return bool(active) and all(target["health"] == "up" for target in active)


class PrometheusServer(PrometheusAPI):
    def __init__(
        self,
        directory: Path,
        targets: list[str],
        rule_files: Sequence[Path] = (),
        scrape_interval: str = "1s",
    ) -> None:
        binary = find_prometheus()
        if binary is None:
            raise FileNotFoundError(f"prometheus is not installed: {MISSING}")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        super().__init__(f"http://127.0.0.1:{self.port}")
        self.log_path = directory / "prometheus.log"
        config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [{"job_name": "durable-agents", "static_configs": [{"targets": targets}]}],
        }
        self.config_path = directory / "prometheus.yml"
        directory.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrometheusServer:
        argv = [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        eventually(self._ready_or_dead, Within.TAKEOVER, f"Prometheus on {self.url} to be ready")
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited {self.proc.returncode}:\n{self.log_tail()}")
        return self

    def _ready_or_dead(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return True
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=Within.COMMIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=Within.MOMENT)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def dashboard_data(
    server: PrometheusAPI,
    dashboard: dict[str, Any],
    start: datetime,
    end: datetime,
    step: float = 1.0,
    rate_interval: str = "5s",
) -> dict[str, Any]:
    """Every panel of ``dashboard`` evaluated over [start, end]: title, unit and, per query, the
    series (legend, [[unix time, value], ...]). Grafana's ``$__rate_interval`` becomes ``rate_interval``."""
    panels = []
    for panel in dashboard.get("panels", []):
        series = []
        for target in panel.get("targets", []):
            promql = target["expr"].replace("$__rate_interval", rate_interval)
            data = server.api(
                "query_range", query=promql, start=start.timestamp(), end=end.timestamp(), step=step
            )
            for result in data["result"]:
                legend = legend_of(target.get("legendFormat") or promql, result["metric"])
                points = [[float(t), float(v)] for t, v in result["values"]]
                series.append({"legend": legend, "expr": promql, "points": points})
        unit = ((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit", "")
        panels.append({"title": panel.get("title", ""), "unit": unit, "series": series})
    return {
        "title": dashboard.get("title", ""),
        "start": start.isoformat(),
        "end": end.isoformat(),
        "panels": panels,
    }


def legend_of(template: str, labels: dict[str, str]) -> str:
    """Grafana's legend format: ``{{label}}`` replaced by the series' label value."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), template)
