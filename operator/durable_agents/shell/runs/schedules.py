"""AgentSchedules: start the run due at each schedule time, at most once, with the creator's authority.

Each pass lists the schedules and works on those whose shard this replica holds (as runs are
spread: :mod:`durable_agents.shell.ownership`). That spreads the work; it is not what makes a time
start once. The run for a time has one name (:func:`durable_agents.core.schedules.run_name`), so
a second replica or this one after a crash that starts the same time again gets AlreadyExists.

Authority (:mod:`durable_agents.core.schedule_authority`): a schedule whose ``createdBy`` does not
verify as the webhook's stamp for it starts nothing; before each start the API server is asked
whether the creator may still create the run by hand (create AgentRuns, ``use`` its ServiceAccount
and policy); the run is created AS its ServiceAccount (impersonated, as child runs are: that
ServiceAccount needs create on agentruns) with ``spec.createdBy`` stamped for the creator.
A run found under a time's name that this schedule did not start (no owner reference to it, or
another creator) is reported (``ForeignRun``) and never counted, cancelled or deleted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from durable_agents.api.v1alpha1 import (
    AGENT_SCHEDULE_PLURAL,
    API_VERSION,
    GROUP,
    SCHEDULE_LABEL,
    SCHEDULED_AT_ANNOTATION,
    VERSION,
    AgentScheduleSpec,
    ConcurrencyPolicy,
    Identity,
)
from durable_agents.core import schedules as slots
from durable_agents.core.authority import instant
from durable_agents.core.engine.loading import forged_object
from durable_agents.core.engine.snapshot import creation_time
from durable_agents.core.request_stamps import stamps
from durable_agents.core.retention import finished_at, is_terminal, label_value, owned_by
from durable_agents.core.schedule_authority import (
    CREATE_RUN_VERB,
    REPLACE_REQUEST_ID,
    replace_cancellation,
    run_body,
    schedule_unproven,
)
from durable_agents.core.sealing import Keyring
from durable_agents.shell.admission.authority import USE_VERB, check_policy_choice, refused_verb
from durable_agents.shell.ground.kube import Kube, service_account_user
from durable_agents.shell.ground.lifecycle import Background

log = logging.getLogger(__name__)
ObjectKey = tuple[str, str]


@dataclass(frozen=True)
class ScheduleClock:
    """Schedule time. ``minute`` seconds make one schedule minute: 60 in the product; a test
    (DURABLE_AGENTS_TEST_SCHEDULE_MINUTE) makes minutes pass faster, the same for every replica."""

    minute: float = 60.0

    def of(self, moment: datetime) -> datetime:
        return datetime.fromtimestamp(moment.timestamp() * 60.0 / self.minute, UTC)

    def now(self) -> datetime:
        return self.of(datetime.fromtimestamp(time.time(), UTC))


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def observe_schedule(
    known: dict[ObjectKey, dict[str, Any]], event_type: str | None, body: dict[str, Any]
) -> None:
    """A watch event of an AgentSchedule (None: the initial listing), into ``known``."""
    meta = body.get("metadata") or {}
    key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
    if event_type == "DELETED":
        known.pop(key, None)
    else:
        known[key] = body


class Schedules(Background):
    """The schedules of the shards this replica holds, looked at every ``interval`` seconds."""

    def __init__(
        self,
        kube: Kube,
        keyring: Keyring,
        holds: Callable[[ObjectKey], bool],
        namespace: str | None,
        operator: str,
        clock: ScheduleClock | None = None,
        interval: float = 5.0,
        known: dict[ObjectKey, dict[str, Any]] | None = None,
    ) -> None:
        self.kube = kube
        self.keyring = keyring
        self.holds = holds
        self.namespace = namespace
        self.operator = operator  # this operator's user, as a Replace cancellation's requester
        self.clock = clock or ScheduleClock()
        self.interval = interval
        # The schedules there are, kept by the operator's watch (observe_schedule): a pass makes
        # no request when there is none, so parked runs and an idle cluster cost nothing here.
        self.known: dict[ObjectKey, dict[str, Any]] = {} if known is None else known

    async def run(self) -> None:
        while True:
            try:
                await self.pass_once()
            except Exception:  # one bad pass never stops the schedules: the next one tries again
                log.exception("schedules: a pass failed")
            await asyncio.sleep(self.interval)

    async def _list(
        self, plural: str, namespace: str | None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        custom = self.kube.custom
        if namespace is None:
            found = await self.kube.call(
                custom.list_cluster_custom_object, GROUP, VERSION, plural, label_selector=selector
            )
        else:
            found = await self.kube.call(
                custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                label_selector=selector,
            )
        return list(found.get("items") or [])

    async def pass_once(self) -> None:
        for schedule in list(self.known.values()):
            meta = schedule.get("metadata") or {}
            key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
            if meta.get("deletionTimestamp") or not self.holds(key):
                continue
            try:
                await self.reconcile(schedule)
            except ApiException as err:
                log.warning("schedule %s/%s: %s %s (next pass tries again)", *key, err.status, err.reason)

    async def reconcile(self, schedule: dict[str, Any]) -> None:
        meta = schedule["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        try:
            spec = AgentScheduleSpec.model_validate(schedule.get("spec") or {})
        except ValidationError as err:
            await self._status(schedule, {}, [_condition("Ready", False, "Invalid", str(err))])
            return
        found = slots.problems(name, spec.schedule, spec.time_zone)
        if found:
            await self._status(
                schedule, {}, [_condition("Ready", False, "InvalidSchedule", "; ".join(found))]
            )
            return
        problem = schedule_unproven(self.keyring, namespace, name, spec, creation_time(meta))
        if problem is not None:  # the second line: whatever let it in, nothing starts on it
            message = f"{problem.message}: this schedule starts no run"
            await self._status(schedule, {}, [_condition("Ready", False, problem.reason, message)])
            return
        runs = await self._runs(schedule, spec)
        active = [r for r in runs if not self._finished(r)]
        fields, conditions = await self._tick(schedule, spec, runs, active)
        completed = [
            at
            for r in runs
            if (r.get("status") or {}).get("state") == "completed"
            and self._finished(r)
            and (at := finished_at(r)) is not None
        ]
        if completed:
            fields["lastSuccessfulTime"] = instant(max(completed))
        await self._status(schedule, fields, conditions)
        await self._trim(spec, runs)

    async def _runs(self, schedule: dict[str, Any], spec: AgentScheduleSpec) -> list[dict[str, Any]]:
        """The runs this schedule started: labelled, owned by it, created as its creator's."""
        meta = schedule["metadata"]
        labelled = await self._list(
            "agentruns", meta["namespace"], f"{SCHEDULE_LABEL}={label_value(meta['name'])}"
        )
        creator = spec.created_by.username if spec.created_by else None
        return [
            r
            for r in labelled
            if owned_by(r, schedule)
            and ((r.get("spec") or {}).get("createdBy") or {}).get("username") == creator
        ]

    def _finished(self, run: Mapping[str, Any]) -> bool:
        """Finished, as the operator committed it (a forged terminal state counts as running)."""
        return is_terminal(run) and forged_object(run, self.keyring) is None

    async def _tick(
        self,
        schedule: dict[str, Any],
        spec: AgentScheduleSpec,
        runs: list[dict[str, Any]],
        active: list[dict[str, Any]],
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Start the due time if it may start; the status fields and conditions to write."""
        meta, status = schedule["metadata"], schedule.get("status") or {}
        started = [_time((r["metadata"].get("annotations") or {}).get(SCHEDULED_AT_ANNOTATION)) for r in runs]
        created = creation_time(meta) or datetime.now(UTC)
        now = self.clock.now()
        # A time after now was not started: a status or annotation written by someone else (they
        # are not the operator's alone) must not stop the schedule.
        since = max(
            [t for t in (*started, _time(status.get("lastScheduleTime"))) if t is not None and t <= now]
            + [self.clock.of(created)]
        )
        due = slots.due(spec.schedule, spec.time_zone, since, now, spec.starting_deadline_seconds)
        fields: dict[str, Any] = {"nextScheduleTime": instant(due.next), "lastScheduleTime": instant(since)}
        if since == self.clock.of(created):
            fields.pop("lastScheduleTime")
        fields["active"] = sorted(r["metadata"]["name"] for r in active)
        ready = _condition("Ready", True, "Verified", "the creator's authority is verified")
        if due.slot is None:
            return fields, [ready]
        name = slots.run_name(meta["name"], due.slot)
        if spec.suspend:
            return fields, [
                ready,
                _condition("Skipped", True, "Suspended", f"{instant(due.slot)}: suspended"),
            ]
        if due.missed:
            late = f"{instant(due.slot)} is past its starting deadline ({spec.starting_deadline_seconds}s)"
            return fields, [ready, _condition("Skipped", True, "MissedDeadline", f"{late}: not started")]
        if active and spec.concurrency_policy is ConcurrencyPolicy.FORBID:
            names = ", ".join(fields["active"])
            message = f"{instant(due.slot)}: concurrencyPolicy Forbid and {names} still running"
            return fields, [ready, _condition("Skipped", True, "Forbidden", message)]
        refused = await self._creator_may(meta["namespace"], spec)
        if refused is not None:
            return fields, [
                _condition("Ready", False, "CreatorNotAllowed", f"{refused}: this schedule starts no run")
            ]
        if active and spec.concurrency_policy is ConcurrencyPolicy.REPLACE:
            for run in active:
                await self._cancel(
                    run, f"replaced by run {name} of schedule {meta['name']} (concurrencyPolicy Replace)"
                )
        outcome = await self._start(schedule, spec, due.slot, name)
        if outcome is not None:
            return fields, [ready, _condition("Skipped", True, "ForeignRun", outcome)]
        fields["lastScheduleTime"] = instant(due.slot)
        fields["active"] = sorted({*fields["active"], name})
        return fields, [
            ready,
            _condition("Skipped", False, "Started", f"{instant(due.slot)}: started {name}"),
        ]

    async def _creator_may(self, namespace: str, spec: AgentScheduleSpec) -> str | None:
        """Why the schedule's creator may not, now, create its run by hand; None when they may."""
        creator = spec.created_by
        if creator is None:
            return "the schedule names no creator"
        who = Identity(username=creator.username, groups=list(creator.groups), uid=creator.uid)
        template = spec.run_template
        refused = await refused_verb(self.kube, who, CREATE_RUN_VERB, "agentruns", namespace, "")
        sa = template.service_account_name
        if refused is None and who.username != service_account_user(namespace, sa):
            refused = await refused_verb(self.kube, who, USE_VERB, "serviceaccounts", namespace, sa, group="")
        if refused is None:
            refused = await check_policy_choice(self.kube, template, namespace, who)
        return refused

    async def _start(
        self, schedule: dict[str, Any], spec: AgentScheduleSpec, slot: datetime, name: str
    ) -> str | None:
        """Create the run for ``slot`` as its ServiceAccount, createdBy the creator. None: created,
        or started before (ours); else why the object under that name is not ours."""
        namespace = str(schedule["metadata"]["namespace"])
        body = run_body(schedule, spec, slot, name)
        creator = spec.created_by
        assert creator is not None  # verified above
        who = Identity(username=creator.username, groups=list(creator.groups), uid=creator.uid)
        user = service_account_user(namespace, spec.run_template.service_account_name)
        keyring = self.keyring

        def create() -> None:
            # Stamped in the request that creates it: the stamp's time must agree with the run's
            # creationTimestamp (core.authority.creation_unbound).
            stamped = stamps("CREATE", body, None, who, datetime.now(UTC), keyring)
            sent = {**body, "spec": {**body["spec"], **stamped}}
            resource = self.kube.dynamic().resources.get(api_version=API_VERSION, kind="AgentRun")
            self.kube.dynamic().create(
                resource, body=sent, namespace=namespace, header_params={"Impersonate-User": user}
            )

        try:
            await self.kube.call(create)
            log.info(
                "schedule %s/%s: started %s for %s",
                namespace,
                schedule["metadata"]["name"],
                name,
                instant(slot),
            )
            return None
        except ApiException as err:
            if err.status != 409:
                raise
        existing = await self.kube.call(
            self.kube.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, "agentruns", name
        )
        if owned_by(existing, schedule):
            return None  # started before (another replica, or this one before a crash)
        return f"{instant(slot)}: run {name} exists and was not started by this schedule: not counted"

    async def _cancel(self, run: dict[str, Any], reason: str) -> None:
        if REPLACE_REQUEST_ID in ((run.get("spec") or {}).get("cancellations") or {}):
            return  # asked already (a cancellation is never changed once made)
        entry = replace_cancellation(run, self.keyring, self.operator, datetime.now(UTC), reason)
        body = {"spec": {"cancellations": entry}}
        meta = run["metadata"]
        await self.kube.call(
            self.kube.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            meta["namespace"],
            "agentruns",
            meta["name"],
            body,
        )

    async def _trim(self, spec: AgentScheduleSpec, runs: list[dict[str, Any]]) -> None:
        """Delete the oldest finished runs beyond the history limits."""
        finished = sorted(
            (r for r in runs if self._finished(r)),
            key=lambda r: finished_at(r) or datetime.min.replace(tzinfo=UTC),
        )
        completed = [r for r in finished if (r.get("status") or {}).get("state") == "completed"]
        failed = [r for r in finished if (r.get("status") or {}).get("state") != "completed"]
        extra = completed[: max(0, len(completed) - spec.successful_runs_history_limit)]
        extra += failed[: max(0, len(failed) - spec.failed_runs_history_limit)]
        for run in extra:
            meta = run["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            try:
                await self.kube.call(
                    self.kube.custom.delete_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    meta["namespace"],
                    "agentruns",
                    meta["name"],
                )
            except ApiException as err:
                if err.status != 404:
                    raise

    async def _status(
        self, schedule: dict[str, Any], fields: dict[str, Any], conditions: list[dict[str, Any]]
    ) -> None:
        """Write the status when it says something new (a condition keeps its transition time)."""
        status = schedule.get("status") or {}
        before = {c.get("type"): c for c in status.get("conditions") or []}
        merged = dict(before)
        for c in conditions:
            old = before.get(c["type"])
            same = old is not None and all(old.get(k) == c[k] for k in ("status", "reason", "message"))
            merged[c["type"]] = old if same else c
        new = {**fields, "conditions": list(merged.values())}
        if all(status.get(k) == v for k, v in new.items()):
            return
        meta = schedule["metadata"]
        await self.kube.call(
            self.kube.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            meta["namespace"],
            AGENT_SCHEDULE_PLURAL,
            meta["name"],
            {"status": new},
        )
