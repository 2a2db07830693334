"""The worker's read-only view of the AgentPolicies, and the engine settings a run gets from them.

A run whose policy this process has not seen yet is decided only once it arrives, never without
it: a missing policy must not mean "no approval required".
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION, AgentPolicySpec
from durable_agents.core.engine import RunSnapshot, Settings
from durable_agents.shell.ground.kube import Kube, ObjectKey

log = logging.getLogger(__name__)


class PolicyCache:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.policies: dict[ObjectKey, AgentPolicySpec] = {}
        # Runs waiting for a policy this process has not seen, by the policy's key.
        self.awaiting: dict[ObjectKey, set[ObjectKey]] = {}

    def get(self, key: ObjectKey) -> AgentPolicySpec | None:
        return self.policies.get(key)

    def observe(self, event_type: str | None, body: dict[str, Any]) -> set[ObjectKey]:
        """A watch event for an AgentPolicy; returns the runs that waited for it."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.policies.pop(key, None)
            return set()
        try:
            self.policies[key] = AgentPolicySpec.model_validate(body.get("spec") or {})
        except ValueError:
            log.warning("ignoring invalid AgentPolicy %s/%s", *key)
            return set()
        waiting = self.awaiting.pop(key, set())
        log.info(
            "AgentPolicy %s/%s version %s known (%d run(s) waited for it)",
            *key,
            self.policies[key].version,
            len(waiting),
        )
        return waiting

    async def fetch(self, namespace: str, name: str) -> set[ObjectKey] | None:
        """Read a policy the watch has not delivered (yet): the runs that waited for it, or None
        if it does not exist or is invalid."""
        try:
            body = await self.kube.call(
                self.kube.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                "agentpolicies",
                name,
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        waiting = self.observe("ADDED", body)
        return waiting if (namespace, name) in self.policies else None

    def wait_for(self, policy: ObjectKey, run: ObjectKey) -> bool:
        """Note that ``run`` waits for ``policy``; True the first time (worth an Event)."""
        waiting = self.awaiting.setdefault(policy, set())
        first = run not in waiting
        waiting.add(run)
        return first

    def settings_for(self, run: RunSnapshot, base: Settings) -> Settings:
        """The engine settings of ``run``: the operator's ``base`` with its policy's rules."""
        ref = run.spec.policy_ref
        if ref is None:
            return base
        policy = self.policies.get((run.namespace, ref.name))
        if policy is None:
            return replace(base, policy_name=ref.name)
        return replace(
            base,
            wait_expiries=policy.wait_expiries,
            policy_name=ref.name,
            policy_version=policy.version,
            tiers={**base.tiers, **policy.tiers},
            policy=policy,
        )
