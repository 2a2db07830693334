"""The slot rules of AgentSchedules (core/schedules.py) and the schedule creator's stamp
(core/schedule_authority.py): pure, no cluster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_agents.api.v1alpha1 import SCHEDULE_NAME_MAX, AgentRunSpec, AgentScheduleSpec, Identity
from durable_agents.core import schedules
from durable_agents.core.schedule_authority import (
    run_body,
    schedule_unproven,
    stamp_schedule,
    template_problem,
    vouched_creator,
)
from durable_agents.core.stamps import Purpose
from durable_agents_testkit.keys import session_keyring

T0 = datetime(2026, 12, 3, 16, 0, tzinfo=UTC)
TEMPLATE = {"taskType": "nightly", "objective": "report", "steps": [{"name": "done", "complete": {}}]}
moments = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))
expressions = st.sampled_from(["* * * * *", "*/5 * * * *", "0 * * * *", "30 2 * * *", "0 0 1 * *", "@weekly"])
zones = st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"])


@given(expressions, zones, moments)
def test_the_due_slot_is_the_latest_at_or_before_now_and_the_next_is_after(
    expr: str, tz: str, now: datetime
) -> None:
    found = schedules.due(expr, tz, now - timedelta(days=400), now, None)
    assert found.slot is not None
    assert found.slot <= now < found.next
    assert schedules.next_slot(expr, tz, found.slot) == found.next, "no slot between the due one and the next"
    assert found.slot.second == 0
    assert found.slot.microsecond == 0


@given(expressions, zones, moments)
def test_a_started_slot_is_not_due_again(expr: str, tz: str, now: datetime) -> None:
    slot = schedules.due(expr, tz, now - timedelta(days=400), now, None).slot
    assert slot is not None
    assert schedules.due(expr, tz, slot, now, None).slot is None


@given(moments, st.integers(min_value=1, max_value=3600))
def test_a_slot_later_than_its_deadline_is_missed(now: datetime, deadline: int) -> None:
    found = schedules.due("* * * * *", "UTC", now - timedelta(days=1), now, deadline)
    assert found.slot is not None
    late = (now - found.slot).total_seconds()
    assert found.missed == (late > deadline)


@given(st.lists(moments, min_size=2, max_size=20, unique_by=lambda m: schedules.slot_minutes(m)))
def test_run_names_are_one_per_slot(slots_: list[datetime]) -> None:
    names = [schedules.run_name("nightly", s) for s in slots_]
    assert len(set(names)) == len(names), "two times never share a name"
    assert all(len(n) <= 253 for n in (schedules.run_name("x" * SCHEDULE_NAME_MAX, s) for s in slots_))


def test_the_same_slot_always_gives_the_same_name() -> None:
    assert (
        schedules.run_name("nightly", T0)
        == schedules.run_name("nightly", T0.astimezone())
        == "nightly-29938560"
    )


def test_a_repeated_local_hour_gives_two_instants_two_names() -> None:
    # 2026-11-01 01:30 happens twice in New York (daylight saving ends).
    first = schedules.next_slot("30 1 * * *", "America/New_York", datetime(2026, 11, 1, 5, 0, tzinfo=UTC))
    assert first == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)
    names = {schedules.run_name("s", first)}
    later = schedules.next_slot("30 1 * * *", "America/New_York", first)
    names.add(schedules.run_name("s", later))
    assert len(names) == 2


@pytest.mark.parametrize(
    ("name", "expr", "tz", "field"),
    [
        ("ok", "61 * * * *", "UTC", "spec.schedule"),
        ("ok", "* * * * * *", "UTC", "spec.schedule"),  # seconds: several runs a minute, one name
        ("ok", "every minute", "UTC", "spec.schedule"),
        ("ok", "* * * * *", "Mars/Olympus_Mons", "spec.timeZone"),
        ("ok", "* * * * *", "../../etc/passwd", "spec.timeZone"),
        ("x" * (SCHEDULE_NAME_MAX + 1), "* * * * *", "UTC", "metadata.name"),
    ],
)
def test_bad_schedules_name_their_field(name: str, expr: str, tz: str, field: str) -> None:
    found = schedules.problems(name, expr, tz)
    assert len(found) == 1, found
    assert found[0].startswith(f"{field}:"), found


def test_good_schedules_have_no_problem() -> None:
    assert schedules.problems("x" * SCHEDULE_NAME_MAX, "@daily", "Europe/Berlin") == []
    assert schedules.expression("@hourly") == "0 * * * *"


def _spec(creator: dict[str, object] | None, template: dict[str, object] = TEMPLATE) -> AgentScheduleSpec:
    return AgentScheduleSpec.model_validate(
        {"schedule": "* * * * *", "runTemplate": template, "createdBy": creator}
    )


def test_the_creator_stamp_verifies_only_for_its_schedule_template_and_time() -> None:
    keyring = session_keyring()
    carol = Identity(username="carol", groups=["team"])
    creator = stamp_schedule(keyring, "ns", "nightly", carol, T0, AgentRunSpec.model_validate(TEMPLATE))
    assert schedule_unproven(keyring, "ns", "nightly", _spec(creator), T0) is None
    assert schedule_unproven(keyring, "ns", "other", _spec(creator), T0) is not None, "another schedule"
    assert schedule_unproven(keyring, "other", "nightly", _spec(creator), T0) is not None, "another namespace"
    changed = {**TEMPLATE, "serviceAccountName": "deployer"}
    assert schedule_unproven(keyring, "ns", "nightly", _spec(creator, changed), T0) is not None, (
        "another template"
    )
    assert (
        schedule_unproven(keyring, "ns", "nightly", _spec({**creator, "username": "admin"}), T0) is not None
    )
    recreated = T0 + timedelta(minutes=5)
    assert schedule_unproven(keyring, "ns", "nightly", _spec(creator), recreated) is not None, (
        "a copied createdBy"
    )
    unproven = schedule_unproven(keyring, "ns", "nightly", _spec(None), T0)
    assert unproven is not None
    assert unproven.reason == "Unstamped"


def test_a_schedule_stamp_is_never_a_runs() -> None:
    keyring = session_keyring()
    creator = stamp_schedule(
        keyring, "ns", "n", Identity(username="carol"), T0, AgentRunSpec.model_validate(TEMPLATE)
    )
    assert creator["stamp"]
    assert Purpose.SERVICE_ACCOUNT
    run = {"metadata": {"name": "n", "namespace": "ns"}, "spec": {**TEMPLATE, "createdBy": creator}}
    assert not vouched_creator(run, Identity(username="system:serviceaccount:ns:default"), keyring, T0)


def test_a_template_carries_no_requests_and_a_run_takes_none() -> None:
    assert template_problem({**TEMPLATE, "approvals": {"a": {}}}) is not None
    assert template_problem({**TEMPLATE, "createdBy": {"username": "admin"}}) is not None
    assert template_problem(TEMPLATE) is None
    schedule = {"metadata": {"name": "nightly", "namespace": "ns", "uid": "u1"}}
    body = run_body(schedule, _spec(None), T0, "nightly-29938560")
    assert "createdBy" not in body["spec"]
    assert "approvals" not in body["spec"]
    assert body["metadata"]["ownerReferences"][0] == {
        "apiVersion": "durable-agents.io/v1alpha1",
        "kind": "AgentSchedule",
        "name": "nightly",
        "uid": "u1",
        "controller": True,
    }
