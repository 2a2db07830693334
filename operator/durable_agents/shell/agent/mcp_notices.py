"""What an MCP server says besides its answer, bounded: log notifications, progress notifications,
and the size of its HTTP responses.

A server is outside the operator's trust. Whatever it sends while a call is open must neither fail
the call nor cost the operator unbounded memory, log volume or API writes:

* Log notifications (``notifications/message``) go to the operator's log at DEBUG, with the
  server's name, each cut to :data:`LOG_MESSAGE_MAX_CHARS`, at most :data:`LOG_BURST` lines at once
  and :data:`LOG_LINES_PER_SECOND` after that (a token bucket per call); the rest are counted and
  said once, when the call ends.
* Progress notifications only replace the call's latest progress (:class:`ProgressSeen`): no I/O
  per notification. Who shows it decides how often it is written (:mod:`.mcp_progress`).
* Every HTTP response body the connection reads is counted; past :data:`RESPONSE_MAX_BYTES` the
  stream is cut (:class:`ResponseTooLarge`), so a result of 50 MiB is a clear failure that says
  its size, not 50 MiB parsed into memory. The connection asks for no encoding (``bounded_body.unencoded``)
  and a response encoded anyway is refused unread: what is counted are the bytes on the wire, and
  a gzip bomb of 4 MiB is gigabytes decoded.

A callback that raises would reach the SDK's receive loop, so every callback here swallows its own
failures: a notification can never fail a call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import httpx2

from durable_agents.shell.agent.bounded_body import bound_body, encoding_of

log = logging.getLogger("durable_agents.mcp.server_log")

LOG_MESSAGE_MAX_CHARS: Final = 512
LOG_BURST: Final = 20
LOG_LINES_PER_SECOND: Final = 5.0
RESPONSE_MAX_BYTES: Final = 4 * 1024 * 1024
"""One HTTP response of an MCP server (a result, or a stream of notifications and a result). The
model is given at most 16 KiB of a result anyway (``RESULT_MAX_BYTES``)."""
PROGRESS_MESSAGE_MAX_CHARS: Final = 256


class ResponseTooLarge(Exception):
    """A response of the server passed :data:`RESPONSE_MAX_BYTES`, or came encoded; not read."""


@dataclass
class ServerLog:
    """The log notifications of one call, forwarded at DEBUG within bounds."""

    server: str
    tokens: float = LOG_BURST
    last: float = field(default_factory=time.monotonic)
    forwarded: int = 0
    dropped: int = 0

    def _admit(self) -> bool:
        now = time.monotonic()
        self.tokens = min(float(LOG_BURST), self.tokens + (now - self.last) * LOG_LINES_PER_SECOND)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    async def __call__(self, params: Any) -> None:
        try:
            if not self._admit():
                self.dropped += 1
                return
            self.forwarded += 1
            data = params.data if isinstance(params.data, str) else repr(params.data)
            text = data[:LOG_MESSAGE_MAX_CHARS] + ("..." if len(data) > LOG_MESSAGE_MAX_CHARS else "")
            logger = str(params.logger)[:64] if params.logger is not None else "-"
            log.debug("MCP server %r logs (%s, %s): %r", self.server, params.level, logger, text)
        except Exception:  # a notification never fails a call
            self.dropped += 1

    def close(self) -> None:
        if self.dropped:
            log.debug(
                "MCP server %r: %d log messages of this call not forwarded (%d at once, %s a second)",
                self.server,
                self.dropped,
                LOG_BURST,
                LOG_LINES_PER_SECOND,
            )


@dataclass(frozen=True)
class Progress:
    """The latest progress a server reported for a call (``message`` cut, control characters kept
    out by the reader: it is the server's text)."""

    progress: float
    total: float | None
    message: str | None
    notifications: int


ProgressSink = Callable[[Progress], None]


@dataclass
class ProgressSeen:
    """The progress notifications of one call: the latest kept, handed to ``sink`` (which must be
    cheap: it runs in the SDK's receive loop)."""

    sink: ProgressSink | None = None
    latest: Progress | None = None
    notifications: int = 0

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        try:
            self.notifications += 1
            said = message[:PROGRESS_MESSAGE_MAX_CHARS] if isinstance(message, str) else None
            self.latest = Progress(
                float(progress), None if total is None else float(total), said, self.notifications
            )
            if self.sink is not None:
                self.sink(self.latest)
        except Exception:  # a notification never fails a call
            log.debug("a progress notification could not be kept", exc_info=True)


def bound_response(response: httpx2.Response, cut: list[str]) -> None:
    """Read ``response`` (from a response event hook: its body not read yet) up to
    :data:`RESPONSE_MAX_BYTES`, an encoded one not at all; why a response was cut goes into
    ``cut`` (the SDK reports the failure in its own words). Refused as the body is read, as the
    bound is, so the SDK meets both on the path it meets a lost stream on."""
    coding = encoding_of(response)
    if coding is None:
        limit, why = RESPONSE_MAX_BYTES, f"the server's response was larger than {RESPONSE_MAX_BYTES} bytes"
    else:
        limit = 0
        why = f"the server's response was encoded ({coding[:40]}) though none was asked for"

    def refuse() -> Exception:
        cut.append(why)
        return ResponseTooLarge(f"{why}: {response.request.url} not read")

    bound_body(response, limit, refuse)
