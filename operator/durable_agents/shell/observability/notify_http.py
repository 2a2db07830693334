"""One attempt to deliver a notification: a POST of the notice's body to its target.

The body is a structured-mode CloudEvent made with the ``cloudevents`` SDK
(``application/cloudevents+json``), or a Slack-compatible incoming-webhook body (the pure parts:
:mod:`durable_agents.core.notifications`). An attempt succeeds only on a 2xx answer whose body
fits in :data:`BODY_LIMIT`; everything else is a failed attempt with an outcome word (the metric's
label) and a message naming the endpoint:

* ``timeout``: no full answer within the timeout (a receiver that hangs);
* ``http_error``: an answer other than 2xx (a 500, a 404);
* ``redirect``: a 3xx: never followed (it could lead outside the policy's allowlist);
* ``too_large``: an answer body over the limit: read in chunks up to it, never buffered whole;
* ``connection_error``: refused, reset, dropped mid-answer.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Final

import aiohttp
from cloudevents.core.bindings.http import to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from prometheus_client import Counter

from durable_agents.api.v1alpha1 import NotificationFormat
from durable_agents.core.notifications import Delivery, Notice, slack_body

BODY_LIMIT: Final = 64 * 1024  # bytes of a receiver's answer read at most
_CHUNK: Final = 8 * 1024
DELIVERED: Final = "delivered"
FAILED_OUTCOMES: Final = ("timeout", "http_error", "redirect", "too_large", "connection_error")
REFUSED: Final = "refused"  # outside the policy's allowlist: never sent
ABANDONED: Final = "abandoned"  # given up after the bounded time
WITHDRAWN: Final = "withdrawn"  # the policy no longer names the target (or is gone): not sent
OUTCOMES: Final = (DELIVERED, *FAILED_OUTCOMES, REFUSED, ABANDONED, WITHDRAWN)

DELIVERIES = Counter(
    "durable_agents_notification_deliveries_total",
    "Notification delivery attempts and their ends, by outcome (delivered, timeout, http_error, "
    "redirect, too_large, connection_error: one attempt each; refused, abandoned, withdrawn: one "
    "delivery each)",
    ["outcome"],
)
for _outcome in OUTCOMES:  # the series exist (at 0) on a live operator
    DELIVERIES.labels(_outcome)


@dataclass(frozen=True)
class Attempt:
    outcome: str
    message: str = ""

    @property
    def delivered(self) -> bool:
        return self.outcome == DELIVERED


def request_of(notice: Notice, format: NotificationFormat) -> tuple[dict[str, str], bytes]:
    """The headers and body of a notice in a target's format."""
    if format is NotificationFormat.SLACK:
        return {"Content-Type": "application/json"}, json.dumps(slack_body(notice)).encode()
    event = CloudEvent(attributes=notice.attributes(), data=dict(notice.data))
    message = to_structured(event, JSONFormat())
    return dict(message.headers), message.body


async def _bounded_read(response: aiohttp.ClientResponse) -> int:
    """Bytes of the answer, read in chunks and dropped; stops past :data:`BODY_LIMIT`."""
    read = 0
    while read <= BODY_LIMIT:
        chunk = await response.content.read(_CHUNK)
        if not chunk:
            break
        read += len(chunk)
    return read


async def attempt(session: aiohttp.ClientSession, delivery: Delivery, limit: float) -> Attempt:
    """POST the delivery once; never raises for what the receiver did."""
    headers, body = request_of(delivery.notice, delivery.target.format)
    headers["User-Agent"] = "durable-agents-notifier"
    endpoint = delivery.endpoint
    try:
        async with asyncio.timeout(limit):
            async with session.post(
                delivery.target.url, data=body, headers=headers, allow_redirects=False
            ) as resp:
                read = await _bounded_read(resp)
                if 300 <= resp.status < 400:
                    where = resp.headers.get("Location", "?")[:200]
                    return Attempt(
                        "redirect", f"{endpoint} answered {resp.status} to {where!r}: not followed"
                    )
                if read > BODY_LIMIT:
                    return Attempt("too_large", f"{endpoint} answered a body over {BODY_LIMIT} bytes")
                if not 200 <= resp.status < 300:
                    return Attempt(
                        "http_error", f"{endpoint} answered {resp.status} {resp.reason or ''}".strip()
                    )
                return Attempt(DELIVERED)
    except TimeoutError:
        return Attempt("timeout", f"{endpoint} gave no answer within {limit:g}s")
    except (aiohttp.ClientError, ConnectionError, asyncio.IncompleteReadError) as err:
        return Attempt("connection_error", f"{endpoint}: {type(err).__name__}: {err}"[:512])
