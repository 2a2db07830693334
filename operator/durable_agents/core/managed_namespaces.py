"""A run in a namespace the operator may not act in: the ``NamespaceNotManaged`` condition.

A namespace opts in by granting the operator the right to impersonate its ServiceAccounts (a
RoleBinding: the chart's ``managedNamespaces``, or one made by hand, docs/security/operator-rbac.md).
Without it nothing of a run can be read or done as its ServiceAccount, so the run is left alone:
not started, not failed, with this condition saying why and how to opt in. Pure: the conditions
(wire form) with the condition set, or without it; None when they are already so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

NOT_MANAGED = "NamespaceNotManaged"
REASON = "NoRoleBinding"
CLUSTER_ROLE = "<release>-durable-agents-managed-namespace"


def not_managed_message(namespace: str) -> str:
    return (
        f"the operator may not act as ServiceAccounts of namespace {namespace} (it has not opted in):"
        f" the run is left as it is, not failed. To opt in, list {namespace} in the chart's"
        f" managedNamespaces, or: kubectl create rolebinding durable-agents -n {namespace}"
        f" --clusterrole={CLUSTER_ROLE} --serviceaccount=<operator namespace>:<release>-durable-agents"
        " (docs/security/operator-rbac.md); the run goes on by itself once it has."
    )


def _conditions(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    found = status.get("conditions") or []
    return [dict(c) for c in found if isinstance(c, Mapping)] if isinstance(found, Sequence) else []


def is_marked(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == NOT_MANAGED and c.get("status") == "True" for c in _conditions(status))


def marked(
    status: Mapping[str, Any], namespace: str, now: datetime, generation: int
) -> list[dict[str, Any]] | None:
    """The run's conditions with ``NamespaceNotManaged`` True; None if it says so already."""
    if is_marked(status):
        return None
    condition = {
        "type": NOT_MANAGED,
        "status": "True",
        "reason": REASON,
        "message": not_managed_message(namespace),
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "observedGeneration": generation,
    }
    return [*(c for c in _conditions(status) if c.get("type") != NOT_MANAGED), condition]


def cleared(status: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The run's conditions without ``NamespaceNotManaged``; None if it has none."""
    conditions = _conditions(status)
    kept = [c for c in conditions if c.get("type") != NOT_MANAGED]
    return None if len(kept) == len(conditions) else kept
