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
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION, AgentPolicySpec, AgentRunSpec, PolicyReference
from durable_agents.core.engine import RunSnapshot, Settings
from durable_agents.core.policy_identity import content_digest
from durable_agents.core.policy_integrity import (
    force_reason,
    force_unproven,
    history_of,
    identity_of,
    runs_using,
    version_conflict,
)
from durable_agents.core.policy_resolution import (
    AGENT_POLICY,
    CLUSTER_AGENT_POLICY,
    Resolution,
    Resolved,
    resolve_policy,
)
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground.kube import Kube, ObjectKey

log = logging.getLogger(__name__)


CLUSTER: Final = ""
"""The namespace part of a ClusterAgentPolicy's key: no namespace is named ""."""


def _plural(namespace: str) -> str:
    return "clusteragentpolicies" if namespace == CLUSTER else "agentpolicies"


def _recorded(checkpoint: Any, namespace: str) -> Resolved | None:
    """The policy a run's checkpoint recorded at acceptance (it governs the run from then on), if
    any. Read before the checkpoint's stamp is verified: the engine verifies it before acting."""
    recorded = checkpoint.get("policy") if isinstance(checkpoint, Mapping) else None
    if not isinstance(recorded, Mapping) or not isinstance(recorded.get("name"), str) or not recorded["name"]:
        return None
    kind = str(recorded.get("kind") or AGENT_POLICY)
    return Resolved(
        kind, recorded["name"], CLUSTER if kind == CLUSTER_AGENT_POLICY else namespace, "recorded"
    )


