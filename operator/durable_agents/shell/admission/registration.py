"""The admission webhook's registration with the API server: its Mutating and Validating
configurations (failurePolicy Fail; scoped by namespace when the operator watches one; calling the
operator's endpoint by URL or, in a cluster, through its Service), installed and kept current.
They also cover RegionFailovers (cluster-scoped; rules: :mod:`durable_agents.shell.admission.failover`)
and keyring Secrets (:mod:`durable_agents.shell.keys.keyguard`).
"""

from __future__ import annotations

import base64
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import AGENT_SCHEDULE_PLURAL, FAILOVER_PLURAL, GROUP, VERSION
from durable_agents.shell.admission.authority import (
    MUTATE_FAILOVER_PATH,
    MUTATE_PATH,
    VALIDATE_FAILOVER_PATH,
    VALIDATE_PATH,
)
from durable_agents.shell.admission.definitions import DEFINITION_PATH, DEFINITION_STAMP_PATH, PLURALS
from durable_agents.shell.admission.policies import (
    CLUSTER_POLICY_PATH,
    CLUSTER_POLICY_PLURAL,
    POLICY_PATH,
    POLICY_STAMP_PATH,
)
from durable_agents.shell.admission.schedules import SCHEDULE_PATH, SCHEDULE_STAMP_PATH
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.keys.keyguard import KEYGUARD_PATH, KEYRING_LABEL

Target = tuple[str | None, tuple[str, str, int] | None, bytes]
"""How the API server reaches the webhook: a URL, or a Service (namespace, name, port); the CA."""


def _rule(
    resource: str, operations: list[str], scope: str, group: str = GROUP, version: str = VERSION
) -> dict[str, Any]:
    return {
        "apiGroups": [group],
        "apiVersions": [version],
        "resources": [resource],
        "operations": operations,
        "scope": scope,
    }


def _client_config(target: Target, path: str) -> dict[str, Any]:
    url, service, ca_pem = target
    if url is not None:
        where: dict[str, Any] = {"url": f"{url.rstrip('/')}/{path}"}
    elif service is not None:
        where = {
            "service": {"namespace": service[0], "name": service[1], "port": service[2], "path": f"/{path}"}
        }
    else:
        where = {}
    return {**where, "caBundle": base64.b64encode(ca_pem).decode()}


def _hook(target: Target, path: str, suffix: str, namespace: str | None) -> dict[str, Any]:
    """One AgentRun webhook: failurePolicy Fail, scoped by namespace when the operator watches one."""
    return {
        "name": f"{suffix}.agentruns.{GROUP}",
        "clientConfig": _client_config(target, path),
        "rules": [_rule("agentruns", ["CREATE", "UPDATE"], "Namespaced")],
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}} if namespace else {},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 10,
        "matchPolicy": "Equivalent",
    }


def _failover_hook(target: Target, path: str, suffix: str, namespace: str | None) -> dict[str, Any]:
    # A cluster-scoped object is never skipped by a namespaceSelector: the webhook of an
    # operator that watches one namespace would, once that operator is gone, refuse every
    # failover in the cluster. So only a cluster-wide operator fails closed; for the others a
    # failover admitted while no webhook answers carries no stamp, and is refused by the
    # operator that would act on it.
    return {
        **_hook(target, path, suffix, namespace),
        "name": f"{suffix}.{FAILOVER_PLURAL}.{GROUP}",
        "rules": [_rule(FAILOVER_PLURAL, ["CREATE", "UPDATE"], "Cluster")],
        "namespaceSelector": {},
        "failurePolicy": "Ignore" if namespace else "Fail",
    }


def _keyring_hook(target: Target, namespace: str | None) -> dict[str, Any]:
    """Keyring Secrets (labelled): a key still in use is never removed
    (:mod:`durable_agents.shell.keys.keyguard`)."""
    return {
        **_hook(target, KEYGUARD_PATH, "keyring", namespace),
        "name": f"keyring.secrets.{GROUP}",
        "rules": [_rule("secrets", ["UPDATE", "DELETE"], "Namespaced", group="", version="v1")],
        "objectSelector": {"matchLabels": {KEYRING_LABEL: "true"}},
    }


