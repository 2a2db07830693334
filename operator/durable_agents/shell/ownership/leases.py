"""Lease objects (``coordination.k8s.io/v1``): the one primitive that region, shard and per-run
Leases are kept with, natively in asyncio.

:class:`LeaseLock` keeps Leases under one holder identity and lease duration. Their fields are
kept as client-go's leader election keeps them (holderIdentity, leaseDurationSeconds,
acquireTime, renewTime, leaseTransitions). Every write is a compare-and-swap (a merge patch or a
delete with a resourceVersion precondition, refused with 409 when the Lease moved meanwhile) and
is counted (``durable_agents_api_writes_total{resource="leases"}`` and :attr:`LeaseLock.writes`).
A hold (:class:`LeaseHold`) is valid on the local monotonic clock, counted from before the request
that acquired or last renewed it was sent (the server may have applied it later); the writes to
one hold are serialized, and a hold once lost stays lost. Whose Lease may be taken, and when it
counts as expired, is the caller's: :mod:`.regions` (leader election), :mod:`.shards` (a region's
shard and member Leases).

Per-run Leases (``agentrun-<run>``) are how an earlier release held a run. This release writes
none: its worker reads one (:meth:`RunLeases.get`) to respect a live one that another process
still holds during a rolling upgrade (:mod:`.rights`). Only a Lease that release made for the run
counts: one named for the run, labelled with its name and owned by its AgentRun (an
ownerReference with the run's uid, which also lets the garbage collector remove the Lease with
the run). Anything else under that name (:meth:`LeaseRecord.foreign_because`) is someone else's
object: it is left alone and holds no run back. The writes of :class:`RunLeases` (create, take
over, renew, release by delete) are the ones that release's worker made; tests play it with them.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION, Condition, ConditionStatus
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.core.checkpoint import Fencing
from durable_agents.core.engine.children import label_value
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube

LEASE_CONFLICT = "LeaseConflict"
MERGE_PATCH = "application/merge-patch+json"


def micro_time(t: datetime) -> str:
    """MicroTime: RFC 3339 with exactly six fractional digits, as client-go writes it. The client
    re-serializes a created body's times with isoformat(), which drops a zero fraction, and the
    API server then refuses the Lease (400): a whole second is never sent."""
    t = t if t.microsecond else t + timedelta(microseconds=1)
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
    """A Lease as read or written: its spec, its version and what says whose it is."""

    namespace: str
    name: str
    holder: str
    duration_seconds: int
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int
    resource_version: str
    uid: str = ""
    owner_uids: tuple[str, ...] = ()  # uids of the objects its ownerReferences name
    labels: dict[str, str] = field(default_factory=dict, hash=False)

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
            owner_uids=tuple(ref.uid for ref in meta.owner_references or ()),
            labels=dict(meta.labels or {}),
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
            owner_uids=tuple(ref.get("uid", "") for ref in meta.get("ownerReferences") or ()),
            labels=dict(meta.get("labels") or {}),
        )

    @property
    def run_label(self) -> str | None:
        """The value of :data:`RUN_LABEL`, if any."""
        return self.labels.get(RUN_LABEL)

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


@dataclass(kw_only=True)
class LeaseHold:
    """A Lease this process holds. ``valid_until`` is on the local monotonic clock.

    ``busy`` serializes the writes to the Lease: a renewal still in flight when the hold is
    released would otherwise move the resourceVersion under the release (409), leaving the Lease
    held by nobody who knows it. ``lost`` is final: a lost hold never becomes valid again.
    """

    record: LeaseRecord
    valid_until: float
    lost: bool = False
    busy: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)

    def valid(self, margin: float = 0.0) -> bool:
        return not self.lost and time.monotonic() + margin < self.valid_until


@dataclass(frozen=True)
class Acquired:
    """A Lease just written to be held by us, and until when that hold is valid (monotonic)."""

    record: LeaseRecord
    valid_until: float


H = TypeVar("H", bound=LeaseHold)


class LeaseLock:
    """Lease objects held under one holder identity and one lease duration (client-go's
    ``resourcelock.LeaseLock``, for any number of Leases)."""

    def __init__(self, kube: Kube, identity: str, duration_seconds: int) -> None:
        self.kube = kube
        self.identity = identity
        self.duration = duration_seconds
        self.writes: collections.Counter[str] = collections.Counter()  # by verb

    @property
    def api(self) -> client.CoordinationV1Api:
        return self.kube.coordination

    def spec(self, transitions: int) -> dict[str, Any]:
        """A hold by us from now: acquired and renewed now, ``transitions`` its epoch."""
        now = micro_time(datetime.now(UTC))
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    async def read(self, namespace: str, name: str) -> LeaseRecord | None:
        try:
            lease = await self.kube.call(self.api.read_namespaced_lease, name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return LeaseRecord.parse(lease)

    async def select(self, namespace: str, selector: str) -> list[LeaseRecord]:
        """The Leases in ``namespace`` that the label ``selector`` selects."""
        listed = await self.kube.call(self.api.list_namespaced_lease, namespace, label_selector=selector)
        return [LeaseRecord.parse(lease) for lease in listed.items]

    async def create(
        self,
        namespace: str,
        name: str,
        labels: dict[str, str],
        transitions: int,
        owner_references: list[dict[str, Any]] | None = None,
    ) -> Acquired | None:
        """A new Lease held by us; None when it exists already (someone else was faster)."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
        if owner_references is not None:
            metadata["ownerReferences"] = owner_references
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": self.spec(transitions),
        }
        started = time.monotonic()
        try:
            lease = await self.kube.call(self.api.create_namespaced_lease, namespace, body)
        except ApiException as err:
            if err.status == 409:
                return None
            raise
        finally:
            self._count("create")
        return Acquired(LeaseRecord.parse(lease), started + self.duration)

    async def take(self, record: LeaseRecord, transitions: int) -> Acquired | None:
        """Hold exactly this version of a Lease from now, ``transitions`` its epoch; None when it
        moved or is gone meanwhile (someone else was faster)."""
        started = time.monotonic()
        taken = await self.cas(record, self.spec(transitions))
        return None if taken is None else Acquired(taken, started + self.duration)

    async def renew(self, hold: H, on_lost: Callable[[H], None] | None = None) -> bool:
        """Extend ``hold`` by compare-and-swap. False when it is lost already, or was taken,
        released or deleted meanwhile: then ``on_lost(hold)`` is told first (under the hold's
        lock, before it is marked lost). Other API errors are raised; the hold stays."""
        async with hold.busy:
            if hold.lost:
                return False
            started = time.monotonic()
            try:
                lease = await self.patch(hold.record, {"renewTime": micro_time(datetime.now(UTC))})
            except ApiException as err:
                if err.status in (404, 409):
                    if on_lost is not None:
                        on_lost(hold)
                    hold.lost = True
                    return False
                raise
            hold.record = LeaseRecord.parse(lease)
            hold.valid_until = started + self.duration
            return True

    async def patch(self, record: LeaseRecord, spec: dict[str, Any]) -> Any:
        """Merge ``spec`` into exactly this version of the Lease (409 if it moved meanwhile)."""
        body = {"metadata": {"resourceVersion": record.resource_version}, "spec": spec}
        try:
            return await self.kube.call(
                self.api.patch_namespaced_lease,
                record.name,
                record.namespace,
                body,
                _content_type=MERGE_PATCH,
            )
        finally:
            self._count("patch")

    async def cas(self, record: LeaseRecord, spec: dict[str, Any]) -> LeaseRecord | None:
        """:meth:`patch`; None when the Lease moved or is gone meanwhile."""
        try:
            return LeaseRecord.parse(await self.patch(record, spec))
        except ApiException as err:
            if err.status in (404, 409):
                return None
            raise

    async def delete(self, record: LeaseRecord) -> None:
        """Delete exactly this version of the Lease; gone or moved on meanwhile is fine."""
        try:
            await self.kube.call(
                self.api.delete_namespaced_lease,
                record.name,
                record.namespace,
                body={"preconditions": {"resourceVersion": record.resource_version}},
            )
        except ApiException as err:
            if err.status not in (404, 409):
                raise
        finally:
            self._count("delete")

    def _count(self, verb: str) -> None:
        metrics.API_WRITES.labels("leases", verb).inc()
        self.writes[verb] += 1


