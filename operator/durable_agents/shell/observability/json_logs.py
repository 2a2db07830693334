"""The operator's log format: ``text`` (one human line) or ``json`` (one JSON object a line).

Chosen once at start-up by ``DURABLE_AGENTS_LOG_FORMAT`` (the chart sets ``json``). A JSON line
has ``time`` (UTC, RFC 3339), ``level``, ``logger`` and ``message`` (the text line's message),
``exception`` when there is one, and the structured fields a line carries under
:data:`durable_agents.shell.observability.run_traces.FIELDS` at the top level: a committed transition's and a
dispatch's run, namespace, stateVersion, event, traceId, region, shard and holder.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from durable_agents.shell.observability.run_traces import FIELDS

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")
_RESERVED = frozenset({"time", "level", "logger", "message", "exception", "stack"})


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            # A field never hides what the line says (the message, its level).
            out.update({k: v for k, v in fields.items() if k not in _RESERVED and v is not None})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure_logging(level: str, log_format: str) -> None:
    """Install the root handler (stderr) in ``log_format``; once, at start-up."""
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r}: expected one of {', '.join(FORMATS)}")
    logging.basicConfig(level=level, format=TEXT_FORMAT)
    if log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
