"""Stuck detection: a periodic look at the runs this replica owns (:mod:`durable_agents.core.stuck`).

Every ``interval`` seconds (``DURABLE_AGENTS_STUCK_CHECK_SECONDS``) each run whose shard this
replica holds, in its region, is judged from what is already in memory: the run as the reflector
last delivered it (a slim copy: no checkpoint body, no history), the process's AgentPolicy cache and
the ActionRecords the watch reports with an unknown outcome. The API is read only for runs that
need it: a policy the cache does not have (is it really gone?) and, for a run waiting for an
approval, the RBAC objects (who holds the approver verb? under a quorum: how many people?), each
cached for a few intervals. A parked run that waits for something with an expiry costs nothing:
once judged (and its condition as judged), it is not judged again until it, the outcomes of its
actions or the policies change (:func:`~durable_agents.core.stuck.judged_for_good`).

When the verdict differs from the run's ``Stuck`` condition, the run is read, judged again, and
its status replaced with the condition brought up to date (compare-and-swap on the resourceVersion
read: a 409 only means the next pass tries again). A run newly found stuck gets a Warning Event
(reason ``Stuck``) and counts in ``durable_agents_stuck_detections_total{reason}``; the gauge
``durable_agents_stuck_runs{reason}`` counts the stuck runs this replica owns. Only this check
sets or clears the condition (the worker's commits carry it over: ``CARRIED_CONDITIONS``).

An eligible run (pending, ready, resume_validation, cancel_requested) is ``NotAdvancing`` when its
``stateVersion`` has not changed, as this replica's watch saw it, for its state's bound
(``DURABLE_AGENTS_STUCK_<STATE>_AFTER``). The runs this replica sees but does not own are judged
too, for the causes that leave them with no live owner (:mod:`.stuck_unowned` says who writes).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import Counter, Gauge

from durable_agents.api.v1alpha1 import (
    GROUP,
    VERSION,
    ActionState,
    AgentPolicySpec,
    AgentRunSpec,
    AgentRunStatus,
)
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core import stuck as core
from durable_agents.core import stuck_unowned as unowned
from durable_agents.core.outcome_stamps import believed_status
from durable_agents.core.regions import owning_region_of
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube, ObjectKey
from durable_agents.shell.ground.lifecycle import Background
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.observability.events import EventRecorder
from durable_agents.shell.runs.stuck_unowned import Cached, LeaseView, set_gauge
from durable_agents.shell.runs.stuck_view import Kept, parsed

log = logging.getLogger(__name__)

STUCK_RUNS = Gauge(
    "durable_agents_stuck_runs",
    "Runs this replica owns that no valid next event can reach, by what would unstick them",
    ["reason"],
)
STUCK_DETECTIONS = Counter(
    "durable_agents_stuck_detections_total", "Runs newly found stuck, by reason", ["reason"]
)
for _reason in core.REASONS:  # the series exist (at 0) on a live operator
    STUCK_RUNS.labels(_reason).set(0)
    STUCK_DETECTIONS.labels(_reason)
for _reason in unowned.REASONS:
    STUCK_DETECTIONS.labels(_reason)

TERMINAL = frozenset(s.value for s in RunState if s.terminal)
TURN_EVERY = 500  # runs looked at between two turns given to the event loop
UNKNOWN = ActionState.OUTCOME_UNKNOWN.value


@dataclass(frozen=True)
class StuckConfig:
    interval: float = 10.0  # seconds between passes
    threshold: float = 86400.0  # seconds a wait without expiry may last before it is stuck
    bounds: tuple[tuple[str, float], ...] = ()  # per eligible state: seconds unadvanced (else 10 min)
    unowned_after: float = 600.0  # seconds a run nobody alive owns stays unadvanced before it is stuck
    unanswered_after: float = 600.0  # seconds an outcome may stay unknown, its system not answering
    lease_namespace: str | None = None  # where the Leases are; None: runs not owned are not judged

    @property
    def state_bounds(self) -> dict[RunState, timedelta]:
        bounds = dict(core.DEFAULT_BOUNDS)
        bounds.update({RunState(state): timedelta(seconds=seconds) for state, seconds in self.bounds})
        return bounds

    @property
    def cache_seconds(self) -> float:
        """How long a read of RBAC objects or of a missing policy is reused: a few passes."""
        return 3 * self.interval


class StuckCheck(Background):
    def __init__(
        self,
        kube: Kube,
        *,
        holds: Callable[[ObjectKey], bool],  # whether this replica holds the run's shard
        region: str,
        keyring: Keyring | None,
        policies: PolicyCache,
        events: EventRecorder,
        config: StuckConfig | None = None,
    ) -> None:
        self.kube = kube
        self.holds, self.region, self.keyring = holds, region, keyring
        self.policies, self.events = policies, events
        self.config = config or StuckConfig()
        self.bounds = self.config.state_bounds
        self.runs: dict[ObjectKey, Kept] = {}  # slim copies, packed: non-terminal, or marked Stuck
        # Parsed runs being judged, with the resourceVersion parsed: re-parsed only when the run
        # changed; dropped once the run is judged for good (a parked run keeps its packed copy alone).
        self._parsed: dict[ObjectKey, tuple[str | None, tuple[AgentRunSpec, AgentRunStatus] | None]] = {}
        self.unknown: dict[ObjectKey, dict[str, core.UnknownAction]] = {}  # per run: unknown outcomes
        self.versions: dict[ObjectKey, tuple[int, datetime]] = {}  # stateVersion, first seen at
        # Runs judged for good (core.judged_for_good), condition written: (resourceVersion, reason).
        self.settled: dict[ObjectKey, tuple[str | None, str | None]] = {}
        self._policies_seen: dict[ObjectKey, AgentPolicySpec] | None = None
        self.judged = 0  # verdicts derived by passes so far (a parked run with an expiry: once)
        where = self.config.lease_namespace
        self.leases = LeaseView(kube, where) if where is not None else None
        # The series exist (at 0) on a live operator, for its own region: the alert and the
        # dashboard have something to read before anything is stuck.
        self._unowned_series = set_gauge({(region, reason): 0 for reason in unowned.REASONS}, set())
        self._rbac = Cached(self.config.cache_seconds)
        self._parents = Cached(self.config.cache_seconds)
        self._rbac_refused = False
        self.passes = 0

    # --- intake (watch events, on the event loop) ----------------------------------------------

    def observe_run(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        status = body.get("status") or {}
        marked = any(
            c.get("type") == core.STUCK and c.get("status") == "True" for c in status.get("conditions") or []
        )
        self.settled.pop(key, None)
        if event_type == "DELETED" or (status.get("state") in TERMINAL and not marked):
            self.runs.pop(key, None)
            self._parsed.pop(key, None)
            self.versions.pop(key, None)
            if event_type == "DELETED":
                self.unknown.pop(key, None)
            return
        self.runs[key] = Kept(body, self.keyring)
        raw = status.get("stateVersion")
        version = raw if isinstance(raw, int) else 0
        if key not in self.versions or self.versions[key][0] != version:  # it advanced (or is new)
            self.versions[key] = (version, datetime.now(UTC))
        self._parsed.pop(key, None)

    def observe_action(self, event_type: str | None, body: dict[str, Any]) -> None:
        """An ActionRecord watch event: its run's unknown outcomes (the ledger's own words)."""
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        run = (spec.get("runRef") or {}).get("name")
        if not run:
            return
        key, name = (meta.get("namespace", ""), run), meta.get("name", "")
        self.settled.pop(key, None)  # its unknown outcomes may change the verdict
        # As the operator wrote it: a settled state without a valid outcome stamp is unknown.
        status = believed_status(body, self.keyring, datetime.now(UTC))
        actions = self.unknown.get(key, {})
        if event_type != "DELETED" and status.state.value == UNKNOWN:
            known = actions.get(name)
            since = known.since if known is not None else datetime.now(UTC)
            actions[name] = core.UnknownAction(name, status.reason, since)
            self.unknown[key] = actions
        elif actions.pop(name, None) is not None and not actions:
            del self.unknown[key]

    # --- the periodic pass ---------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval)
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the API server away for a moment: the next pass tries again
                log.exception("stuck check pass failed")

    def _owned(self, key: ObjectKey, kept: Kept) -> bool:
        return self.holds(key) and kept.region == self.region

    async def check_once(self) -> dict[str, int]:
        """One pass over the runs this replica owns: the gauge, and the conditions that changed."""
        now = datetime.now(UTC)
        counts = dict.fromkeys(core.REASONS, 0)
        others: list[ObjectKey] = []
        if self._policies_seen != self.policies.policies:  # a policy gone (or back) may change verdicts
            self._policies_seen = dict(self.policies.policies)
            self.settled.clear()
        for looked, key in enumerate(list(self.runs), 1):
            if looked % TURN_EVERY == 0:  # a pass over 100,000 runs: the loop's other work goes on
                await asyncio.sleep(0)
            kept = self.runs.get(key)  # as of now: the watch may have delivered during an await
            if kept is None:
                continue
            if not self._owned(key, kept):
                others.append(key)
                self._parsed.pop(key, None)  # owned no longer (or not yet): parsed only if judged
                continue
            version = kept.version
            settled = self.settled.get(key)
            if settled is not None and settled[0] == version:
                if settled[1] is not None:
                    counts[settled[1]] += 1
                continue
            seen = self._parse(key, kept)
            if seen is None:
                continue
            spec, status = seen
            try:  # one run's failed read or write waits for the next pass; the others go on
                verdict = await self.verdict(key, spec, status, now)
                if verdict is not None:
                    counts[verdict.reason] += 1
                if core.conditions_with(status.conditions, verdict, now, status.observed_generation):
                    await self._update(key, now)
                elif core.judged_for_good(spec, status, self.bounds) and not self.unknown.get(key):
                    self.settled[key] = (version, verdict.reason if verdict is not None else None)
                    self._parsed.pop(key, None)  # not judged again until it changes: parsed again then
            except ApiException as err:
                log.warning(
                    "stuck check of run %s/%s failed (%s %s); next pass", *key, err.status, err.reason
                )
        for reason, count in counts.items():
            STUCK_RUNS.labels(reason).set(count)
        await self._check_unowned(others, now)
        self.passes += 1
        return counts

    async def _check_unowned(self, keys: list[ObjectKey], now: datetime) -> dict[tuple[str, str], int]:
        """The runs this replica sees but does not own: stuck when nobody alive owns them."""
        counts: dict[tuple[str, str], int] = {}
        if self.leases is None:
            return counts
        after = timedelta(seconds=self.config.unowned_after)
        keys = [k for k in keys if k in self.versions and now - self.versions[k][1] >= after]
        if keys:  # only runs past the unowned bound cost a list (at most one per few passes)
            await self.leases.refresh(now, self.config.cache_seconds)
        for key in keys:
            kept = self.runs.get(key)
            if kept is None:
                continue
            # From the index alone (its region, its first sight at this stateVersion): a run a live
            # replica owns is neither decoded nor parsed, nor kept parsed (another replica's runs).
            verdict = self.unowned_verdict(key, kept.region, now)
            if verdict is None:
                continue  # a live replica owns it: its own check judges (and clears) it
            seen = self._parse(key, kept)
            if seen is None or seen[1].state.terminal:
                continue
            region = kept.region
            counts[(region, verdict.reason)] = counts.get((region, verdict.reason), 0) + 1
            if core.conditions_with(seen[1].conditions, verdict, now, seen[1].observed_generation):
                try:
                    await self._update(key, now, unowned=True)
                except ApiException as err:
                    log.warning("stuck check of run %s/%s failed (%s %s)", *key, err.status, err.reason)
        self._unowned_series = set_gauge(counts, self._unowned_series)
        return counts

    def unowned_verdict(self, key: ObjectKey, owner: str, now: datetime) -> core.Stuck | None:
        """The verdict on a run of region ``owner`` (:func:`owning_region_of`) nobody here owns."""
        assert self.leases is not None
        assert self.config.lease_namespace is not None
        region = self.leases.region(owner, *key)
        since = self.versions.get(key)
        facts = unowned.UnownedFacts(
            now=now,
            lease_namespace=self.config.lease_namespace,
            region=region,
            unchanged_since=since[1] if since is not None else None,
            after=timedelta(seconds=self.config.unowned_after),
        )
        return unowned.stuck_unowned(key[0], key[1], facts)

    def _parse(self, key: ObjectKey, kept: Kept) -> tuple[AgentRunSpec, AgentRunStatus] | None:
        """The run parsed, once per resourceVersion (a parse kept for an older one is never used)."""
        version = kept.version
        cached = self._parsed.get(key)
        if cached is None or cached[0] != version:
            cached = (version, parsed(kept.body()))
            self._parsed[key] = cached
        return cached[1]

    async def verdict(
        self, key: ObjectKey, spec: AgentRunSpec, status: AgentRunStatus, now: datetime
    ) -> core.Stuck | None:
        self.judged += 1
        facts = await self.facts(key, spec, status, now)
        return core.stuck(key[0], key[1], spec, status, facts)

    async def facts(
        self, key: ObjectKey, spec: AgentRunSpec, status: AgentRunStatus, now: datetime
    ) -> core.Facts:
        namespace, run = key
        policy: AgentPolicySpec | None = None
        present: bool | None = None
        if spec.policy_ref is not None and core.needs_policy(spec, status):
            policy = await self._policy(namespace, spec.policy_ref.name)
            present = policy is not None
        request = status.approval_request
        if request is not None and request.approver_verb and request.approver_resource:
            rule = core.ApproverRule(request.approver_verb, request.approver_resource)  # as requested
        elif policy is not None:
            rule = core.ApproverRule(policy.approvers.verb, policy.approvers.resource)
        else:
            rule = core.ApproverRule()
        rbac = await self._rbac_of(namespace) if core.needs_approver(status) else None
        held = None if rbac is None else core.approver_held(rule, namespace, run, group=GROUP, **rbac)
        holders = (
            core.approver_holders(rule, namespace, run, group=GROUP, **rbac)
            if rbac is not None and core.needs_quorum(status)
            else None
        )
        parent = spec.parent_ref
        present_parent = (
            await self._parent(namespace, parent.name, parent.uid)
            if parent is not None and status.state.waiting
            else None
        )
        return core.Facts(
            now=now,
            parent_present=present_parent,
            threshold=timedelta(seconds=self.config.threshold),
            bounds=self.bounds,
            unchanged_since=self.versions[key][1] if key in self.versions else None,
            unanswered_after=timedelta(seconds=self.config.unanswered_after),
            policy_present=present,
            approver=rule,
            approver_held=held,
            approver_holders=holders,
            unknown_actions=tuple(self.unknown.get(key, {}).values()),
        )

    async def _parent(self, namespace: str, name: str, uid: str) -> bool:
        """Whether the parent run (this name, this uid) is there: from the watch, else one read
        (kept a few passes; a parent that has ended is no longer watched here)."""
        watched = self.runs.get((namespace, name))
        if watched is not None and watched.uid == uid:
            return True
        hit, value = self._parents.get((namespace, name, uid))
        if hit:
            return bool(value)
        try:
            body = await self.kube.call(
                self.kube.get_namespaced_object, GROUP, VERSION, namespace, "agentruns", name
            )
        except ApiException as err:
            if err.status != 404:
                raise
            return bool(self._parents.put((namespace, name, uid), False))
        return bool(self._parents.put((namespace, name, uid), (body.get("metadata") or {}).get("uid") == uid))

    async def _policy(self, namespace: str, name: str) -> AgentPolicySpec | None:
        # The watch may not have delivered it yet: is it really gone? (a miss is believed a few passes)
        return await self.policies.read(namespace, name, absent_for=self.config.cache_seconds)

    async def _rbac_of(self, namespace: str) -> dict[str, list[Any]] | None:
        """The RBAC objects that say who holds a verb in ``namespace`` (cluster-wide and its own);
        None when they cannot be read (unknown: never called stuck on a guess)."""
        try:
            cluster_roles, cluster_bindings = await self._rbac_lists(None)
            roles, bindings = await self._rbac_lists(namespace)
        except ApiException as err:
            if not self._rbac_refused:  # once: the chart grants list on them; a narrower install may not
                log.warning("cannot read RBAC objects to find approvers (%s %s)", err.status, err.reason)
            self._rbac_refused = True
            return None
        return {
            "roles": roles,
            "cluster_roles": cluster_roles,
            "role_bindings": bindings,
            "cluster_role_bindings": cluster_bindings,
        }

    async def _rbac_lists(self, namespace: str | None) -> tuple[list[Any], list[Any]]:
        hit, value = self._rbac.get(namespace)
        if hit:
            return value  # type: ignore[no-any-return]
        rbac = client.RbacAuthorizationV1Api(self.kube.api)
        if namespace is None:
            calls = (rbac.list_cluster_role, rbac.list_cluster_role_binding)
            args: tuple[str, ...] = ()
        else:
            calls = (rbac.list_namespaced_role, rbac.list_namespaced_role_binding)
            args = (namespace,)
        lists = []
        for call in calls:
            response = await self.kube.call(call, *args, _preload_content=False)
            lists.append(json.loads(response.data).get("items") or [])
        return self._rbac.put(namespace, (lists[0], lists[1]))  # type: ignore[no-any-return]

    async def _update(self, key: ObjectKey, now: datetime, *, unowned: bool = False) -> None:
        """Read the run, judge it again and write its condition if it still differs (a run not
        owned: only a stuck verdict is written, never a clearing one)."""
        try:
            body = await self.kube.call(
                self.kube.get_namespaced_object, GROUP, VERSION, key[0], "agentruns", key[1]
            )
        except ApiException as err:
            if err.status == 404:
                self.observe_run("DELETED", {"metadata": {"namespace": key[0], "name": key[1]}})
                return
            raise
        seen = parsed(body)
        if seen is None:
            return
        spec, status = seen
        if unowned:
            assert self.leases is not None
            await self.leases.refresh(now)  # fresh before a write: its owner may be back
            verdict = self.unowned_verdict(key, owning_region_of(body, self.keyring), now)
            if verdict is None or status.state.terminal:
                return
        else:
            verdict = await self.verdict(key, spec, status, now)
        conditions = core.conditions_with(status.conditions, verdict, now, status.observed_generation)
        if conditions is None:
            self.observe_run("MODIFIED", body)  # our copy was behind: it says so already
            return
        prior = core.stuck_condition(status.conditions)
        wire = {**(body.get("status") or {}), "conditions": [c.wire() for c in conditions]}
        written = await self._replace_status(body, wire)
        if written is None:
            return
        self.observe_run("MODIFIED", written)
        if verdict is None:
            log.info("run %s/%s is no longer stuck", *key)
            return
        if prior is None or prior.status != "True" or prior.reason != verdict.reason:
            STUCK_DETECTIONS.labels(verdict.reason).inc()
            log.warning("run %s/%s is stuck (%s): %s", *key, verdict.reason, verdict.message)
            await self.events.record(written, "Stuck", verdict.message, warning=True)

    async def _replace_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any] | None:
        """A status update with the resourceVersion read; None on 409 (next pass) or 404."""
        meta = body["metadata"]
        wanted = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AgentRun",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "resourceVersion": meta["resourceVersion"],
            },
            "spec": body["spec"],
            "status": status,
        }
        try:
            out: dict[str, Any] = await self.kube.call(
                self.kube.replace_namespaced_status,
                GROUP,
                VERSION,
                meta["namespace"],
                "agentruns",
                meta["name"],
                wanted,
            )
        except ApiException as err:
            if err.status == 409:  # counted as the worker's are: writes less conflicts = writes made
                metrics.COMMIT_CONFLICTS.labels("agentruns").inc()
            if err.status in (404, 409):
                return None
            raise
        finally:
            metrics.API_WRITES.labels("agentruns/status", "update").inc()
        return out
