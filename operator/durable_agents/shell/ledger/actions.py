"""The action ledger's store: ActionRecords created once by name, their status by compare-and-swap.

The record's name derives from the idempotency key, so creating an intent twice is answered by
the API server with AlreadyExists: counted as a suppressed duplicate, never an error. Records
carry the run's label for listing but no ownerReference: the ledger outlives the run (retention).

Every status write goes through :meth:`ActionStore.commit_status`, which stamps it (the outcome
stamp, :mod:`durable_agents.core.outcome_stamps`); every record created here says so
(``spec.statusStamped``), and what is read of a record's status is what
:func:`~durable_agents.core.outcome_stamps.believed` believes of it.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import (
    API_VERSION,
    GROUP,
    VERSION,
    ActionRecordSpec,
    ActionRecordStatus,
    ActionState,
    FirstClaim,
)
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.core.engine import ActionObservation, NeedActions, RunSnapshot
from durable_agents.core.engine.actions import conflicting_record
from durable_agents.core.ledger import action_record_name, check_action_transition
from durable_agents.core.outcome_stamps import DEFAULT_CLAIM_TTL, Belief, believed, stamp_outcome
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.faults import FaultPoints
from durable_agents.shell.ground.kube import Kube, ObjectKey
from durable_agents.shell.ground.store import Conflict, Gone, Precondition, Recheck, StatusStore
from durable_agents.shell.ownership.leases import run_label

log = logging.getLogger(__name__)
PLURAL = "actionrecords"


class FirstClaims:
    """The intents this process created under a first claim of its own (shared by its worker,
    which creates them, and its dispatcher, which sends them without a claim write): when each
    claim began on the local monotonic clock, counted from before the create request was sent."""

    def __init__(self, holder: str, ttl: timedelta) -> None:
        self.holder = holder
        self.ttl = ttl
        self._started: dict[ObjectKey, float] = {}

    def claimed(self, spec: ActionRecordSpec) -> tuple[ActionRecordSpec, float]:
        started = time.monotonic()
        claim = FirstClaim(holder=self.holder, expires_at=datetime.now(UTC) + self.ttl)
        return spec.model_copy(update={"first_claim": claim}), started

    def note(self, key: ObjectKey, started: float) -> None:
        self._started[key] = started

    def forget(self, key: ObjectKey) -> None:
        self._started.pop(key, None)

    def take(self, key: ObjectKey) -> float | None:
        """When our first claim on ``key`` began, once: a claim is sent under at most once."""
        return self._started.pop(key, None)


class ActionStore(StatusStore):
    kind = "ActionRecord"
    plural = PLURAL

    def __init__(
        self,
        kube: Kube,
        keyring: Keyring | None,
        faults: FaultPoints | None = None,
        claim_ttl: timedelta = DEFAULT_CLAIM_TTL,
    ) -> None:
        super().__init__(kube, faults)
        self.keyring = keyring  # stamps every status written here; None: tests only
        self.claim_ttl = claim_ttl

    def belief(self, record: dict[str, Any]) -> Belief:
        """What to believe of ``record``'s status (its outcome stamp verified)."""
        return believed(record, self.keyring, datetime.now(UTC), self.claim_ttl)

    async def commit_status(
        self,
        current: dict[str, Any],
        status: dict[str, Any],
        precondition: Precondition | None = None,
        recheck: Recheck | None = None,
    ) -> dict[str, Any]:
        """The status written with its outcome stamp: the one place the operator writes it."""
        if self.keyring is not None:
            parsed = ActionRecordStatus.model_validate(status)
            name, key = current["metadata"]["name"], current["spec"]["idempotencyKey"]
            status = {**status, "stamp": stamp_outcome(self.keyring, name, key, parsed)}
        return await super().commit_status(current, status, precondition, recheck)

    async def ensure(
        self, namespace: str, spec: ActionRecordSpec, first_claims: FirstClaims | None = None
    ) -> dict[str, Any]:
        """Create the intent record, or return the one that exists (a suppressed duplicate). With
        ``first_claims``, the record is created under this process's first claim (no claim write
        before its send)."""
        name = action_record_name(spec.idempotency_key)
        if self.keyring is not None:  # every status this record gets is stamped
            spec = spec.model_copy(update={"status_stamped": True})
        if first_claims is not None:
            spec, started = first_claims.claimed(spec)
            # Noted before the create: the record's watch event may reach the dispatcher before
            # the create's answer reaches us. Forgotten again unless the create is ours.
            first_claims.note((namespace, name), started)
        body = {
            "apiVersion": API_VERSION,
            "kind": "ActionRecord",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {RUN_LABEL: run_label(spec.run_ref.name)},
            },
            "spec": spec.wire(),
        }
        async with self.faults.serialized():
            self.faults.before()
            try:
                out: dict[str, Any] = await self.kube.call(
                    self.kube.create_namespaced_object, GROUP, VERSION, namespace, PLURAL, body
                )
            except ApiException as err:
                metrics.API_WRITES.labels("actionrecords", "create").inc()
                if first_claims is not None:
                    first_claims.forget((namespace, name))
                if err.status != 409:
                    raise
                metrics.DUPLICATE_SUPPRESSIONS.inc()
                self.faults.after()
                return await self.get(namespace, name)
            metrics.API_WRITES.labels("actionrecords", "create").inc()
            self.faults.after()
            return out

    async def observe(self, run: RunSnapshot, need: NeedActions) -> dict[str, ActionObservation]:
        """The ledger's word on each action a run waits on; an intent whose record is missing is
        created, and (when the run cancels) an undispatched intent is canceled."""
        seen: dict[str, ActionObservation] = {}
        for name, spec in need.records.items():
            try:
                record = await self.get(run.namespace, name)
            except Gone:
                if spec is None:
                    log.warning(
                        "run %s/%s waits on a missing action record %s", run.namespace, run.name, name
                    )
                    continue
                record = await self.ensure(run.namespace, spec)
            conflict = conflicting_record(record, spec) if spec is not None else None
            if conflict is not None:
                log.warning("run %s/%s: %s", run.namespace, run.name, conflict.message)
                seen[name] = conflict
                continue
            belief = self.belief(record)
            if belief.forged is not None:
                log.warning("run %s/%s: action %s: %s", run.namespace, run.name, name, belief.forged)
            status = belief.status
            # An intent under a first claim may be on its way: it is reconciled, never canceled.
            first_claimed = (record.get("spec") or {}).get("firstClaim") is not None
            if need.cancel and status.state is ActionState.INTENT and not first_claimed:
                record, status = await self._cancel_intent(record, status)
            seen[name] = ActionObservation(
                status.state, status.outcome, status.reason, status.message, status.input
            )
        return seen

    async def _cancel_intent(
        self, record: dict[str, Any], status: ActionRecordStatus
    ) -> tuple[dict[str, Any], ActionRecordStatus]:
        """An undispatched intent is canceled by compare-and-swap; if a dispatcher claimed it first,
        it is dispatched and will be reconciled, never assumed undone."""
        meta = record["metadata"]
        check_action_transition(status.state, ActionState.CANCELED)  # the ledger's one table
        canceled = status.model_copy(
            update={
                "state": ActionState.CANCELED,
                "reason": "RunCanceled",
                "message": "canceled before dispatch",
                "finished_at": datetime.now(UTC),
            }
        )
        try:
            record = await self.commit_status(record, canceled.wire())
        except Conflict:
            record = await self.get(meta["namespace"], meta["name"])
        status = ActionRecordStatus.model_validate(record.get("status") or {})
        log.info("action %s/%s: %s before dispatch", meta["namespace"], meta["name"], status.state.value)
        return record, status
