"""Granting a test's user (or group, or ServiceAccount) exactly the permissions it needs.

``grant(kube, namespace, "alice", [rule(GROUP, "agentruns", "get", "approve")])`` makes one Role
with exactly those rules and binds it to the subject, in one namespace; ``grant_cluster`` does the
same cluster-wide (a ClusterRole and a ClusterRoleBinding). Rules are plain PolicyRule dicts, so a
test can also pass the chart's own rules as read from its files.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents_testkit.cluster import KubeEnv

RBAC_GROUP = "rbac.authorization.k8s.io"
Rule = dict[str, Any]
Subject = dict[str, str]


def rule(api_group: str, resources: str | list[str], *verbs: str, names: list[str] | None = None) -> Rule:
    """A PolicyRule: ``verbs`` on ``resources`` of ``api_group`` ("" is the core group),
    only the objects named in ``names`` when given."""
    out: Rule = {
        "apiGroups": [api_group],
        "resources": [resources] if isinstance(resources, str) else list(resources),
        "verbs": list(verbs),
    }
    if names is not None:
        out["resourceNames"] = list(names)
    return out


def user(name: str) -> Subject:
    return {"apiGroup": RBAC_GROUP, "kind": "User", "name": name}


def group(name: str) -> Subject:
    return {"apiGroup": RBAC_GROUP, "kind": "Group", "name": name}


def service_account(name: str, namespace: str) -> Subject:
    return {"kind": "ServiceAccount", "name": name, "namespace": namespace}


def _subject(who: str | Subject) -> Subject:
    return user(who) if isinstance(who, str) else who


def _rbac(kube: KubeEnv | client.ApiClient) -> client.RbacAuthorizationV1Api:
    return client.RbacAuthorizationV1Api(kube.api if isinstance(kube, KubeEnv) else kube)


def _create(create: Any, *args: Any, exist_ok: bool) -> None:
    try:
        create(*args)
    except ApiException as err:
        if not (exist_ok and err.status == 409):
            raise


def grant(
    kube: KubeEnv | client.ApiClient,
    namespace: str,
    who: str | Subject,
    rules: Rule | list[Rule],
    *,
    name: str | None = None,
    exist_ok: bool = False,
) -> str:
    """A Role with exactly ``rules`` in ``namespace``, bound to ``who`` (a user's name, or a
    subject from :func:`user`, :func:`group`, :func:`service_account`). Role and RoleBinding are
    both named ``name`` (default: the subject's name); with ``exist_ok`` they may exist already.
    Returns the name."""
    subject = _subject(who)
    name = name or subject["name"]
    rbac = _rbac(kube)
    role = {"metadata": {"name": name}, "rules": [rules] if isinstance(rules, dict) else list(rules)}
    _create(rbac.create_namespaced_role, namespace, role, exist_ok=exist_ok)
    bind(kube, namespace, subject, name, exist_ok=exist_ok)
    return name


def bind(
    kube: KubeEnv | client.ApiClient,
    namespace: str,
    who: str | Subject,
    role: str,
    *,
    cluster_role: bool = False,
    name: str | None = None,
    exist_ok: bool = False,
) -> str:
    """A RoleBinding in ``namespace`` of an existing Role (or, with ``cluster_role``, ClusterRole)
    to ``who``, named ``name`` (default: the role's). Returns the name."""
    name = name or role
    ref = {"apiGroup": RBAC_GROUP, "kind": "ClusterRole" if cluster_role else "Role", "name": role}
    body = {"metadata": {"name": name}, "roleRef": ref, "subjects": [_subject(who)]}
    _create(_rbac(kube).create_namespaced_role_binding, namespace, body, exist_ok=exist_ok)
    return name


def grant_cluster(
    kube: KubeEnv | client.ApiClient,
    who: str | Subject | list[Subject],
    rules: Rule | list[Rule],
    *,
    name: str,
    exist_ok: bool = False,
) -> str:
    """A ClusterRole with exactly ``rules``, bound cluster-wide to ``who`` (one subject or several)
    by a ClusterRoleBinding; both named ``name``. Returns the name."""
    rbac = _rbac(kube)
    role = {"metadata": {"name": name}, "rules": [rules] if isinstance(rules, dict) else list(rules)}
    subjects = [_subject(w) for w in who] if isinstance(who, list) else [_subject(who)]
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
        "subjects": subjects,
    }
    _create(rbac.create_cluster_role, role, exist_ok=exist_ok)
    _create(rbac.create_cluster_role_binding, binding, exist_ok=exist_ok)
    return name
