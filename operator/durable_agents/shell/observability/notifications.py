"""The notifier: tells a policy's ``spec.notifications`` targets that a run waits, ended or is stuck
(what is due: :mod:`durable_agents.core.notifications`; one attempt: :mod:`.notify_http`).

Off the commit path. It is one more subscriber of the manager's AgentRun list-and-watch: a watch
event only stores a slim copy of a run that is due a notice and wakes the pass, on the event loop,
never awaiting anything. The pass (on each wake, at most every ``interval`` seconds when nothing
wakes it) starts one task per delivery not yet done, for the runs whose shard this replica holds in
its region; the run worker never waits for it and nothing it does delays a commit.

At least once. A delivery is retried with exponential backoff and jitter (the randomness handed to
the core) until it is delivered or ``give_up_after`` has passed: then a Warning Event
``NotificationAbandoned`` on the run. A target outside the policy's
``spec.destinations.notifications`` is never sent to (the second line behind admission): a Warning
Event ``NotificationRefused``. Each done delivery (delivered, refused, abandoned) is recorded in the
run's annotation ``durable-agents.io/notified``, stamped with the operator's key (a record it did
not write is ignored: nobody silences a run's notifications by writing one). It is a merge patch
of the run's metadata, never its status, written once the delivery is done and the run has ended
or not changed for ``record_after`` seconds (a parked run, which the worker does not commit: a
write while someone acts on the notice would make the worker's commit conflict), so a restarted
operator sends what was missed and not what was sent. A crash between a delivery and its record
sends it again, with the same event ID: receivers deduplicate by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION, AgentPolicySpec
from durable_agents.core import notifications as core
from durable_agents.core.destinations import allowlists_for, of_policy, refusal
from durable_agents.core.entropy import Entropy
from durable_agents.core.regions import owning_region_of
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube, ObjectKey
from durable_agents.shell.ground.lifecycle import Background
from durable_agents.shell.ground.packed import Packed
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.observability.events import EventRecorder
from durable_agents.shell.observability.notify_http import (
    ABANDONED,
    DELIVERIES,
    REFUSED,
    WITHDRAWN,
    attempt,
)

log = logging.getLogger(__name__)

_APPROVAL_KEEP = ("requestId", "digest", "step", "effect", "tier", "expiresAt", "allowedDecisions")


@dataclass(frozen=True)
class NotifyConfig:
    interval: float = 5.0  # seconds between passes when no watch event wakes one
    timeout: float = 10.0  # seconds one attempt may take, answer included
    backoff: float = 1.0  # seconds before the second attempt (doubled each time, jittered)
    backoff_cap: float = 60.0
    give_up_after: float = 900.0  # seconds after the first attempt: then abandoned, with an Event
    # A live run's record is written once it has not changed for this long: a person or a system
    # acting on a notice at once (an answer, an approval) makes the worker commit then, and a
    # metadata write at that moment would make its commit conflict (409) and read again. A
    # restart within this time sends again (the same IDs). An ended run's is written at once.
    record_after: float = 10.0
    concurrency: int = 16  # attempts in flight at once


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the notifier keeps of a run: enough to derive its notices, its policy and its region
    (never arguments, questions or the model's words)."""
    meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    raw_checkpoint = status.get("checkpoint")
    checkpoint: Mapping[str, Any] = raw_checkpoint if isinstance(raw_checkpoint, Mapping) else {}
    kept_status: dict[str, Any] = {k: status.get(k) for k in ("state", "stateSince", "runId", "ownership")}
    conditions = status.get("conditions") or []
    kept_status["conditions"] = [c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Stuck"]
    outcome = status.get("outcome")
    kept_status["outcome"] = {"reason": outcome.get("reason")} if isinstance(outcome, Mapping) else None
    request = status.get("approvalRequest")
    if isinstance(request, Mapping):
        kept: dict[str, Any] = {k: request.get(k) for k in _APPROVAL_KEEP if k in request}
        proposal = request.get("proposal")
        if isinstance(proposal, Mapping):
            kept["proposal"] = {"tool": proposal.get("tool")}
        kept_status["approvalRequest"] = kept
    pending = checkpoint.get("pendingInput")
    kept_status["checkpoint"] = {
        "policy": checkpoint.get("policy"),
        "pendingInput": {k: pending.get(k) for k in ("requestId", "key", "expiresAt")}
        if isinstance(pending, Mapping)
        else None,
    }
    annotations = meta.get("annotations") or {}
    return {
        "metadata": {
            **{k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion")},
            "annotations": {core.NOTIFIED_ANNOTATION: annotations.get(core.NOTIFIED_ANNOTATION)},
        },
        "spec": {k: spec.get(k) for k in ("region", "policyRef")},
        "status": kept_status,
    }


class Notifier(Background):
    def __init__(
        self,
        kube: Kube,
        policies: PolicyCache,
        *,
        holds: Callable[[ObjectKey], bool],  # whether this replica holds the run's shard
        region: str,
        keyring: Keyring,
        events: EventRecorder,
        config: NotifyConfig | None = None,
        entropy: Entropy = os.urandom,
    ) -> None:
        self.kube, self.policies = kube, policies
        self.holds, self.region, self.keyring, self.events = holds, region, keyring, events
        self.config = config or NotifyConfig()
        self.entropy = entropy
        self.runs: dict[ObjectKey, Packed] = {}  # slim copies of runs due a notice, packed
        self.done: dict[ObjectKey, set[str]] = {}  # delivery keys done here, per run
        self.inflight: dict[str, asyncio.Task[None]] = {}
        # Runs whose every due delivery is recorded, at (resourceVersion, policy, its version): a
        # pass skips them until one changes (what is due only shrinks with time: expiries).
        self.settled: dict[ObjectKey, tuple[Any, ...]] = {}
        self.changed: dict[ObjectKey, float] = {}  # when each run's resourceVersion last changed
        # The runs the next pass looks at: each changed one, each not settled yet (a delivery in
        # flight, a record not written, a shard not held), and every run once the policies
        # changed. A settled or ungoverned run costs nothing until its next watch event.
        self.due: set[ObjectKey] = set()
        # Runs a notification policy governs that were due but not this replica's at their last look
        # (its shard not held, or another region's): until the run, the policies or the shard
        # change, a look would say so again, so their packed copy is not decoded for it.
        self.elsewhere: set[ObjectKey] = set()
        self._policies_seen: dict[ObjectKey, AgentPolicySpec] | None = None
        self.looked = 0  # runs looked at by passes so far (a parked run, after its first: none)
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self._session: aiohttp.ClientSession | None = None

    # --- intake (watch events, on the event loop: store and wake, nothing else) ------------------

    def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self.elsewhere.discard(key)
        if event_type == "DELETED" or not core.notices_for(body, datetime.now(UTC)):
            self.runs.pop(key, None)
            self.done.pop(key, None)
            self.settled.pop(key, None)
            self.due.discard(key)
            self.changed.pop(key, None)
            return
        before = self.runs.get(key)
        if before is None or before.version != meta.get("resourceVersion"):
            self.changed[key] = time.monotonic()
        self.runs[key] = Packed(slim(body))
        self.due.add(key)
        self._wake.set()

    # --- the pass ---------------------------------------------------------------------------------

    async def run(self) -> None:
        self._session = aiohttp.ClientSession()
        try:
            while True:
                with contextlib.suppress(TimeoutError):  # woken, or the interval passed
                    await asyncio.wait_for(self._wake.wait(), self.config.interval)
                self._wake.clear()
                try:
                    await self.pass_once()
                except asyncio.CancelledError:
                    raise
                except Exception:  # one bad pass must not end notifications: the next one tries again
                    log.exception("notification pass failed")
        finally:
            for task in list(self.inflight.values()):
                task.cancel()
            await asyncio.gather(*self.inflight.values(), return_exceptions=True)
            await self._session.close()
            self._session = None

    def _policy(self, body: Mapping[str, Any]) -> tuple[ObjectKey, AgentPolicySpec] | None:
        found = self.policies.governing_key(body)
        policy = self.policies.get(found) if found is not None else None
        if found is None or policy is None or not policy.notifications:
            return None
        return found, policy

    async def pass_once(self) -> None:
        now = datetime.now(UTC)
        if self._policies_seen != self.policies.policies:  # which policy governs, or what it asks
            self._policies_seen = dict(self.policies.policies)
            self.due.update(self.runs)
            self.elsewhere.clear()
        due, self.due = self.due, set()
        for key in due:
            kept = self.runs.get(key)
            if kept is None:
                continue
            if key in self.elsewhere and not self.holds(key):
                self.looked += 1  # as a look would find it: governed, not settled, not ours
                self.due.add(key)
                continue
            self.elsewhere.discard(key)
            if not await self._look(key, kept.body(), now):
                self.due.add(key)

    async def _look(self, key: ObjectKey, body: dict[str, Any], now: datetime) -> bool:
        """Start what the run is due; True when nothing is left to do for it as it is now (no
        notification policy governs it, or every due delivery is recorded)."""
        self.looked += 1
        governing = self._policy(body)
        if governing is None:
            return True
        found, policy = governing
        meta = body.get("metadata") or {}
        marker = (meta.get("resourceVersion"), found, policy.version)
        if self.settled.get(key) == marker:
            return True  # checked before the (HMAC) checks below
        if not self.holds(key) or owning_region_of(body, self.keyring) != self.region:
            self.elsewhere.add(key)
            return False  # looked at again: this replica may hold its shard later
        uid = str(meta.get("uid") or "")
        due = core.deliveries(core.notices_for(body, now), policy.notifications or [])
        seen = core.recorded(meta.get("annotations"), self.keyring, uid)
        done = self.done.setdefault(key, set())
        for delivery in due:
            if delivery.key not in seen | done and delivery.key not in self.inflight:
                task = asyncio.create_task(self._deliver(key, body, found, delivery))
                self.inflight[delivery.key] = task
        if (done & {d.key for d in due}) - seen and self._quiet(key, body):
            seen = await self._record(key, body, core.record(due, seen | done, self.keyring, uid))
        if {d.key for d in due} <= seen:
            self.settled[key] = marker
            return True
        return False

    def _quiet(self, key: ObjectKey, body: Mapping[str, Any]) -> bool:
        """Whether the run's record may be written now: it ended, or has not changed for a while."""
        if str((body.get("status") or {}).get("state")) in core.ENDED_STATES:
            return True
        return time.monotonic() - self.changed.get(key, 0.0) >= self.config.record_after

    # --- one delivery -----------------------------------------------------------------------------

    def _refusal(self, found: ObjectKey, delivery: core.Delivery) -> tuple[str, str] | None:
        """Why not to send now under the run's policy as cached now: (``refused``, why) when the
        target is outside the allowlist, (``withdrawn``, why) when the policy or the target is gone;
        None: send."""
        kind = "ClusterAgentPolicy" if found[0] == "" else "AgentPolicy"
        source = f"{kind} {'/'.join(part for part in found if part)}"
        policy = self.policies.get(found)
        targets = (policy.notifications or []) if policy is not None else []
        index = next((i for i, target in enumerate(targets) if target == delivery.target), None)
        if policy is None or index is None:
            return WITHDRAWN, f"{source} no longer names target {delivery.endpoint}"
        lists = allowlists_for([of_policy(source, policy)], "notifications", "notifications")
        problem = refusal(delivery.target.url, lists, f"{source} spec.notifications[{index}].url")
        return (REFUSED, problem) if problem is not None else None

    async def _deliver(
        self, key: ObjectKey, body: dict[str, Any], found: ObjectKey, delivery: core.Delivery
    ) -> None:
        started, tries = time.monotonic(), 0
        try:
            while True:
                stop = self._refusal(found, delivery)
                if stop is not None:
                    outcome, why = stop
                    DELIVERIES.labels(outcome).inc()
                    log.warning("notification %s not sent: %s", delivery.notice.id, why)
                    if outcome == REFUSED:
                        await self._tell(body, "NotificationRefused", f"not sent: {why}")
                    break
                async with self._slots:
                    assert self._session is not None
                    tried = await attempt(self._session, delivery, self.config.timeout)
                tries += 1
                DELIVERIES.labels(tried.outcome).inc()
                if tried.delivered:
                    log.info(
                        "notification %s delivered to %s (attempt %d)",
                        delivery.notice.id,
                        delivery.endpoint,
                        tries,
                    )
                    break
                log.warning(
                    "notification %s: attempt %d failed: %s", delivery.notice.id, tries, tried.message
                )
                pause = core.backoff(tries, self.entropy, self.config.backoff, self.config.backoff_cap)
                if time.monotonic() - started + pause > self.config.give_up_after:
                    DELIVERIES.labels(ABANDONED).inc()
                    message = (
                        f"notification {delivery.notice.type} to {delivery.endpoint} abandoned after {tries} "
                        f"attempts in {time.monotonic() - started:.0f}s; the last: {tried.message}"
                    )
                    log.warning("%s", message)
                    await self._tell(body, "NotificationAbandoned", message)
                    break
                await asyncio.sleep(pause)
            if key in self.runs:  # still due something: the pass records it
                self.done.setdefault(key, set()).add(delivery.key)
                self.due.add(key)
                self._wake.set()
        finally:
            self.inflight.pop(delivery.key, None)

    async def _tell(self, body: dict[str, Any], reason: str, message: str) -> None:
        try:
            await self.events.record(body, reason, message, warning=True)
        except ApiException as err:  # an Event is a courtesy: never a reason to lose the delivery
            log.warning("could not record Event %s (%s %s)", reason, err.status, err.reason)

    async def _record(self, key: ObjectKey, body: dict[str, Any], value: str) -> frozenset[str]:
        """Merge-patch the run's record of done deliveries (metadata only: never the status the
        worker commits; no resourceVersion: the value is ours alone); the keys recorded now."""
        patch = {"metadata": {"annotations": {core.NOTIFIED_ANNOTATION: value}}}
        try:
            await self.kube.call(
                self.kube.merge_patch_namespaced_object, GROUP, VERSION, key[0], "agentruns", key[1], patch
            )
        except ApiException as err:
            if err.status != 404:  # gone: nothing to record; else the next pass tries again
                log.warning(
                    "could not record notifications of run %s/%s (%s %s)", *key, err.status, err.reason
                )
            return frozenset()
        finally:
            metrics.API_WRITES.labels("agentruns", "patch").inc()
        kept = self.runs.get(key)
        if kept is not None:  # until the watch says so: not written again on the next pass
            current = kept.body()
            current["metadata"]["annotations"][core.NOTIFIED_ANNOTATION] = value
            self.runs[key] = Packed(current)
        return frozenset(value.rpartition(core.STAMP_SEPARATOR)[0].split())
