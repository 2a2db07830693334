"""The operator's own RBAC, measured: what the chart grants the operator's ServiceAccount (every
verb on every resource, where) is the table checked in at docs/security/operator-rbac.md, so any
widening is a reviewed change of that page. Rights that act as someone else are granted only in
the namespaces that opt in; Leases only in the operator's namespace; webhook configurations by name.

helm is built by hack/build.sh (`make binaries`); a missing helm fails these tests.
"""

from __future__ import annotations

import subprocess

import pytest

from durable_agents_testkit import operator_rbac
from durable_agents_testkit.operator_rbac import CHART, PAGE, RELEASE, page_table, render, rows, table


@pytest.fixture(scope="module")
def helm() -> str:
    return operator_rbac.helm_binary()


def test_the_checked_in_table_is_what_the_chart_grants(helm: str) -> None:
    assert page_table(PAGE.read_text()) == table(helm), (
        "the operator's RBAC differs from docs/security/operator-rbac.md: review the change, then "
        "`python -m durable_agents_testkit.operator_rbac --write`"
    )


def test_impersonation_is_granted_in_the_managed_namespaces_only(helm: str) -> None:
    default = rows(render(helm, []))
    assert not [r for r in default if r[2] == "serviceaccounts"], "no namespace opts in by default"
    opened = rows(render(helm, ["--set", "managedNamespaces={team-a,team-b}"]))
    where = {r[0] for r in opened if r[2] == "serviceaccounts"}
    assert where == {"managed namespace (team-a)", "managed namespace (team-b)"}, where
    watched = rows(render(helm, ["--set", "watchNamespace=team-c"]))
    assert {r[0] for r in watched if r[2] == "serviceaccounts"} == {"managed namespace (team-c)"}


def test_no_cluster_wide_right_reads_secrets_impersonates_or_writes_leases(helm: str) -> None:
    cluster = [r for r in rows(render(helm, operator_rbac.RENDERS["most open"])) if r[0] == "cluster"]
    for _where, _group, resource, names, verbs in cluster:
        assert resource not in ("secrets", "configmaps", "serviceaccounts", "leases"), (resource, verbs)
        assert "impersonate" not in verbs
        assert "*" not in verbs
        assert resource != "*"
        if resource.endswith("webhookconfigurations"):
            assert names == "durable-agents"
            assert "create" not in verbs
            assert "delete" not in verbs


def test_a_managed_namespace_outside_the_watched_one_is_refused(helm: str) -> None:
    result = subprocess.run(
        [
            helm,
            "template",
            RELEASE,
            str(CHART),
            "--set",
            "watchNamespace=a",
            "--set",
            "managedNamespaces={b}",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0, "helm template accepted it"
    assert "managedNamespaces" in result.stderr, result.stderr
    result = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "--set", "managedNamespaces={Team_A}"],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0, "helm template accepted it"
    assert "managedNamespaces" in result.stderr, result.stderr
