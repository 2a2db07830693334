"""Policies a test namespace is governed by (issue 32: no run is ungoverned).

Tests written before runs were governed by default sent a run's effects without any policy. Their
namespaces now get :func:`permissive_default`: a default AgentPolicy that asks for no approval,
which says in the open what those tests assumed. A test of ungoverned runs is marked
``ungoverned`` (e2e/conftest.py) and gets none.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION

PERMISSIVE_DEFAULT = "permissive-default"


def permissive_default(
    api: client.ApiClient, namespace: str, name: str = PERMISSIVE_DEFAULT
) -> dict[str, Any]:
    """Create the namespace's default AgentPolicy, asking for no approval; returns it as stored."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": name},
        "spec": {"version": "1", "default": True, "approvalRequiredTiers": []},
    }
    made: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentpolicies", body
    )
    return made
