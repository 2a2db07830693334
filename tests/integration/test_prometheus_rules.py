"""The chart's alerts and dashboard, checked by Prometheus's own tool: the rule groups of
files/prometheus-rules.yaml, rendered by helm as the chart's PrometheusRule renders them, pass
`promtool check rules`, and `promtool test rules` (charts/durable-agents/tests/
prometheus-rules.test.yaml) with a test series for every alert, firing and not firing; the
thresholds are chart values; every dashboard query is valid PromQL (checked as a recording rule).

promtool comes with Debian's prometheus package (`make prometheus` installs it; `make test` runs
that first): a missing promtool fails these tests, it does not skip them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from durable_agents_testkit.localcluster.controlplane import ensure_binaries

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "durable-agents"
RULES_TEST = CHART / "tests" / "prometheus-rules.test.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
TIMEOUT = 60.0


def run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False, cwd=cwd)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (
        f"{' '.join(result.args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").is_file() else None)
    if found is None:
        pytest.fail(
            "promtool is missing: `make prometheus` installs it (Debian's prometheus package); "
            "`make test` runs it first",
            pytrace=False,
        )
    return found


@pytest.fixture(scope="module")
def helm() -> str:
    helm = ensure_binaries(controller_manager=False) / "helm"
    assert helm.is_file(), f"helm is missing from {helm.parent}: `make binaries` builds it"
    return str(helm)


def rendered_rules(helm: str, *sets: str) -> dict[str, Any]:
    """The PrometheusRule's spec (its rule groups) as the chart renders it with ``sets``."""
    argv = [helm, "template", "rules-test", str(CHART), "--show-only", "templates/prometheusrule.yaml"]
    argv += ["--set", "monitoring.prometheusRule.enabled=true"]
    for value in sets:
        argv += ["--set", value]
    [doc] = [d for d in yaml.safe_load_all(ok(run(argv))) if d]
    assert doc["kind"] == "PrometheusRule"
    spec: dict[str, Any] = doc["spec"]
    return spec


def alerts(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in spec["groups"] for rule in group["rules"] if "alert" in rule}


@pytest.fixture(scope="module")
def rules_dir(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rendered rules as rules.yaml (the name the test file loads), next to the test file."""
    directory = tmp_path_factory.mktemp("rules")
    (directory / "rules.yaml").write_text(yaml.safe_dump(rendered_rules(helm)))
    shutil.copy(RULES_TEST, directory / RULES_TEST.name)
    return directory


def test_promtool_checks_the_rules(promtool: str, rules_dir: Path, helm: str) -> None:
    out = ok(run([promtool, "check", "rules", str(rules_dir / "rules.yaml")]))
    count = len(alerts(rendered_rules(helm)))
    assert f"SUCCESS: {count} rules found" in out, out


def test_promtool_tests_every_alert(promtool: str, rules_dir: Path) -> None:
    out = ok(run([promtool, "test", "rules", RULES_TEST.name], cwd=rules_dir))
    assert "SUCCESS" in out, out


def test_every_alert_has_a_test_that_fires_and_one_that_does_not(helm: str) -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    cases = [case for test in tests for case in test.get("alert_rule_test", [])]
    names = set(alerts(rendered_rules(helm)))
    assert len(names) >= 6, names
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert names - firing == set(), f"no test where these fire: {sorted(names - firing)}"
    assert names - quiet == set(), f"no test where these stay quiet: {sorted(names - quiet)}"
    assert (firing | quiet) <= names, (
        f"tests of alerts the rules do not have: {sorted((firing | quiet) - names)}"
    )


def test_the_thresholds_are_chart_values(promtool: str, helm: str, tmp_path: Path) -> None:
    spec = rendered_rules(
        helm,
        "monitoring.prometheusRule.approvalWaitSeconds=600",
        "monitoring.prometheusRule.unknownOutcomeSeconds=120",
        "monitoring.prometheusRule.stuckFor=90s",
        "monitoring.prometheusRule.regionWithoutOwnerFor=1m",
        "monitoring.prometheusRule.unownedFor=3m",
    )
    rules = alerts(spec)
    assert rules["DurableAgentsApprovalWaitTooLong"]["expr"].endswith("> 600")
    assert rules["DurableAgentsUnknownOutcomeTooOld"]["expr"].endswith("> 120")
    assert rules["DurableAgentsRunsStuck"]["for"] == "90s"
    assert rules["DurableAgentsRegionWithoutOwner"]["for"] == "1m"
    assert rules["DurableAgentsRunsWithoutLiveOwner"]["for"] == "3m"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    ok(run([promtool, "check", "rules", str(tmp_path / "rules.yaml")]))


def test_a_threshold_that_is_not_a_number_is_refused_by_name(helm: str) -> None:
    argv = [helm, "template", "rules-test", str(CHART), "--set", "monitoring.prometheusRule.stuckFor=soon"]
    result = run(argv)
    assert result.returncode != 0, "helm template accepted stuckFor=soon"
    assert "/monitoring/prometheusRule/stuckFor" in result.stderr, result.stderr


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_every_dashboard_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    # Grafana's $__rate_interval is not PromQL: replaced by a range, as Grafana does.
    queries = [query.replace("$__rate_interval", "5m") for query in dashboard_queries()]
    assert queries, "the dashboard has no queries"
    rules = [{"record": f"dashboard:query_{i}", "expr": query} for i, query in enumerate(queries)]
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": rules}]}))
    out = ok(run([promtool, "check", "rules", str(tmp_path / "dashboard.yaml")]))
    assert f"SUCCESS: {len(rules)} rules found" in out, out


def test_the_dashboard_configmap_carries_the_file_for_grafanas_sidecar(helm: str) -> None:
    argv = [helm, "template", "rules-test", str(CHART), "--show-only", "templates/dashboard.yaml"]
    [doc] = [
        d for d in yaml.safe_load_all(ok(run([*argv, "--set", "monitoring.dashboard.enabled=true"]))) if d
    ]
    assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
    [(name, text)] = doc["data"].items()
    assert name.endswith(".json")
    assert json.loads(text) == json.loads(DASHBOARD.read_text())
