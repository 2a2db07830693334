"""Per-run leases on ``coordination.k8s.io/v1`` Lease objects, natively in asyncio.

A Lease says which worker may advance a run right now; it never holds business state. Fields are
kept as client-go's leader election keeps them (holderIdentity, leaseDurationSeconds,
acquireTime, renewTime, leaseTransitions). A worker deletes its Lease when the run enters a wait
or ends, so a parked run costs no Lease at all; ``leaseTransitions`` of a new Lease continues
from the epoch recorded in the run's checkpoint, so lease epochs only ever grow.

Expiry is judged from ``renewTime + leaseDurationSeconds`` against the local clock. That alone
is not what keeps a run safe: the epoch (holder + transitions) is a fencing token written into
the run's checkpoint, and every commit is a compare-and-swap (see the worker).

The operator deletes or takes over only a Lease it made for that run: one named for the run,
labelled with its name and owned by its AgentRun (an ownerReference with the run's uid, which
also lets the garbage collector remove the Lease with the run). Anything else under that name
(:meth:`LeaseRecord.foreign_because`) is someone else's object: it is left alone and the run
waits, saying why (:func:`conflict_status`), until it is gone.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION, Condition, ConditionStatus
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.core.checkpoint import Fencing
from durable_agents.core.engine.children import label_value
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube

LEASE_CONFLICT = "LeaseConflict"


def lease_name(run_name: str) -> str:
    """``agentrun-<run>``; a run name near the 253-character limit is shortened with a hash (the
    cut end stripped of ``-``/``.``, so the result is still a DNS subdomain)."""
    name = f"agentrun-{run_name}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(run_name.encode()).hexdigest()[:12]
    return f"{name[:240].rstrip('-.')}-{digest}"


def run_label(run_name: str) -> str:
    """The value of :data:`RUN_LABEL` for a run (Leases, ActionRecords): its name, or a hashed
    form when the name does not fit a label value (more than 63 characters)."""
    return label_value(run_name)


def run_of_lease(meta: dict[str, Any]) -> str | None:
    """The name of the run a Lease's metadata says it is for: the AgentRun that owns it when its
    label matches that name (a long name is labelled hashed), else the label itself."""
    label = (meta.get("labels") or {}).get(RUN_LABEL)
    if not label:
        return None
    for ref in meta.get("ownerReferences") or ():
        name = ref.get("name") if isinstance(ref, dict) else None
        if ref.get("kind") == "AgentRun" and isinstance(name, str) and run_label(name) == label:
            return name
    return str(label)


@dataclass(frozen=True)
class LeaseRecord:
    namespace: str
    name: str
    holder: str
    duration_seconds: int
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int
    resource_version: str
    uid: str = ""
    run_label: str | None = None  # the value of RUN_LABEL, if any
    owner_uids: tuple[str, ...] = ()  # uids of the objects its ownerReferences name

    @classmethod
    def parse(cls, lease: Any) -> LeaseRecord:
        spec, meta = lease.spec, lease.metadata
        return cls(
            namespace=lease.metadata.namespace,
            name=lease.metadata.name,
            holder=spec.holder_identity or "",
            duration_seconds=int(spec.lease_duration_seconds or 0),
            acquire_time=spec.acquire_time,
            renew_time=spec.renew_time,
            transitions=int(spec.lease_transitions or 0),
            resource_version=meta.resource_version,
            uid=meta.uid or "",
            run_label=(meta.labels or {}).get(RUN_LABEL),
            owner_uids=tuple(ref.uid for ref in meta.owner_references or ()),
        )

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> LeaseRecord:
        meta, spec = body["metadata"], body.get("spec") or {}

        def when(key: str) -> datetime | None:
            value = spec.get(key)
            return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None

        return cls(
            namespace=meta["namespace"],
            name=meta["name"],
            holder=spec.get("holderIdentity") or "",
            duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=when("acquireTime"),
            renew_time=when("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=meta["resourceVersion"],
            uid=meta.get("uid") or "",
            run_label=(meta.get("labels") or {}).get(RUN_LABEL),
            owner_uids=tuple(ref.get("uid", "") for ref in meta.get("ownerReferences") or ()),
        )

    def foreign_because(self, run_name: str, run_uid: str) -> str | None:
        """Why this Lease is not one the operator made for the run (a short clause), or None."""
        if self.name != lease_name(run_name):
            return f"it is not named {lease_name(run_name)!r}"
        if run_uid not in self.owner_uids:
            if not self.owner_uids:
                return "it has no owner reference to the run"
            return f"its owner is another object (uid {', '.join(self.owner_uids)})"
        if self.run_label != run_label(run_name):
            return f"its label {RUN_LABEL} does not name the run"
        return None

    @property
    def released(self) -> bool:
        return not self.holder

    def expires_at(self) -> datetime:
        base = self.renew_time or self.acquire_time or datetime.fromtimestamp(0, UTC)
        return base + timedelta(seconds=self.duration_seconds)

    def expired(self, now: datetime) -> bool:
        return self.released or now >= self.expires_at()


@dataclass
class Hold:
    """A lease this worker holds. ``valid_until`` is on the local monotonic clock.

    ``busy`` serializes the writes to this Lease: a renewal still in flight when the run is
    released would otherwise move the resourceVersion under the delete (409), leaving the Lease
    behind with nobody to remove it.
    """

    record: LeaseRecord
    epoch: Fencing
    valid_until: float
    lost: bool = False
    busy: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)

    def valid(self, margin: float = 0.0) -> bool:
        return not self.lost and time.monotonic() + margin < self.valid_until


def _micro(t: datetime) -> str:
    # MicroTime: RFC 3339 with exactly six fractional digits, as client-go writes it.
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


MERGE_PATCH = "application/merge-patch+json"


def conflict_message(record: LeaseRecord, why: str) -> str:
    return (
        f"Lease {record.namespace}/{record.name} was not created by the operator for this run ({why}):"
        " it is never taken over or deleted, and the run does not advance until it is removed"
    )


def conflict_status(run: dict[str, Any], message: str, now: datetime) -> dict[str, Any] | None:
    """The run's status with a ``LeaseConflict`` condition saying why it does not advance, or None
    when it says so already. No transition: the next commit rebuilds the conditions without it."""
    status = dict(run.get("status") or {})
    conditions = list(status.get("conditions") or [])
    prior = next((c for c in conditions if c.get("type") == LEASE_CONFLICT), None)
    if prior is not None and prior.get("status") == ConditionStatus.TRUE and prior.get("message") == message:
        return None
    condition = Condition(
        type=LEASE_CONFLICT,
        status=ConditionStatus.TRUE,
        reason="ForeignLease",
        message=message,
        last_transition_time=now,
        observed_generation=(run.get("metadata") or {}).get("generation"),
    )
    status["conditions"] = [*(c for c in conditions if c is not prior), condition.wire()]
    return status


class RunLeases:
    def __init__(self, kube: Kube, identity: str, duration_seconds: int = 15) -> None:
        self.kube = kube
        self.identity = identity
        self.duration = duration_seconds

    @property
    def api(self) -> client.CoordinationV1Api:
        return self.kube.coordination

    async def get(self, namespace: str, run_name: str) -> LeaseRecord | None:
        try:
            lease = await self.kube.call(self.api.read_namespaced_lease, lease_name(run_name), namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return LeaseRecord.parse(lease)

    def _spec(self, transitions: int, now: datetime) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration,
            "acquireTime": _micro(now),
            "renewTime": _micro(now),
            "leaseTransitions": transitions,
        }

    async def _patch(self, rec: LeaseRecord, spec: dict[str, Any]) -> Any:
        # resourceVersion in a merge patch is a precondition: 409 if the Lease moved meanwhile.
        body = {"metadata": {"resourceVersion": rec.resource_version}, "spec": spec}
        return await self.kube.call(
            self.api.patch_namespaced_lease, rec.name, rec.namespace, body, _content_type=MERGE_PATCH
        )

    def _hold(self, lease: Any, started: float) -> Hold:
        record = LeaseRecord.parse(lease)
        # Validity counts from before the request was sent: the server may have stamped it later.
        return Hold(
            record,
            Fencing(holder=self.identity, lease_transitions=record.transitions),
            started + self.duration,
        )

    async def create(self, namespace: str, run_name: str, run_uid: str, transitions: int) -> Hold | None:
        """A new Lease held by us; None when it already exists (someone else was faster)."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": lease_name(run_name),
                "namespace": namespace,
                "labels": {RUN_LABEL: run_label(run_name)},
                # Proof that the operator made it for this run, and garbage collected with it.
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "AgentRun",
                        "name": run_name,
                        "uid": run_uid,
                        "controller": False,
                        "blockOwnerDeletion": False,
                    }
                ],
            },
            "spec": self._spec(transitions, datetime.now(UTC)),
        }
        started = time.monotonic()
        try:
            lease = await self.kube.call(self.api.create_namespaced_lease, namespace, body)
        except ApiException as err:
            metrics.API_WRITES.labels("leases", "create").inc()
            if err.status == 409:
                return None
            raise
        metrics.API_WRITES.labels("leases", "create").inc()
        return self._hold(lease, started)

    async def take_over(self, record: LeaseRecord, transitions: int) -> Hold | None:
        """Take an expired or released Lease by compare-and-swap; None when we lost the race.

        Only a Lease this operator made for the run (the caller checks :meth:`LeaseRecord.foreign_because`);
        the resourceVersion precondition keeps it that Lease, not another one made under its name since."""
        started = time.monotonic()
        try:
            lease = await self._patch(record, self._spec(transitions, datetime.now(UTC)))
        except ApiException as err:
            metrics.API_WRITES.labels("leases", "patch").inc()
            if err.status in (404, 409):
                return None
            raise
        metrics.API_WRITES.labels("leases", "patch").inc()
        if not record.released and record.holder != self.identity:
            metrics.LEASE_TAKEOVERS.inc()
        return self._hold(lease, started)

    async def renew(self, hold: Hold) -> bool:
        """Extend our hold by compare-and-swap; False (and the hold marked lost) if it was taken
        or released meanwhile."""
        async with hold.busy:
            if hold.lost:
                return False
            started = time.monotonic()
            try:
                lease = await self._patch(hold.record, {"renewTime": _micro(datetime.now(UTC))})
            except ApiException as err:
                metrics.API_WRITES.labels("leases", "patch").inc()
                if err.status in (404, 409):
                    hold.lost = True
                    return False
                raise
            metrics.API_WRITES.labels("leases", "patch").inc()
            hold.record = LeaseRecord.parse(lease)
            hold.valid_until = started + self.duration
            return True

    async def release(self, hold: Hold) -> None:
        """Delete our Lease (precondition: still the version we hold, after any renewal in flight)."""
        async with hold.busy:
            hold.lost = True
            await self.delete(hold.record)

    async def delete(self, rec: LeaseRecord) -> None:
        """Delete exactly this version of a Lease (one the operator made for its run: the caller
        checks); gone or moved on meanwhile is fine."""
        try:
            await self.kube.call(
                self.api.delete_namespaced_lease,
                rec.name,
                rec.namespace,
                body={"preconditions": {"resourceVersion": rec.resource_version}},
            )
        except ApiException as err:
            if err.status not in (404, 409):
                raise
        finally:
            metrics.API_WRITES.labels("leases", "delete").inc()
