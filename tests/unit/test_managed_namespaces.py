"""A namespace the operator may not act in: the condition (pure) and how a refused impersonation
is told from the ServiceAccount's own 403 (the API server's message, as it sends it)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from kubernetes.client.rest import ApiException

from durable_agents.core import managed_namespaces as core
from durable_agents.shell.ground.kube import ImpersonationRefused

NOW = datetime(2026, 12, 3, 16, 0, tzinfo=UTC)


def forbidden(message: str) -> ApiException:
    err = ApiException(status=403, reason="Forbidden")
    err.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": 403})
    return err


def test_a_refused_impersonation_names_the_namespace_and_is_not_the_accounts_403() -> None:
    refused = ImpersonationRefused.of(
        forbidden(
            'serviceaccounts "default" is forbidden: User "system:serviceaccount:ops:da-durable-agents"'
            ' cannot impersonate resource "serviceaccounts" in API group "" in the namespace "team-a"'
        )
    )
    assert refused is not None
    assert refused.namespace == "team-a"
    own = forbidden(
        'configmaps "settings" is forbidden: User "system:serviceaccount:team-a:default" cannot get'
        ' resource "configmaps" in API group "" in the namespace "team-a"'
    )
    assert ImpersonationRefused.of(own) is None, "the ServiceAccount's own refusal stays a 403"
    assert ImpersonationRefused.of(ApiException(status=404)) is None


def test_the_condition_is_set_once_names_the_fix_and_is_removed() -> None:
    status = {"conditions": [{"type": "Waiting", "status": "True", "reason": "WaitingInput"}]}
    marked = core.marked(status, "team-a", NOW, 3)
    assert marked is not None
    [condition] = [c for c in marked if c["type"] == core.NOT_MANAGED]
    assert condition["status"] == "True"
    assert "team-a" in condition["message"]
    assert "managedNamespaces" in condition["message"]
    assert "kubectl create rolebinding" in condition["message"]
    assert condition["observedGeneration"] == 3
    assert [c["type"] for c in marked] == ["Waiting", core.NOT_MANAGED], "the others are kept"
    assert core.marked({"conditions": marked}, "team-a", NOW, 3) is None, "already so: no write"
    cleared = core.cleared({"conditions": marked})
    assert cleared == status["conditions"]
    assert core.cleared(status) is None, "nothing to remove: no write"
