"""AgentSchedule: the schedules of this replica's shards, each time started once
(:mod:`durable_agents.shell.runs.schedules`: the schedules this watch has seen are looked at every
few seconds, whatever happens to it), and their admission in the webhook process
(:mod:`durable_agents.shell.admission.schedules`). Only a process with run workers starts runs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from durable_agents.api.v1alpha1 import AGENT_SCHEDULE_PLURAL, GROUP, VERSION
from durable_agents.core.request_stamps import identity_of
from durable_agents.shell.admission.schedules import (
    SCHEDULE_PATH,
    SCHEDULE_STAMP_PATH,
    check_schedule,
    schedule_stamps,
)
from durable_agents.shell.ground.kube import ObjectKey
from durable_agents.shell.runs.schedules import ScheduleClock, Schedules, observe_schedule
from durable_agents_controllers.manager import Manager


def build(manager: Manager, known: dict[ObjectKey, dict[str, Any]]) -> None:
    config = manager.config
    if config.workers == 0:
        return
    ownership = manager.worker.ownership
    minute = config.schedule_minute
    manager.runnables.add(
        Schedules(
            manager.kube,
            manager.keyring,
            holds=ownership.holds,
            namespace=config.namespace,
            operator=config.identity,
            clock=ScheduleClock(minute),
            interval=min(5.0, minute / 10),
            known=known,
        )
    )


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    # Watched, not polled: a pass looks only at the schedules this watch has seen (kept from the
    # first event on, whenever the schedules' loop starts).
    known: dict[ObjectKey, dict[str, Any]] = {}
    manager.builds.append(lambda m: build(m, known))

    @kopf.on.event(GROUP, VERSION, AGENT_SCHEDULE_PLURAL, registry=registry)
    async def schedule_event(event: kopf.RawEvent, **_: Any) -> None:
        observe_schedule(known, event.get("type"), dict(event.get("object") or {}))


def register_admission(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    """The stamp of a new schedule's creator, and the refusals (their field named)."""

    async def stamp_schedule(
        body: kopf.Body, userinfo: kopf.UserInfo, patch: kopf.Patch, **kwargs: Any
    ) -> None:
        user = identity_of(dict(userinfo))
        stamped = schedule_stamps(
            str(kwargs.get("operation")), dict(body), user, datetime.now(UTC), manager.keyring
        )
        for field, value in stamped.items():
            patch.spec[field] = value

    async def review_schedule(body: kopf.Body, userinfo: kopf.UserInfo, **kwargs: Any) -> None:
        user = identity_of(dict(userinfo))
        try:
            refused = await check_schedule(
                manager.kube, str(kwargs.get("operation")), dict(body), user, manager.keyring
            )
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(part) for part in ("spec", *first.get("loc", ())))
            raise kopf.AdmissionError(f"{where}: {first.get('msg', 'invalid')}", code=422) from err
        if refused is not None:
            raise kopf.AdmissionError(refused[1], code=refused[0])

    kopf.on.mutate(
        GROUP,
        VERSION,
        AGENT_SCHEDULE_PLURAL,
        id=SCHEDULE_STAMP_PATH,
        operations=["CREATE"],
        registry=registry,
    )(stamp_schedule)
    kopf.on.validate(
        GROUP,
        VERSION,
        AGENT_SCHEDULE_PLURAL,
        id=SCHEDULE_PATH,
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )(review_schedule)