def _policy_hooks(target: Target, namespace: str | None) -> list[dict[str, Any]]:
    """AgentPolicies: integrity and the preview of a new version (failurePolicy Fail), and their
    deletion while runs use them. A delete fails open when no webhook answers (an uninstalled
    operator must not wedge a namespace's deletion): a run whose policy is gone never acts
    without it, it waits (``PolicyMissing``)."""
    return [
        {
            **_hook(target, POLICY_PATH, "policy", namespace),
            "name": f"policy.agentpolicies.{GROUP}",
            "rules": [_rule("agentpolicies", ["CREATE", "UPDATE"], "Namespaced")],
        },
        {
            **_hook(target, POLICY_PATH, "policy", namespace),
            "name": f"policy-delete.agentpolicies.{GROUP}",
            "rules": [_rule("agentpolicies", ["DELETE"], "Namespaced")],
            "failurePolicy": "Ignore",
        },
        {  # cluster-scoped: never skipped by a namespaceSelector, so it fails closed only for a
            # cluster-wide operator (as failovers); the operator ignores two defaults anyway
            **_hook(target, CLUSTER_POLICY_PATH, "policy", namespace),
            "name": f"policy.{CLUSTER_POLICY_PLURAL}.{GROUP}",
            "rules": [_rule(CLUSTER_POLICY_PLURAL, ["CREATE", "UPDATE"], "Cluster")],
            "namespaceSelector": {},
            "failurePolicy": "Ignore" if namespace else "Fail",
        },
    ]


def _definition_hooks(target: Target, namespace: str | None) -> list[dict[str, Any]]:
    """Agents and ModelConfigs: a force-delete mark needs its verb (UPDATE, failurePolicy Fail);
    their deletion while runs use them is refused (DELETE fails open, as a policy's: a run that
    pinned its definition never needs it again)."""
    hooks: list[dict[str, Any]] = []
    for kind, plural in PLURALS.items():
        # An Agent's creation too: a cycle of sub-agent calls is refused when it is written.
        writes = ["CREATE", "UPDATE"] if kind == "Agent" else ["UPDATE"]
        hooks += [
            {
                **_hook(target, DEFINITION_PATH, "definition", namespace),
                "name": f"definition.{plural}.{GROUP}",
                "rules": [_rule(plural, writes, "Namespaced")],
            },
            {
                **_hook(target, DEFINITION_PATH, "definition", namespace),
                "name": f"definition-delete.{plural}.{GROUP}",
                "rules": [_rule(plural, ["DELETE"], "Namespaced")],
                "failurePolicy": "Ignore",
            },
        ]
    return hooks


def _definition_stamp_hooks(target: Target, namespace: str | None) -> list[dict[str, Any]]:
    return [
        {  # an Agent's or ModelConfig's force-delete mark: who, when, the stamp
            **_hook(target, DEFINITION_STAMP_PATH, "definition-stamp", namespace),
            "name": f"definition-stamp.{plural}.{GROUP}",
            "rules": [_rule(plural, ["UPDATE"], "Namespaced")],
        }
        for plural in PLURALS.values()
    ]


def _schedule_hooks(target: Target, namespace: str | None, *, stamp: bool) -> list[dict[str, Any]]:
    """AgentSchedules: the creator's stamp (mutating, CREATE) or the schedule's validity and the
    creator's authority (validating, CREATE and UPDATE); failurePolicy Fail, as a run's."""
    path, suffix = (SCHEDULE_STAMP_PATH, "schedule-stamp") if stamp else (SCHEDULE_PATH, "schedule")
    operations = ["CREATE"] if stamp else ["CREATE", "UPDATE"]
    return [
        {
            **_hook(target, path, suffix, namespace),
            "name": f"{suffix}.{AGENT_SCHEDULE_PLURAL}.{GROUP}",
            "rules": [_rule(AGENT_SCHEDULE_PLURAL, operations, "Namespaced")],
        }
    ]


