"""A real Prometheus (Debian's package) scraping a live operator: after a run with an approval and
an effect, every metric the chart's alert rules and dashboard use exists as a series, the seed's
metrics moved (a wait and an approval observed, the region owned), and the chart's rules, loaded
into that Prometheus, evaluate without error against the operator's series.

The dashboard's panels, evaluated over the test (query_range), are saved as JSON
(``DASHBOARD_DATA``, else in the test's directory): ``hack/dashboard_png.py --data``
draws them as one PNG.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e import test_approvals
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import ensure_binaries
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.prometheus import (
    MISSING,
    PrometheusServer,
    dashboard_data,
    find_prometheus,
    metric_names,
)
from durable_agents_testkit.rbac import grant, rule
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "durable-agents"
LEASE = 2
PAYMENTS = 3
PARKED = {
    "taskType": "parked",
    "objective": "ask a question nobody answers",
    "steps": [
        {"name": "confirm", "ask": {"question": "anyone there?", "expiresIn": "1h"}},
        {"name": "done", "complete": {"result": "answered"}},
    ],
}


def chart_rules(tmp_path: Path) -> tuple[Path, list[str]]:
    """The chart's PrometheusRule rule groups as helm renders them (default thresholds), as a
    Prometheus rule file; and their expressions."""
    helm = ensure_binaries(controller_manager=False) / "helm"
    argv = [str(helm), "template", "e2e", str(CHART), "--show-only", "templates/prometheusrule.yaml"]
    out = subprocess.run(
        [*argv, "--set", "monitoring.prometheusRule.enabled=true"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    [doc] = [d for d in yaml.safe_load_all(out) if d]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(doc["spec"]))
    return path, [rule["expr"] for group in doc["spec"]["groups"] for rule in group["rules"]]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[int, Path], PrometheusServer]]:
    """Start a Prometheus scraping an operator's metrics port (every second); stopped afterwards."""
    if find_prometheus() is None:
        pytest.fail(f"prometheus is not installed: {MISSING}", pytrace=False)
    started: list[PrometheusServer] = []

    def start(metrics_port: int, rules: Path) -> PrometheusServer:
        server = PrometheusServer(tmp_path / "prometheus", [f"127.0.0.1:{metrics_port}"], [rules])
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


def approver(kube: KubeEnv, namespace: str) -> client.ApiClient:
    """A user who holds the approve verb on the namespace's runs."""
    grant(
        kube, namespace, "alice", rule(GROUP, "agentruns", "get", "list", "patch", "approve"), name="approver"
    )
    return kube.user_client("alice", [])


@pytest.mark.local_plane("users", "webhook")
def test_every_metric_of_the_rules_and_the_dashboard_exists_on_a_live_operator(
    kube: KubeEnv,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    prometheus: Callable[[int, Path], PrometheusServer],
    tmp_path: Path,
) -> None:
    rules, expressions = chart_rules(tmp_path)
    dashboard: dict[str, Any] = json.loads((CHART / "files" / "dashboard.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    wanted = metric_names(expressions + queries)
    assert len(wanted) > 15, wanted

    # Prometheus first: it looks at its targets 5 s after it starts, and the workload is faster.
    metrics_port = free_port()
    server = prometheus(metrics_port, rules)
    eventually(lambda: server.query("up"), Within.COMMIT, "Prometheus's first scrape")
    started = datetime.now(UTC)
    test_approvals.policy(runs)
    op = start_operator(
        "prom",
        LEASE,
        DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()),
        DURABLE_AGENTS_METRICS_PORT=str(metrics_port),
    )
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()  # the approvals are stamped by it

    # The workload: payments that wait for an approval, are approved one after the other and are
    # sent once each; and a question nobody answers (a wait that goes on).
    alice = approver(kube, namespace)
    runs.create(PARKED, name="parked")
    names = [runs.create(test_approvals.payment(refsystem.url)) for _ in range(PAYMENTS)]
    for name in names:
        request = test_approvals.pending(runs, name)
        test_approvals.decide(alice, runs, name, request["requestId"], request["digest"])
        runs.wait_state(name, "completed", timeout=Within.RUN)
    assert sorted(refsystem.counts().values()) == [1] * PAYMENTS

    def missing() -> set[str] | None:
        absent = wanted - server.names()
        return absent or None

    eventually(server.targets_up, Within.COMMIT, f"Prometheus to scrape the operator:\n{server.log_tail()}")
    try:
        eventually(lambda: missing() is None, Within.COMMIT, "every metric of the rules and dashboard")
    except TimeoutError:
        raise AssertionError(f"no series in Prometheus for {sorted(missing() or ())}") from None

    def value(promql: str) -> float:
        result = server.query(promql)
        return float(result[0]["value"][1]) if result else 0.0

    # The seed's metrics moved with the workload: the waits and the approvals were observed, the
    # parked run's age is the oldest input wait, and this replica owns its region.
    eventually(
        lambda: (
            value('sum(durable_agents_waiting_seconds_count{state="waiting_approval"})') >= PAYMENTS
            and value("sum(durable_agents_approval_latency_seconds_count)") >= PAYMENTS
            and value('sum(durable_agents_action_dispatches_total{effect="http.post"})') >= PAYMENTS
            and value('max(durable_agents_oldest_waiting_seconds{state="waiting_input"})') > 0
        ),
        Within.COMMIT,
        "the approval waits, their latency, the dispatches and the parked run's age to be scraped",
    )
    assert value('max(durable_agents_region_owned{region="default"})') == 1

    # The chart's rules, loaded into this Prometheus, evaluate against the operator's series.
    def evaluated() -> list[dict[str, Any]] | None:
        loaded = [rule for group in server.api("rules")["groups"] for rule in group["rules"]]
        return loaded if loaded and all(rule["health"] != "unknown" for rule in loaded) else None

    loaded = eventually(evaluated, Within.COMMIT, "the chart's rules to be evaluated")
    assert len(loaded) == len(expressions)
    broken = {rule["name"]: rule.get("lastError") for rule in loaded if rule["health"] != "ok"}
    assert not broken, broken

    # The dashboard's panels over the test, for hack/dashboard_png.py.
    data = dashboard_data(server, dashboard, started, datetime.now(UTC))
    target = Path(os.environ.get("DASHBOARD_DATA") or tmp_path / "dashboard-data.json")
    target.write_text(json.dumps(data))
    drawn = [panel["title"] for panel in data["panels"] if panel["series"]]
    assert len(drawn) >= len(data["panels"]) // 2, f"most panels have data; these do: {drawn}"
