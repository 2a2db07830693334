"""What the chaos scenarios run: AgentRun specs built from steps, and AgentPolicies applied."""

from __future__ import annotations

from typing import Any

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.cluster import KubeEnv

SETTINGS_CONFIGMAP = "settings"  # every lab namespace has it (see lab.prepare_namespace)

READ = {
    "name": "read-settings",
    "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": SETTINGS_CONFIGMAP}},
}
DONE = {"name": "done", "complete": {"result": "ok"}}


def ask(expires: str = "1h", name: str = "confirm") -> dict[str, Any]:
    return {"name": name, "ask": {"question": "proceed?", "expiresIn": expires}}


def await_event(event: str = "window-open", expires: str = "1h") -> dict[str, Any]:
    return {"name": "window", "await": {"event": event, "expiresIn": expires}}


def pay(url: str, invoice: str, amount: int = 10, name: str = "pay") -> dict[str, Any]:
    """An http.post effect to the reference system; ``invoice`` identifies the payment in the
    business sense, so a payment made twice under two idempotency keys is caught too."""
    return {
        "name": name,
        "effect": {
            "effect": "http.post",
            "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
            "arguments": {"invoice": invoice, "amount": amount},
        },
    }


def run_spec(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"taskType": "chaos", "objective": "survive whatever happens", "steps": list(steps), **extra}


def policy_body(name: str, version: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": name},
        "spec": {"version": version, **spec},
    }


def apply_policy(kube: KubeEnv, namespace: str, name: str, version: str, **spec: Any) -> None:
    """Create or update the AgentPolicy by server-side apply, as a GitOps pipeline does: one
    request with no resourceVersion precondition, so the operator's own writes to the policy
    (its integrity stamp, its status) never make the pipeline's apply conflict."""
    kube.custom().patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "agentpolicies",
        name,
        policy_body(name, version, **spec),
        field_manager="gitops-pipeline",
        force=True,
        _content_type="application/apply-patch+yaml",
    )
