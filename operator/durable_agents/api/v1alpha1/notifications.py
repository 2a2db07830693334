"""A policy's notifications: where the operator tells people that a run waits for them, ended or
is stuck (docs/policies/notifications.md; the pure rules: core/notifications.py)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from durable_agents.api.v1alpha1.meta import NAME_PATTERN, ApiModel


class NotificationFormat(StrEnum):
    """The body sent: a structured-mode CloudEvent, or a Slack-compatible incoming-webhook body."""

    CLOUDEVENTS = "cloudevents"
    SLACK = "slack"


class NotificationEvent(StrEnum):
    """What a target is told about."""

    APPROVAL_REQUESTED = "approvalRequested"
    INPUT_REQUESTED = "inputRequested"
    RUN_ENDED = "runEnded"
    RUN_STUCK = "runStuck"


ALL_NOTIFICATION_EVENTS = list(NotificationEvent)
NOTIFICATION_URL_PATTERN = r"^[hH][tT][tT][pP][sS]?://[^\s@#]+$"  # no userinfo or fragment


class NotificationTarget(ApiModel):
    """One receiver: an HTTP(S) endpoint that gets a POST per event, at least once, with an ID to
    deduplicate by. Its URL must be allowed by the policy's spec.destinations.notifications."""

    name: str = Field(max_length=63, pattern=NAME_PATTERN, description="Names the target in logs and Events.")
    url: str = Field(
        max_length=2048,
        pattern=NOTIFICATION_URL_PATTERN,
        description=(
            "Where the POST goes (http or https; no userinfo). Redirects are never followed. Must be "
            "allowed by spec.destinations.notifications when that list is set."
        ),
    )
    format: NotificationFormat = Field(
        default=NotificationFormat.CLOUDEVENTS,
        description=(
            "cloudevents: a CloudEvents 1.0 structured JSON body (application/cloudevents+json); "
            "slack: a Slack-compatible incoming-webhook body ({text, blocks})."
        ),
    )
    events: list[NotificationEvent] = Field(
        default_factory=lambda: list(ALL_NOTIFICATION_EVENTS),
        min_length=1,
        max_length=4,
        json_schema_extra={"x-kubernetes-list-type": "set"},
        description="What this target is told about (default: all four).",
    )
