"""The process's one read-only view of the AgentPolicies, and the engine settings a run gets from them.

Held by the manager, fed by the AgentPolicy watch (controllers' ``agentpolicy``) and read by every
part that needs a policy: the run worker, the dispatcher, retention, the stuck check and the
admission webhook. A run whose policy this process has not seen yet is decided only once it
arrives, never without it: a missing policy must not mean "no approval required". Only the
watch, and the worker's own read of a policy it waits for, release the runs that waited
(:meth:`PolicyCache.observe`, :meth:`PolicyCache.fetch`); other readers (:meth:`PolicyCache.read`)
leave them to those.

The second line of a policy's integrity (:mod:`durable_agents.core.policy_integrity`): a policy
whose version this process saw with other content, or whose own ``status.versions`` lists it with
other content, is not used (:attr:`PolicyCache.conflicts`): its runs wait until a new version
arrives. A policy deleted with the force-delete mark is remembered (:attr:`PolicyCache.forced`):
its runs are quarantined.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION, AgentPolicySpec
from durable_agents.core.engine import RunSnapshot, Settings
from durable_agents.core.policy_integrity import (
    force_reason,
    force_unproven,
    history_of,
    identity_of,
    runs_using,
    version_conflict,
)
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground.kube import Kube, ObjectKey

log = logging.getLogger(__name__)


class PolicyCache:
    def __init__(self, kube: Kube, keyring: Keyring | None = None) -> None:
        self.kube = kube
        self.keyring = keyring  # verifies a force-delete mark's stamp
        self.policies: dict[ObjectKey, AgentPolicySpec] = {}
        # Runs waiting for a policy this process has not seen, by the policy's key.
        self.awaiting: dict[ObjectKey, set[ObjectKey]] = {}
        # Policies a read found missing (or invalid), and until when (monotonic) that answer is reused.
        self.absent: dict[ObjectKey, float] = {}
        # Parts that want every policy event as it comes (the policy status writer).
        self.watchers: list[Callable[[str | None, dict[str, Any]], None]] = []
        # Every (version -> content digest) this process saw per policy name, across deletions.
        self.seen: dict[ObjectKey, dict[str, str]] = {}
        # Policies not used because they reuse a version with other content: why.
        self.conflicts: dict[ObjectKey, str] = {}
        # Policies deleted with the force-delete mark: the on-call's reason.
        self.forced: dict[ObjectKey, str] = {}

    async def users(self, namespace: str, name: str) -> list[str]:
        """The non-terminal runs that use the policy, read from the API server (sorted names)."""
        listed = await self.kube.call(
            self.kube.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "agentruns"
        )
        return runs_using(listed.get("items") or [], name)

    def seen_versions(self, key: ObjectKey) -> dict[str, str]:
        return dict(self.seen.get(key, {}))

    def conflict(self, key: ObjectKey, body: dict[str, Any]) -> str | None:
        """Why this policy object must not be used (a version seen with other content), or None;
        a usable one's version is remembered."""
        identity = identity_of(body)
        if identity is None:
            return None
        seen = self.seen.setdefault(key, {})
        why = version_conflict(key[1], identity, seen, history_of(body))
        if why is None:
            seen[identity.version] = identity.digest
        return why

    def get(self, key: ObjectKey) -> AgentPolicySpec | None:
        return self.policies.get(key)

    def observe(self, event_type: str | None, body: dict[str, Any]) -> set[ObjectKey]:
        """A watch event for an AgentPolicy; returns the runs that waited for it."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        for watcher in self.watchers:
            watcher(event_type, body)
        if event_type == "DELETED":
            self.policies.pop(key, None)
            self.conflicts.pop(key, None)
            forced = force_reason(body)
            log.info("AgentPolicy %s/%s deleted%s", *key, f" (force-deleted: {forced})" if forced else "")
            unproven = force_unproven(self.keyring, body) if forced is not None else None
            if unproven is not None:  # marked by hand (webhook off): its runs wait, not quarantined
                log.warning("AgentPolicy %s/%s: force-delete mark not honoured: %s", *key, unproven.message)
                return set()
            if forced is not None:
                self.forced[key] = forced
                return self.awaiting.pop(key, set())  # to be quarantined
            return set()
        self.absent.pop(key, None)
        self.forced.pop(key, None)
        try:
            spec = AgentPolicySpec.model_validate(body.get("spec") or {})
        except ValueError:
            log.warning("ignoring invalid AgentPolicy %s/%s", *key)
            return set()
        conflict = self.conflict(key, body)
        if conflict is not None:
            self.policies.pop(key, None)
            self.conflicts[key] = conflict
            log.warning("AgentPolicy %s/%s not used: %s", *key, conflict)
            return set()
        self.conflicts.pop(key, None)
        self.policies[key] = spec
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

    async def read(
        self, namespace: str, name: str, *, fresh: bool = False, absent_for: float = 0.0
    ) -> AgentPolicySpec | None:
        """The policy, from the cache or (not cached, or ``fresh``) read from the API server;
        None if it does not exist or is invalid. What is read is not cached (a read can be older
        than a deletion the watch delivered meanwhile: the watch's events are the cache's truth);
        a missing one is believed missing for ``absent_for`` seconds. Releases no waiting run:
        the policy's watch event does."""
        key = (namespace, name)
        if not fresh:
            known = self.policies.get(key)
            if known is not None:
                return known
            if self.absent.get(key, 0.0) > time.monotonic():
                return None
        try:
            body = await self.kube.call(
                self.kube.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                "agentpolicies",
                name,
            )
            policy: AgentPolicySpec | None = AgentPolicySpec.model_validate(body.get("spec") or {})
            if self.conflict(key, body) is not None:
                policy = None  # a version reused with other content is as good as none
        except ApiException as err:
            if err.status != 404:
                raise
            policy = None
        except ValueError:
            policy = None  # an invalid policy is as good as none: nothing runs under it
        if policy is None:
            if absent_for > 0:
                self.absent[key] = time.monotonic() + absent_for
            return None
        self.absent.pop(key, None)
        return policy

    def wait_for(self, policy: ObjectKey, run: ObjectKey) -> bool:
        """Note that ``run`` waits for ``policy``; True the first time (worth an Event)."""
        waiting = self.awaiting.setdefault(policy, set())
        first = run not in waiting
        waiting.add(run)
        return first

    def settings_for(self, run: RunSnapshot, base: Settings, read: AgentPolicySpec | None = None) -> Settings:
        """The engine settings of ``run``: the operator's ``base`` with its policy's rules (``read``
        when the caller has just read it, else the cached one)."""
        ref = run.spec.policy_ref
        if ref is None:
            return base
        policy = read or self.policies.get((run.namespace, ref.name))
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
