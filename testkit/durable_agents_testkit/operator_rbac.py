"""The operator's own RBAC, as the chart grants it: every verb on every resource, where.

``helm template`` renders the chart (with its defaults, and with its most open values); every
Role and ClusterRole bound to the operator's ServiceAccount is read, and each rule becomes one row
per resource: where it holds (the cluster, the release's namespace, a managed namespace), the
API group, the resource, the names it is limited to, the verbs. docs/security/operator-rbac.md
carries the table between its markers; tests/unit/test_operator_rbac.py fails on any difference,
so a widening shows up in review. Regenerate: ``python -m durable_agents_testkit.operator_rbac --write``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "durable-agents"
PAGE = REPO / "docs" / "security" / "operator-rbac.md"
RELEASE, NAMESPACE = "durable-agents", "durable-agents"
BEGIN, END = "<!-- operator-rbac:begin -->", "<!-- operator-rbac:end -->"

# The renders the table covers: the defaults, and everything that grants the operator more
# (webhook served with its own certificate, namespaces opted in, cluster-wide watch).
RENDERS: dict[str, list[str]] = {
    "defaults": [],
    "most open": ["--set", "managedNamespaces={team-a}", "--set", "console.enabled=true"],
}

Row = tuple[str, str, str, str, str]  # where, apiGroup, resource, resourceNames, verbs


def render(helm: str, args: Iterable[str]) -> list[dict[str, Any]]:
    out = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _operator_bound(binding: Mapping[str, Any], account: str) -> bool:
    return any(
        s.get("kind") == "ServiceAccount" and s.get("name") == account and s.get("namespace") == NAMESPACE
        for s in binding.get("subjects") or []
    )


def rows(docs: list[dict[str, Any]]) -> list[Row]:
    """Every (where, group, resource, names, verbs) the operator's ServiceAccount holds."""
    [account] = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "ServiceAccount" and "console" not in d["metadata"]["name"]
    ]
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    found: set[Row] = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding") or not _operator_bound(
            binding, account
        ):
            continue
        ref = binding["roleRef"]
        role = roles[(ref["kind"], ref["name"])]  # a binding to a role the chart does not render fails here
        if binding["kind"] == "ClusterRoleBinding":
            where = "cluster"
        else:
            namespace = binding["metadata"].get("namespace") or NAMESPACE
            where = "own namespace" if namespace == NAMESPACE else f"managed namespace ({namespace})"
        for rule in role.get("rules") or []:
            names = ", ".join(rule.get("resourceNames") or []) or "(any)"
            for group in rule.get("apiGroups") or [""]:
                for resource in rule.get("resources") or []:
                    found.add((where, group or "(core)", resource, names, ", ".join(sorted(rule["verbs"]))))
    return sorted(found)


def table(helm: str) -> str:
    lines = []
    for label, args in RENDERS.items():
        lines += [
            f"#### {label.capitalize()}",
            "",
            "| Where | API group | Resource | Names | Verbs |",
            "|---|---|---|---|---|",
        ]
        lines += [f"| {' | '.join(row)} |" for row in rows(render(helm, args))]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def page_table(text: str) -> str:
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip() + "\n"


def write(helm: str) -> None:
    text = PAGE.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    PAGE.write_text(f"{head}{BEGIN}\n\n{table(helm)}\n{END}{tail}")


def helm_binary() -> str:
    from durable_agents_testkit.localcluster.controlplane import ensure_binaries

    return str(ensure_binaries(controller_manager=False) / "helm")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write(helm_binary())
    else:
        sys.stdout.write(table(helm_binary()))