class PolicyCache:
    """AgentPolicies by (namespace, name) and ClusterAgentPolicies by ("", name)."""

    def __init__(self, kube: Kube, keyring: Keyring | None = None) -> None:
        self.kube = kube
        self.keyring = keyring  # verifies a force-delete mark's stamp
        self.policies: dict[ObjectKey, AgentPolicySpec] = {}
        self.digests: dict[ObjectKey, str] = {}  # content digests (core/policy_identity)
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
        """The non-terminal runs that use the policy, read from the API server (sorted names): the
        runs naming it and the runs it governs (as their namespace's default, or recorded)."""
        listed = await self.kube.call(
            self.kube.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "agentruns"
        )
        return runs_using(
            listed.get("items") or [], name, lambda run: self.governing_key(run) == (namespace, name)
        )

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
        if key[0] != CLUSTER:  # the status writer keeps AgentPolicies' status (not the cluster's)
            for watcher in self.watchers:
                watcher(event_type, body)
        kind = "ClusterAgentPolicy" if key[0] == CLUSTER else "AgentPolicy"
        # Runs that waited for their scope's policies to agree (two defaults, a mandatory one).
        blocked = self._release_scope(key[0])
        if event_type == "DELETED":
            self.policies.pop(key, None)
            self.digests.pop(key, None)
            self.conflicts.pop(key, None)
            forced = force_reason(body)
            log.info("%s %s/%s deleted%s", kind, *key, f" (force-deleted: {forced})" if forced else "")
            unproven = force_unproven(self.keyring, body) if forced is not None else None
            if unproven is not None:  # marked by hand (webhook off): its runs wait, not quarantined
                log.warning("%s %s/%s: force-delete mark not honoured: %s", kind, *key, unproven.message)
                return blocked
            if forced is not None:
                self.forced[key] = forced
                return self.awaiting.pop(key, set()) | blocked  # to be quarantined
            return blocked
        self.absent.pop(key, None)
        self.forced.pop(key, None)
        spec = body.get("spec") or {}
        try:
            parsed = AgentPolicySpec.model_validate(spec)
        except ValueError:
            log.warning("ignoring invalid %s %s/%s", kind, *key)
            self.policies.pop(key, None)
            return blocked
        conflict = self.conflict(key, body)
        if conflict is not None:
            self.policies.pop(key, None)
            self.conflicts[key] = conflict
            log.warning("%s %s/%s not used: %s", kind, *key, conflict)
            return blocked
        self.conflicts.pop(key, None)
        self.policies[key] = parsed
        self.digests[key] = content_digest(spec)
        waiting = self.awaiting.pop(key, set()) | blocked
        log.info(
            "%s %s/%s version %s known (%d run(s) waited for it)",
            kind,
            *key,
            self.policies[key].version,
            len(waiting),
        )
        return waiting

    def _release_scope(self, namespace: str) -> set[ObjectKey]:
        """The runs blocked on the policies of ``namespace`` (a cluster policy: of any)."""
        scopes = [
            key for key in self.awaiting if key[1] == "" and (namespace == CLUSTER or key[0] == namespace)
        ]
        released: set[ObjectKey] = set()
        for scope in scopes:
            released |= self.awaiting.pop(scope, set())
        return released

    async def _get(self, namespace: str, name: str) -> dict[str, Any]:
        if namespace == CLUSTER:
            return dict(
                await self.kube.call(
                    self.kube.custom.get_cluster_custom_object, GROUP, VERSION, _plural(namespace), name
                )
            )
        return dict(
            await self.kube.call(
                self.kube.get_namespaced_object, GROUP, VERSION, namespace, "agentpolicies", name
            )
        )

    def resolve(self, namespace: str, ref: PolicyReference | None) -> Resolution:
        """Which policy governs a run of ``namespace`` naming ``ref``, by the policies known here."""
        local = {name: spec for (ns, name), spec in self.policies.items() if ns == namespace}
        cluster = {name: spec for (ns, name), spec in self.policies.items() if ns == CLUSTER}
        return resolve_policy(namespace, ref, local, cluster)

    async def refresh_scope(self, namespace: str) -> None:
        """Read the AgentPolicies of ``namespace`` and the ClusterAgentPolicies from the API server
        into the cache: a run is judged ungoverned (or blocked) on a full list, not on a watch that
        may not have delivered everything yet. Releases no run."""
        for scope in (namespace, CLUSTER):
            if scope == CLUSTER:
                listed = await self.kube.call(
                    self.kube.custom.list_cluster_custom_object, GROUP, VERSION, _plural(scope)
                )
            else:
                listed = await self.kube.call(
                    self.kube.custom.list_namespaced_custom_object, GROUP, VERSION, scope, "agentpolicies"
                )
            seen = set()
            for body in listed.get("items") or []:
                name = str((body.get("metadata") or {}).get("name") or "")
                seen.add((scope, name))
                try:
                    self.policies[(scope, name)] = AgentPolicySpec.model_validate(body.get("spec") or {})
                    self.digests[(scope, name)] = content_digest(body.get("spec") or {})
                except ValueError:
                    self.policies.pop((scope, name), None)
            for key in [key for key in self.policies if key[0] == scope and key not in seen]:
                self.policies.pop(key, None)  # deleted: the list is newer than the cache
                self.digests.pop(key, None)

    async def fetch(self, namespace: str, name: str) -> set[ObjectKey] | None:
        """Read a policy the watch has not delivered (yet): the runs that waited for it, or None
        if it does not exist or is invalid."""
        try:
            body = await self._get(namespace, name)
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
            body = await self._get(namespace, name)
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

    def governing(self, run: RunSnapshot) -> Resolution:
        """The run's policy: the one its checkpoint recorded at acceptance, else as it resolves now."""
        recorded = _recorded(run.raw_checkpoint, run.namespace)
        return recorded or self.resolve(run.namespace, run.spec.policy_ref)

    def governing_key(self, body: Mapping[str, Any]) -> ObjectKey | None:
        """The cache key of the policy governing a run given as its raw object (None: none)."""
        namespace = str((body.get("metadata") or {}).get("namespace") or "")
        recorded = _recorded(((body.get("status") or {}).get("checkpoint")), namespace)
        if recorded is not None:
            return recorded.key
        raw = (body.get("spec") or {}).get("policyRef")
        try:
            ref = PolicyReference.model_validate(raw) if raw else None
        except ValueError:
            ref = None
        found = self.resolve(namespace, ref)
        return found.key if isinstance(found, Resolved) else None

    def governing_spec(
        self, namespace: str, spec: AgentRunSpec, status: Mapping[str, Any]
    ) -> AgentPolicySpec | None:
        """The cached policy of a run given as its spec and raw status (the webhook's view)."""
        found = _recorded(status.get("checkpoint"), namespace) or self.resolve(namespace, spec.policy_ref)
        return self.policies.get(found.key) if isinstance(found, Resolved) else None

    def settings_for(self, run: RunSnapshot, base: Settings, read: AgentPolicySpec | None = None) -> Settings:
        """The engine settings of ``run``: the operator's ``base`` with its policy's rules (``read``
        when the caller has just read it, else the cached one). A run no policy governs (or whose
        scope's policies contradict each other) may only read (``policy_required``)."""
        found = self.governing(run)
        if not isinstance(found, Resolved):
            return replace(base, policy_required=True)
        policy = read or self.policies.get(found.key)
        if policy is None:
            return replace(base, policy_name=found.name, policy_kind=found.kind)
        return replace(
            base,
            wait_expiries=policy.wait_expiries,
            policy_name=found.name,
            policy_kind=found.kind,
            policy_version=policy.version,
            policy_digest=self.digests.get(found.key),
            tiers={**base.tiers, **policy.tiers},
            policy=policy,
        )