# --- per-run Leases of an earlier release -----------------------------------------------------


@dataclass(kw_only=True)
class Hold(LeaseHold):
    """A per-run Lease held by us, and the epoch (holder + transitions) a run commits under it."""

    epoch: Fencing


def conflict_message(record: LeaseRecord, why: str) -> str:
    return (
        f"Lease {record.namespace}/{record.name} was not created by the operator for this run ({why}):"
        " it is never taken over or deleted, and the run does not advance until it is removed"
    )


def conflict_status(run: dict[str, Any], message: str, now: datetime) -> dict[str, Any] | None:
    """The run's status with a ``LeaseConflict`` condition saying why it does not advance, or None
    when it says so already. No transition: the next commit rebuilds the conditions without it.

    Not used by this release's worker: a foreign Lease under a run's old Lease name holds nothing
    back any more (see the module's docstring)."""
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
    """Per-run Leases, on :class:`LeaseLock`. The operator only reads them (:meth:`get`)."""

    def __init__(self, kube: Kube, identity: str, duration_seconds: int = 15) -> None:
        self.lock = LeaseLock(kube, identity, duration_seconds)
        self.identity = identity

    async def get(self, namespace: str, run_name: str) -> LeaseRecord | None:
        return await self.lock.read(namespace, lease_name(run_name))

    def _hold(self, acquired: Acquired) -> Hold:
        epoch = Fencing(holder=self.identity, lease_transitions=acquired.record.transitions)
        return Hold(record=acquired.record, valid_until=acquired.valid_until, epoch=epoch)

    async def create(self, namespace: str, run_name: str, run_uid: str, transitions: int) -> Hold | None:
        """A new Lease held by us; None when it already exists (someone else was faster)."""
        # The owner reference: proof that the operator made it for this run, and garbage collected with it.
        owner = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AgentRun",
            "name": run_name,
            "uid": run_uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }
        labels = {RUN_LABEL: run_label(run_name)}
        acquired = await self.lock.create(namespace, lease_name(run_name), labels, transitions, [owner])
        return None if acquired is None else self._hold(acquired)

    async def take_over(self, record: LeaseRecord, transitions: int) -> Hold | None:
        """Take an expired or released Lease by compare-and-swap; None when we lost the race.

        Only a Lease this operator made for the run (the caller checks :meth:`LeaseRecord.foreign_because`);
        the resourceVersion precondition keeps it that Lease, not another one made under its name since."""
        acquired = await self.lock.take(record, transitions)
        if acquired is None:
            return None
        if not record.released and record.holder != self.identity:
            metrics.LEASE_TAKEOVERS.inc()
        return self._hold(acquired)

    async def renew(self, hold: Hold) -> bool:
        """Extend our hold by compare-and-swap; False (and the hold marked lost) if it was taken
        or released meanwhile."""
        return await self.lock.renew(hold)

    async def release(self, hold: Hold) -> None:
        """Delete our Lease (precondition: still the version we hold, after any renewal in flight)."""
        async with hold.busy:
            hold.lost = True
            await self.lock.delete(hold.record)

    async def delete(self, record: LeaseRecord) -> None:
        """Delete exactly this version of a Lease (one the operator made for its run: the caller
        checks); gone or moved on meanwhile is fine."""
        await self.lock.delete(record)