def webhook_configurations(
    *,
    name: str,
    url: str | None = None,
    service: tuple[str, str, int] | None = None,
    ca_pem: bytes,
    namespace: str | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Mutating and Validating webhook configurations, failurePolicy Fail, calling ``url`` or,
    in a cluster, the ``service`` (namespace, name, port) in front of the operator's Pods."""
    if (url is None) == (service is None):
        raise ValueError("a webhook is reached by a URL or by a Service: exactly one")
    target: Target = (url, service, ca_pem)
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            _hook(target, MUTATE_PATH, "stamp", namespace),
            _failover_hook(target, MUTATE_FAILOVER_PATH, "stamp", namespace),
            {  # an AgentPolicy's force-delete mark: who, when, the stamp
                **_hook(target, POLICY_STAMP_PATH, "policy-stamp", namespace),
                "name": f"policy-stamp.agentpolicies.{GROUP}",
                "rules": [_rule("agentpolicies", ["UPDATE"], "Namespaced")],
            },
            *_definition_stamp_hooks(target, namespace),
            *_schedule_hooks(target, namespace, stamp=True),
        ],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            _hook(target, VALIDATE_PATH, "approve", namespace),
            _keyring_hook(target, namespace),
            *_policy_hooks(target, namespace),
            *_definition_hooks(target, namespace),
            *_schedule_hooks(target, namespace, stamp=False),
            _failover_hook(target, VALIDATE_FAILOVER_PATH, "failover", namespace),
        ],
    }
    return mutating, validating


_REPLACE_ATTEMPTS = 5  # conflicts in a row (each one another replica's write) before giving up


async def install_webhooks(kube: Kube, mutating: dict[str, Any], validating: dict[str, Any]) -> None:
    from kubernetes import client

    api = client.AdmissionregistrationV1Api(kube.api)
    for body, create, read, replace in (
        (
            mutating,
            api.create_mutating_webhook_configuration,
            api.read_mutating_webhook_configuration,
            api.replace_mutating_webhook_configuration,
        ),
        (
            validating,
            api.create_validating_webhook_configuration,
            api.read_validating_webhook_configuration,
            api.replace_validating_webhook_configuration,
        ),
    ):
        try:  # the chart renders them, and grants get and update by name only: create is for
            await kube.call(read, body["metadata"]["name"])  # an operator run outside it
        except ApiException as err:
            if err.status != 404:
                raise
            try:
                await kube.call(create, body)
                continue
            except ApiException as again:
                if again.status != 409:  # another replica made it meanwhile
                    raise
        await _replace_webhooks(kube, body, read, replace)


async def _replace_webhooks(kube: Kube, body: dict[str, Any], read: Any, replace: Any) -> None:
    """Replace a stored configuration with ``body`` unless it already has its webhooks. Replicas
    starting together all do this: one that loses the race (409) reads again, and finds the
    winner's write, which is the same, or tries once more."""
    name = body["metadata"]["name"]
    for _ in range(_REPLACE_ATTEMPTS):
        current = await kube.call(read, name)
        if _same_webhooks(kube, current, body):
            return  # replicas agree: no write (several replicas keep these current)
        kept = {  # the chart's labels and annotations (helm's ownership) stay
            "labels": current.metadata.labels or {},
            "annotations": current.metadata.annotations or {},
        }
        metadata = {**kept, **body["metadata"], "resourceVersion": current.metadata.resource_version}
        try:
            await kube.call(replace, name, {**body, "metadata": metadata})
            return
        except ApiException as err:
            if err.status != 409:
                raise
    raise RuntimeError(f"webhook configuration {name}: still changing after {_REPLACE_ATTEMPTS} attempts")


def _same_webhooks(kube: Kube, current: Any, wanted: dict[str, Any]) -> bool:
    """Whether the stored configuration already has the webhooks we want (defaults the API server
    fills in, such as reinvocationPolicy, are not a difference)."""
    stored = kube.api.sanitize_for_serialization(current).get("webhooks") or []
    if len(stored) != len(wanted["webhooks"]):
        return False

    def covers(have: Any, want: Any) -> bool:
        if isinstance(want, dict):
            return isinstance(have, dict) and all(covers(have.get(k), v) for k, v in want.items())
        return bool(have == want)

    return all(covers(h, w) for h, w in zip(stored, wanted["webhooks"], strict=True))
