"""The slot rules of an AgentSchedule (CronJob's conventions): which schedule time is due, whether
it was missed for good, and the name of the run started for it. Pure: no I/O, no clock (``now``
is given).

A schedule time ("slot") is a whole minute. The run started for a slot is named
``<schedule>-<minutes since 1970, UTC>``: the same slot always gives the same name, so a second
replica, or this one after a crash, that starts the slot again is told AlreadyExists by the API
server. That is what makes a slot start at most once, not who owns the schedule.

Cron expressions are evaluated by ``cronsim`` (5 fields, in the schedule's time zone: a time that
a daylight-saving change skips or repeats is handled as cronsim documents, and each instant gets
its own name because names are made from UTC minutes).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from durable_agents.api.v1alpha1.schedules import SCHEDULE_NAME_MAX, SLOT_DIGITS

# CronJob's macros (robfig/cron's), as 5-field expressions.
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MINUTE = timedelta(minutes=1)


class ScheduleError(ValueError):
    """A schedule the operator cannot evaluate; the message names the field."""


def expression(schedule: str) -> str:
    """The 5-field form of ``schedule`` (a macro expanded); raises :class:`ScheduleError`."""
    text = " ".join(schedule.split())
    text = MACROS.get(text.lower(), text)
    fields = text.split(" ")
    if len(fields) != 5:
        raise ScheduleError(
            f"spec.schedule: {schedule!r} has {len(fields)} fields: a schedule has 5 (minute hour "
            "day-of-month month day-of-week), or is one of " + ", ".join(sorted(MACROS))
        )
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as err:
        raise ScheduleError(f"spec.schedule: {schedule!r} does not parse: {err}") from None
    return text


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; raises :class:`ScheduleError` if there is none."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            f"spec.timeZone: {name!r} is not a time zone of the IANA database "
            "(for example UTC, Europe/Berlin)"
        ) from None


def name_problem(name: str) -> str | None:
    """Why runs of a schedule of this name would collide on one name, or None."""
    if len(name) > SCHEDULE_NAME_MAX:
        return (
            f"metadata.name: {len(name)} characters, at most {SCHEDULE_NAME_MAX}: each run is named "
            f"<schedule>-<minutes since 1970> (up to {SLOT_DIGITS} digits) within 253 characters, so a "
            "longer name would cut the time off and make every run collide on one name"
        )
    return None


def problems(name: str, schedule: str, time_zone: str) -> list[str]:
    """Everything wrong with a schedule, each naming its field (empty: it can run)."""
    found = [] if (p := name_problem(name)) is None else [p]
    for check in (lambda: expression(schedule), lambda: zone(time_zone)):
        try:
            check()
        except ScheduleError as err:
            found.append(str(err))
    return found


def slot_minutes(slot: datetime) -> int:
    """A slot as whole minutes since 1970 (UTC)."""
    return int(slot.timestamp()) // 60


def run_name(schedule_name: str, slot: datetime) -> str:
    """The name of the run started for ``slot``: the same slot, the same name."""
    return f"{schedule_name}-{slot_minutes(slot)}"


def next_slot(schedule: str, time_zone: str, after: datetime) -> datetime:
    """The first slot strictly after ``after``, as a UTC instant."""
    start = after.astimezone(zone(time_zone)).replace(second=0, microsecond=0)
    return next(iter(CronSim(expression(schedule), start))).astimezone(UTC)


def latest_slot(schedule: str, time_zone: str, now: datetime) -> datetime:
    """The latest slot at or before ``now`` (cronsim walks backwards from the next minute)."""
    tz = zone(time_zone)
    start = (now.astimezone(tz) + MINUTE).replace(second=0, microsecond=0)
    return next(iter(CronSim(expression(schedule), start, reverse=True))).astimezone(UTC)


@dataclass(frozen=True)
class Due:
    """What is due at ``now``: ``slot``, the latest slot not yet started (None: none), ``missed``
    whether it is past its starting deadline (then it is never started), ``next`` the first slot
    after now."""

    slot: datetime | None
    missed: bool
    next: datetime


def due(
    schedule: str,
    time_zone: str,
    since: datetime,
    now: datetime,
    deadline_seconds: int | None,
) -> Due:
    """The slot due at ``now`` after ``since`` (the last slot started, else the schedule's
    creation), and whether it is missed for good: more than ``deadline_seconds`` late. Only the
    latest unstarted slot is ever started (CronJob's rule): earlier ones are passed over."""
    following = next_slot(schedule, time_zone, now)
    latest = latest_slot(schedule, time_zone, now)
    if latest <= since:
        return Due(None, False, following)
    missed = deadline_seconds is not None and (now - latest).total_seconds() > deadline_seconds
    return Due(latest, missed, following)
