"""Reads the API server's audit log: exactly which requests one user made, and when."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class AuditEntry:
    user: str
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    at: datetime

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS

    @property
    def what(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def parse_audit_line(line: str | bytes, stage: str = "ResponseComplete") -> AuditEntry | None:
    """One audit log line as an entry; None for a line still being written or of another stage
    (``ResponseStarted``: a watch as it begins, logged once per watch request)."""
    try:
        raw: dict[str, Any] = json.loads(line)
    except json.JSONDecodeError:
        return None  # a line still being written
    if raw.get("stage") != stage:
        return None
    ref = raw.get("objectRef") or {}
    return AuditEntry(
        user=(raw.get("user") or {}).get("username", ""),
        verb=raw.get("verb", ""),
        resource=ref.get("resource", ""),
        subresource=ref.get("subresource", ""),
        namespace=ref.get("namespace", ""),
        name=ref.get("name", ""),
        code=int((raw.get("responseStatus") or {}).get("code", 0)),
        at=datetime.fromisoformat(raw["requestReceivedTimestamp"].replace("Z", "+00:00")),
    )


def audit_offset(path: Path) -> int:
    """Where the log ends now: pass it to ``read_audit`` to read only what comes after."""
    return path.stat().st_size if path.exists() else 0


def read_audit(
    path: Path,
    *,
    user: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    offset: int = 0,
    mentions: str | None = None,
    stage: str = "ResponseComplete",
) -> list[AuditEntry]:
    """The responses in the log (from byte ``offset`` on: it only grows) that match, and whose
    line contains ``mentions`` (a cheap filter: say, a namespace); of ``stage``, completed ones
    unless asked otherwise."""
    # Cheap byte checks before parsing: by the end of a suite the log holds hundreds of MB.
    needles = [f'"{stage}"'.encode()] + [n.encode() for n in (user, mentions) if n is not None]
    entries: list[AuditEntry] = []
    with path.open("rb") as f:
        f.seek(offset)
        for line in f:
            if not all(needle in line for needle in needles):
                continue
            entry = parse_audit_line(line, stage)
            if entry is None or (user is not None and entry.user != user):
                continue
            if (since is not None and entry.at < since) or (until is not None and entry.at >= until):
                continue
            entries.append(entry)
    return entries


def count_by(entries: list[AuditEntry]) -> Counter[str]:
    return Counter(f"{e.verb} {e.what}" for e in entries)
