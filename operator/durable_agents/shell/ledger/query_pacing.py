"""When the dispatcher may ask again about an action whose outcome is unknown.

Each query that comes back unknown writes the record's status, and that write comes back to the
dispatcher as a watch event: without a pace, a record whose authoritative system cannot answer
(an MCP tool without a query, a query endpoint that is down) would be asked about again at once,
over and over. After an unknown answer the record waits :func:`~durable_agents.core.ledger.query_backoff`
(1 s doubling to 60 s) whatever wakes it, unless a person answers for it
(``spec.reconciliations`` on its run): then it is looked at again at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from durable_agents.api.v1alpha1 import ActionRecordStatus
from durable_agents.core.ledger import query_backoff
from durable_agents.shell.ground import metrics

ObjectKey = tuple[str, str]


class QueryPacing:
    def __init__(self) -> None:
        self._not_before: dict[ObjectKey, datetime] = {}

    def later(self, key: ObjectKey) -> datetime | None:
        """When ``key`` may be asked about again, if not yet."""
        at = self._not_before.get(key)
        if at is None or at <= datetime.now(UTC):
            self._not_before.pop(key, None)
            return None
        return at

    def asked(self, key: ObjectKey, queries: int) -> datetime:
        """The answer was unknown again: the next question waits."""
        at = datetime.now(UTC) + query_backoff(queries)
        self._not_before[key] = at
        return at

    def forget(self, key: ObjectKey) -> None:
        self._not_before.pop(key, None)

    def answered(self, run: Mapping[str, Any]) -> list[ObjectKey]:
        """The waiting records a person has answered for on this run (keys ``NAME`` or
        ``NAME.ATTEMPT``): they are asked about at once."""
        meta, spec = run.get("metadata") or {}, run.get("spec") or {}
        namespace = str(meta.get("namespace", ""))
        names = {str(entry).split(".")[0] for entry in spec.get("reconciliations") or {}}
        keys = [(namespace, name) for name in names if (namespace, name) in self._not_before]
        for key in keys:
            del self._not_before[key]
        return keys


def observe_unknown_duration(status: ActionRecordStatus) -> None:
    """How long the record's outcome was unknown, now that it is known."""
    if status.outcome_unknown_since is not None:
        waited = (datetime.now(UTC) - status.outcome_unknown_since).total_seconds()
        metrics.UNKNOWN_OUTCOME_SECONDS.observe(max(0.0, waited))
