"""The policy status writer: each AgentPolicy's status (health for GitOps tools, its content
digest and version history, the counts of the runs it governs), as
:mod:`durable_agents.core.policy_status` decides it.

A runnable of the manager, fed by the one policy cache (every AgentPolicy event) and the one
AgentRun reflector (every run event: which policy governs the run, and how it counts). It keeps
the policies whose status may be out of date and writes them in paced passes (at most one pass
per ``interval``: a thousand runs moving at once make one write per policy, not a thousand),
only once the first run list has been delivered (counts from half a list are wrong), and only
what differs from the status there: its own write comes back as a policy event that decides
nothing new, so it never writes again for it (no write loop).

A write is a merge patch of ``status`` under the resourceVersion it was decided from; a conflict
(the policy moved meanwhile) is decided again on the next pass, from the event that moved it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.policy_status import (
    PolicyKey,
    counts_of,
    governing_policy,
    policy_status,
    run_bucket,
)
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube, ObjectKey
from durable_agents.shell.ground.lifecycle import Background

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


class PolicyStatusWriter(Background):
    def __init__(
        self,
        kube: Kube,
        synced: asyncio.Event,
        interval: float = 1.0,
        governs: Callable[[Mapping[str, Any]], PolicyKey | None] | None = None,
    ) -> None:
        # Which policy governs a run: the policy cache's resolution (named, default, recorded).
        self.governs = governs
        self.kube = kube
        self.synced = synced  # the AgentRun reflector's first list is delivered
        self.interval = interval
        self.policies: dict[PolicyKey, dict[str, Any]] = {}  # the latest body of each policy
        self.governed: dict[ObjectKey, tuple[PolicyKey, str]] = {}  # run -> (its policy, its bucket)
        # One (policy, bucket) value shared by every run it names: a run costs its entry above, not
        # a tuple and a copy of its policy's name of its own (100,000 parked runs, issue 38).
        self._shared: dict[tuple[PolicyKey, str], tuple[PolicyKey, str]] = {}
        self.counts: dict[PolicyKey, Counter[str]] = {}
        self.dirty: set[PolicyKey] = set()
        self.writes = 0  # status writes made (tests: an idle policy is not written again)
        self._wake = asyncio.Event()

    # --- the feeds (on the event loop, never awaiting) -------------------------------------

    def observe_policy(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.policies.pop(key, None)
            self.dirty.discard(key)
            for shared in [s for s in self._shared if s[0] == key]:
                del self._shared[shared]  # the runs it governs keep theirs: only sharing ends
            return
        self.policies[key] = body
        self._mark(key)

    def observe_run(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        before = self.governed.get(key)
        after: tuple[PolicyKey, str] | None = None
        if event_type != "DELETED":
            named = governing_policy(key[0], body.get("spec") or {})
            policy = self.governs(body) if self.governs is not None else named
            bucket = run_bucket(body.get("status") or {})
            if policy is not None and bucket is not None:
                after = self._shared.setdefault((policy, bucket), (policy, bucket))
        if before == after:
            return
        if before is not None:
            self.counts[before[0]][before[1]] -= 1
            self._mark(before[0])
        if after is None:
            self.governed.pop(key, None)
            return
        self.governed[key] = after
        self.counts.setdefault(after[0], Counter())[after[1]] += 1
        self._mark(after[0])

    def _mark(self, key: PolicyKey) -> None:
        self.dirty.add(key)
        self._wake.set()

    # --- the passes --------------------------------------------------------------------------

    async def run(self) -> None:
        await self.synced.wait()
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.write_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the API server away for a moment: the next pass tries again
                log.exception("policy status pass failed")
            await asyncio.sleep(self.interval)  # paced

    async def write_once(self) -> int:
        """One pass over the policies marked since the last: the statuses that changed, written."""
        keys, self.dirty = self.dirty, set()
        written = 0
        for key in sorted(keys):
            body = self.policies.get(key)
            if body is None:
                continue
            counts = counts_of(list((self.counts.get(key) or Counter()).elements()))
            wanted = policy_status(body, counts, datetime.now(UTC))
            if wanted is None:
                continue
            if await self._write(key, body, wanted):
                written += 1
        return written

    async def _write(self, key: PolicyKey, body: dict[str, Any], status: dict[str, Any]) -> bool:
        patch = {"metadata": {"resourceVersion": body["metadata"]["resourceVersion"]}, "status": status}
        try:
            out: dict[str, Any] = await self.kube.call(
                self.kube.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                key[0],
                "agentpolicies",
                key[1],
                patch,
                _content_type=MERGE_PATCH,
            )
        except ApiException as err:
            if err.status == 404:
                self.policies.pop(key, None)
                return False
            if err.status == 409:  # it moved: its event marks it again; decided from that
                metrics.COMMIT_CONFLICTS.labels("agentpolicies").inc()
            else:
                log.warning("AgentPolicy %s/%s status not written (%s %s)", *key, err.status, err.reason)
            self._mark(key)
            return False
        finally:
            metrics.API_WRITES.labels("agentpolicies/status", "patch").inc()
        self.writes += 1
        if (
            self.policies.get(key, {}).get("metadata", {}).get("resourceVersion")
            == body["metadata"]["resourceVersion"]
        ):
            self.policies[key] = out  # the watch brings it too; meanwhile, decide from what is stored
        return True
