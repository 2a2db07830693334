"""Explicit failover between regions: the target region's leader verifies, then adopts, each run.

A :class:`RegionFailover` (``kubectl agentrun region failover FROM --to TO``) is acted on by one
process only: the holder of TO's region Lease, and only when the admission webhook's stamp on the
request verifies (the second line: a request made while the webhook was off, or copied from
elsewhere, is refused, whatever RBAC let its author create). For every unfinished run FROM owns:

1. its checkpoint must load, migrate and verify (integrity stamp, sealed values) here;
2. each of its ActionRecords must be settled or safe to take on: an unsent intent is; a record
   claimed by a dispatcher whose claim has not expired is in flight (the run is not adopted now:
   ask again after the claim); a claim that expired and an unknown outcome are reconciled by a
   query to the authoritative system first, and what stays unknown is listed;
3. then the run records its new owner, TO, with TO's region epoch, stamped by this operator (one
   compare-and-swap on the run: a former owner's commit prepared before it is refused, and every
   later commit of FROM sees the run is no longer its region's).

Runs that fail a check stay with FROM and are listed with why. Nothing is adopted automatically:
a region that stops renewing its Lease may be partitioned, not gone, and only a person can know.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from durable_agents.api.v1alpha1 import GROUP, VERSION, ActionRecordSpec, ActionState
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.api.v1alpha1.regionfailover import (
    FAILOVER_PLURAL,
    AdoptedRun,
    FailoverPhase,
    NotAdoptedRun,
    RegionFailoverSpec,
    RegionFailoverStatus,
    UnknownOutcome,
)
from durable_agents.core.authority import failover_verifies
from durable_agents.core.engine import RunSnapshot, Settings
from durable_agents.core.engine.loading import forged_position, load_stored
from durable_agents.core.ledger import Claim, WaitUntil, next_dispatch_step
from durable_agents.core.outcome_stamps import believed_status
from durable_agents.core.regions import stamp_adoption, with_region_epoch
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube, ObjectKey
from durable_agents.shell.ground.lifecycle import Background
from durable_agents.shell.ground.store import Conflict, Gone, RunStore
from durable_agents.shell.intake.reflector import RunReflector
from durable_agents.shell.ledger.dispatcher import Dispatcher
from durable_agents.shell.ownership.leases import run_label
from durable_agents.shell.ownership.regions import RegionElector

log = logging.getLogger(__name__)

LOOK_AGAIN = 1.0  # seconds: pending requests are looked at again (leadership may have come)
FINISHED = frozenset({FailoverPhase.COMPLETED.value, FailoverPhase.REFUSED.value})
# input_required: waiting for the run's answers, sent again by the run's region once answered.
UNSETTLED = frozenset(
    {ActionState.INTENT, ActionState.DISPATCHING, ActionState.OUTCOME_UNKNOWN, ActionState.INPUT_REQUIRED}
)
UNSETTLED_VALUES = frozenset(state.value for state in UNSETTLED)


class NotAdoptable(Exception):
    """A run that stays with its region, and why (a short sentence for the failover's status)."""


class Failovers(Background):
    """Carries out the RegionFailovers addressed to this process's region, while it leads it."""

    def __init__(
        self,
        kube: Kube,
        elector: RegionElector,
        keyring: Keyring | None,
        settings_for: Callable[[RunSnapshot], Settings],
        region_of: Callable[[RunSnapshot], str],
        dispatcher: Callable[[], Dispatcher | None],
        adopted: Callable[[ObjectKey], None],
        namespace: str | None = None,
    ) -> None:
        self.kube = kube
        self.elector = elector
        self.region = elector.region
        self.keyring = keyring
        self.settings_for = settings_for
        self.region_of = region_of
        self.dispatcher = dispatcher
        self.adopted = adopted  # told of each run adopted (the worker takes it on)
        self.namespace = namespace  # an operator that watches one namespace adopts only its runs
        self.runs = RunStore(kube)
        self.reflector = RunReflector(kube, self.observe, plural=FAILOVER_PLURAL)
        self._pending: set[str] = set()
        self._wake = asyncio.Event()

    def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A RegionFailover as listed or watched: one addressed to this region and unfinished is
        pending until this process, leading the region, has carried it out."""
        spec, status = body.get("spec") or {}, body.get("status") or {}
        name = (body.get("metadata") or {}).get("name", "")
        if event_type == "DELETED" or spec.get("to") != self.region or status.get("phase") in FINISHED:
            self._pending.discard(name)
            return
        self._pending.add(name)
        self._wake.set()

    async def run(self) -> None:
        self.reflector.start()  # the RegionFailover watch (its kind's one intake in the process)
        try:
            await self._carry_out_pending()
        finally:
            await self.reflector.stop()

    async def _carry_out_pending(self) -> None:
        # No API call while idle: the requests come from a watch; the loop only looks again now
        # and then because leadership may have come (a new leader carries on what is unfinished).
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), LOOK_AGAIN)
            self._wake.clear()
            if self.elector.leading() is None or not self._pending:
                continue
            for name in sorted(self._pending):
                try:
                    done = await self.carry_out(name)
                except Exception:  # an API error: the request stays pending and is tried again
                    log.exception("region %s: failover %s failed; trying again", self.region, name)
                    continue
                if done:
                    self._pending.discard(name)

    # --- one failover ------------------------------------------------------------------------

    async def carry_out(self, name: str) -> bool:
        """Carry out one request; False when it must wait (this process does not lead the region)."""
        try:
            body = await self.kube.call(
                self.kube.custom.get_cluster_custom_object, GROUP, VERSION, FAILOVER_PLURAL, name
            )
        except ApiException as err:
            if err.status == 404:
                return True
            raise
        spec = RegionFailoverSpec.model_validate(body.get("spec") or {})
        current = RegionFailoverStatus.model_validate(body.get("status") or {})
        if spec.to != self.region or current.finished:
            return True
        if not failover_verifies(self.keyring, name, spec):
            why = (
                "not stamped by this operator's admission webhook (is it installed?): a failover is"
                " acted on only when the webhook has checked its author's `failover` verb on regions"
            )
            log.warning("region failover %s refused: %s", name, why)
            await self._report(body, RegionFailoverStatus(phase=FailoverPhase.REFUSED, message=why))
            return True
        hold = self.elector.leading()
        if hold is None:
            return False
        started = datetime.now(UTC)
        body = await self._report(
            body,
            RegionFailoverStatus(
                phase=FailoverPhase.VERIFYING,
                message=f"verifying the runs of region {spec.from_region}",
                started_at=started,
                epoch=hold.epoch,
            ),
        )
        adopted: list[AdoptedRun] = []
        left: list[NotAdoptedRun] = []
        unknown: list[UnknownOutcome] = []
        for run in await self._runs_of(spec.from_region, name):
            key = (run["metadata"]["namespace"], run["metadata"]["name"])
            if self.elector.leading() is not hold:
                raise RuntimeError(f"region {self.region}: leadership lost during failover {name}")
            try:
                outcomes = await self._adopt(run, spec.from_region, name, hold.epoch)
            except NotAdoptable as why:
                left.append(NotAdoptedRun(namespace=key[0], name=key[1], reason=str(why)[:256]))
                continue
            unknown.extend(outcomes)
            adopted.append(AdoptedRun(namespace=key[0], name=key[1], epoch=hold.epoch))
            await self._take_on(key)
        message = (
            f"adopted {len(adopted)} run(s) of region {spec.from_region} into {self.region} at epoch "
            f"{hold.epoch}; {len(left)} not adopted; {len(unknown)} unknown outcome(s) to reconcile"
        )
        log.info("region failover %s: %s", name, message)
        await self._report(
            body,
            RegionFailoverStatus.fitted(
                phase=FailoverPhase.COMPLETED,
                message=message,
                started_at=started,
                finished_at=datetime.now(UTC),
                epoch=hold.epoch,
                adopted=adopted,
                not_adopted=left,
                unknown_outcomes=unknown,
            ),
        )
        return True

    async def _runs_of(self, region: str, failover: str) -> list[dict[str, Any]]:
        """The unfinished runs ``region`` owns, and those this failover adopted already (a leader
        that took over half-way goes through them again: adoption is idempotent)."""
        custom = self.kube.custom
        if self.namespace:
            listed = await self.kube.call(
                custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, "agentruns"
            )
        else:
            listed = await self.kube.call(custom.list_cluster_custom_object, GROUP, VERSION, "agentruns")
        out = []
        for run in listed.get("items") or []:
            try:
                snap = RunSnapshot.from_object(run)
            except (ValidationError, KeyError):
                if ((run.get("spec") or {}).get("region") or "default") == region:
                    out.append(run)  # its checks say why it cannot be adopted
                continue
            if snap.state.terminal and forged_position(snap, self.settings_for(snap)) is None:
                continue  # ended, as the operator wrote it (a forged end is adopted, then quarantined)
            owned = snap.status.ownership
            ours = owned is not None and owned.failover == failover
            if self.region_of(snap) == region or (ours and self.region_of(snap) == self.region):
                out.append(run)
        return sorted(out, key=lambda r: (r["metadata"]["namespace"], r["metadata"]["name"]))

    async def _adopt(
        self, run: dict[str, Any], source: str, failover: str, epoch: int
    ) -> list[UnknownOutcome]:
        """Verify one run and record its new owner; the unknown outcomes it carries with it."""
        key = (run["metadata"]["namespace"], run["metadata"]["name"])
        for _ in range(3):  # a run that moves during its checks is checked again
            try:
                snap = RunSnapshot.from_object(run)
            except (ValidationError, KeyError) as err:
                raise NotAdoptable(f"its status cannot be read: {err}") from None
            ownership = snap.status.ownership
            if (
                ownership is not None
                and ownership.failover == failover
                and self.region_of(snap) == self.region
            ):
                return await self._unknown_of(snap)  # adopted by this failover already
            if snap.raw_checkpoint is not None:
                loaded = load_stored(snap, self.settings_for(snap))
                if not hasattr(loaded, "checkpoint"):
                    raise NotAdoptable(
                        f"its checkpoint does not load here: {loaded.reason}: {loaded.message}"
                    )
            unknown = await self._settle_ledger(snap)
            status = dict(run.get("status") or {})
            recorded = with_region_epoch(None, self.region, epoch)
            stamp = (
                stamp_adoption(self.keyring, snap.run_id, self.region, source, failover)
                if self.keyring
                else None
            )
            status["ownership"] = {
                **recorded,
                "adoptedFrom": source,
                "failover": failover,
                "adoptedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                **({"stamp": stamp} if stamp else {}),
            }
            try:
                await self.runs.commit_status(run, status)
            except Conflict:
                run = await self.runs.get(*key)
                continue
            except Gone:
                raise NotAdoptable("it was deleted during the failover") from None
            metrics.REGION_ADOPTIONS.labels(source, self.region).inc()
            return unknown
        raise NotAdoptable("it kept changing during its checks (its region may still be working on it)")

    async def _take_on(self, key: ObjectKey) -> None:
        """The adopted run and its unsettled records, to this process's worker and dispatcher now
        (the region's other replicas come to its records at their next look at foreign ones)."""
        self.adopted(key)
        dispatcher = self.dispatcher()
        if dispatcher is None:
            return
        for record in await self._records(*key):
            if believed_status(record, self.keyring, datetime.now(UTC)).state.value in UNSETTLED_VALUES:
                dispatcher.queue.add((key[0], record["metadata"]["name"]))

    async def _records(self, namespace: str, run: str) -> list[dict[str, Any]]:
        listed = await self.kube.call(
            self.kube.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "actionrecords",
            label_selector=f"{RUN_LABEL}={run_label(run)}",
        )
        return list(listed.get("items") or [])

    async def _settle_ledger(self, snap: RunSnapshot) -> list[UnknownOutcome]:
        """Every record of the run settled or safe to take on, reconciled by query where its
        outcome is not known; the outcomes still unknown after asking."""
        unknown: list[UnknownOutcome] = []
        now = datetime.now(UTC)
        for record in await self._records(snap.namespace, snap.name):
            name = record["metadata"]["name"]
            status = believed_status(record, self.keyring, now)  # a forged settled state: unknown
            first = ActionRecordSpec.model_validate(record["spec"]).first_claim
            step = next_dispatch_step(status, now, first)
            if isinstance(step, Claim) or step == WaitUntil(None):
                continue  # never sent (the new owner's dispatcher sends it), or settled
            if isinstance(step, WaitUntil) and step.at is not None:  # a claim not yet expired
                holder = status.claimed_by or (first.holder if first else "?")
                raise NotAdoptable(
                    f"action {name} is in flight: claimed by {holder} until {step.at:%H:%M:%SZ};"
                    " ask again after that"
                )
            dispatcher = self.dispatcher()
            if dispatcher is None:
                raise NotAdoptable(
                    f"action {name} must be reconciled by query, and this process has no dispatcher"
                )
            record = await dispatcher.reconcile(record)
            status = believed_status(record, self.keyring, datetime.now(UTC))
            if status.state is ActionState.DISPATCHING:
                raise NotAdoptable(
                    f"action {name} could not be reconciled: still claimed by {status.claimed_by}"
                )
            if status.state is ActionState.OUTCOME_UNKNOWN and status.reason != "NotApplied":
                unknown.append(
                    UnknownOutcome(
                        namespace=snap.namespace,
                        run=snap.name,
                        action=name,
                        since=status.outcome_unknown_since,
                    )
                )
        return unknown

    async def _unknown_of(self, snap: RunSnapshot) -> list[UnknownOutcome]:
        out = []
        for record in await self._records(snap.namespace, snap.name):
            status = believed_status(record, self.keyring, datetime.now(UTC))
            if status.state is ActionState.OUTCOME_UNKNOWN and status.reason != "NotApplied":
                out.append(
                    UnknownOutcome(
                        namespace=snap.namespace,
                        run=snap.name,
                        action=record["metadata"]["name"],
                        since=status.outcome_unknown_since,
                    )
                )
        return out

    async def _report(self, body: dict[str, Any], status: RegionFailoverStatus) -> dict[str, Any]:
        out: dict[str, Any] = await self.kube.call(
            self.kube.custom.replace_cluster_custom_object_status,
            GROUP,
            VERSION,
            FAILOVER_PLURAL,
            body["metadata"]["name"],
            {**body, "status": status.wire()},
        )
        metrics.API_WRITES.labels(f"{FAILOVER_PLURAL}/status", "update").inc()
        return out
