"""``AgentSchedule``: runs of an Agent (or a scripted run) started on a cron schedule.

The conventions are Kubernetes CronJob's: a 5-field cron expression in a named time zone, a
concurrency policy (Allow, Forbid, Replace), a starting deadline for missed times, history limits,
suspend. Each run is named from its scheduled time (``<schedule>-<minutes since 1970>``), so two
operator replicas, or one that crashed after starting a run, never start the same time twice.

A schedule starts runs with its creator's authority and no more: the admission webhook stamps
``spec.createdBy`` (the creator, who must be allowed to create AgentRuns and to ``use`` the
template's ServiceAccount and policy), and every run it starts carries that creator.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from durable_agents.api.v1alpha1.agentrun import AgentRunSpec
from durable_agents.api.v1alpha1.meta import (
    API_VERSION,
    CONDITIONS_SCHEMA_EXTRA,
    ApiModel,
    Condition,
    cel,
    immutable,
)
from durable_agents.api.v1alpha1.requests import Creator

# A started run is named ``<schedule>-<minutes since 1970>`` (at most 10 digits until the year
# 20982): a schedule's name leaves room for that in a run's name (253 characters).
RUN_NAME_MAX = 253
SLOT_DIGITS = 10
SCHEDULE_NAME_MAX = RUN_NAME_MAX - 1 - SLOT_DIGITS
SCHEDULE_LABEL = "durable-agents.io/schedule"
"""On each run a schedule started: the schedule's name (hashed when it does not fit a label)."""
SCHEDULED_AT_ANNOTATION = "durable-agents.io/scheduled-at"
"""On each run a schedule started: the schedule time it was started for (RFC 3339, UTC)."""


class ConcurrencyPolicy(StrEnum):
    """What a schedule does at a time when a run it started is still running (CronJob's)."""

    ALLOW = "Allow"
    FORBID = "Forbid"
    REPLACE = "Replace"


class AgentScheduleSpec(ApiModel):
    """When to start runs, and the run to start."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.createdBy) == has(oldSelf.createdBy)",
                    "createdBy cannot be added or removed after creation",
                    fieldPath=".createdBy",
                ),
            ]
        }
    )

    schedule: str = Field(min_length=1, max_length=128)
    """A 5-field cron expression (minute hour day-of-month month day-of-week), or @hourly, @daily,
    @weekly, @monthly, @yearly; checked by the admission webhook."""
    time_zone: str = Field(default="UTC", min_length=1, max_length=64)
    """The IANA time zone the schedule is read in (for example Europe/Berlin); default UTC."""
    concurrency_policy: ConcurrencyPolicy = ConcurrencyPolicy.ALLOW
    """At a time when a run this schedule started is still running: Allow starts another, Forbid
    skips the time, Replace cancels the running one (its own cancellation) and starts the new."""
    starting_deadline_seconds: int | None = Field(default=None, ge=1, le=86400 * 366)
    """A time not started within this many seconds of it (the operator was down, the schedule
    suspended, Forbid skipped it) is missed for good. Unset: only the latest missed time is started,
    however late."""
    successful_runs_history_limit: int = Field(default=3, ge=0, le=100)
    """Completed runs to keep; older ones this schedule started are deleted."""
    failed_runs_history_limit: int = Field(default=1, ge=0, le=100)
    """Failed, canceled or expired runs to keep; older ones this schedule started are deleted."""
    suspend: bool = False
    """True: start nothing (times passing meanwhile are missed, subject to the deadline)."""
    run_template: AgentRunSpec = Field(json_schema_extra=immutable("runTemplate"))
    """The spec of each run started (an agentRef, an inline agent or scripted steps). Immutable:
    runs start with the creator's authority, so what they run is what the creator wrote."""
    created_by: Creator | None = Field(
        default=None,
        description=(
            "The schedule's creator, stamped by the admission webhook: every run it starts is created "
            "as theirs (spec.createdBy), after the operator checked again that they may create it."
        ),
        json_schema_extra=immutable("createdBy"),
    )


class AgentScheduleStatus(ApiModel):
    """What the schedule started; written by the operator."""

    last_schedule_time: datetime | None = None
    """The latest schedule time a run was started for."""
    last_successful_time: datetime | None = None
    """When a run it started last completed."""
    active: list[Annotated[str, Field(max_length=RUN_NAME_MAX)]] = Field(default_factory=list, max_length=64)
    """The runs it started that are not finished."""
    next_schedule_time: datetime | None = None
    """The next time a run is due (while not suspended)."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=8, json_schema_extra=CONDITIONS_SCHEMA_EXTRA
    )
    """Ready (the schedule is valid and its creator's authority verified: False says why nothing
    starts) and Skipped (the last time not started, and why)."""


class AgentSchedule(ApiModel):
    """Runs started on a cron schedule, with their creator's authority (CronJob's conventions)."""

    api_version: Literal["durable-agents.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["AgentSchedule"] = "AgentSchedule"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: AgentScheduleSpec
    status: AgentScheduleStatus | None = None


AGENT_SCHEDULE_PLURAL = "agentschedules"
SCHEDULE_NAME_RULE = cel(
    f"!has(self.metadata.name) || size(self.metadata.name) <= {SCHEDULE_NAME_MAX}",
    f"metadata.name: at most {SCHEDULE_NAME_MAX} characters: each run is named <schedule>-<minutes since "
    "1970>, and a longer name would make the runs of different times collide on one name",
)
