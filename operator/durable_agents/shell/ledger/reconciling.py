"""What the dispatcher is told about an action whose outcome is unknown: by the authoritative
system (the effect's query), or by a person (``spec.reconciliations`` on its run).

A person's answer comes first, and only one the operator can verify
(:func:`durable_agents.core.reconciliations.person_answer`): stamped by the admission webhook
(which let only the run's approvers write it), for this record and its attempt now. "Applied": the
record succeeds with ``{"reconciledBy", "reason"}`` as its outcome and nothing is sent again; "not
applied": it is sent again with the same idempotency key, as after a query answering NotApplied.
An entry that does not verify (written while the webhook was off, by hand, copied from another
run) is never acted on: a Warning Event on the run and on the record says why (once per entry and
process), and the effect's query is asked as before. This is the second line behind the webhook.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from durable_agents.api.v1alpha1 import ActionRecordSpec, ActionRecordStatus, ActionState
from durable_agents.core.reconciliations import Ignored, person_answer
from durable_agents.core.sealing import Keyring
from durable_agents.shell.effects import Applied, NotApplied, QueryResult, Unknown
from durable_agents.shell.ground import metrics
from durable_agents.shell.observability.events import EventRecorder

log = logging.getLogger(__name__)
NOT_ACTED_ON = "ReconciliationNotActedOn"
_WARNED_LIMIT = 4096  # entries warned about, remembered so that a query loop does not repeat them


@dataclass(frozen=True)
class Said:
    """An answer about a record, and how the dispatcher records it (status reason and message,
    the Event's message)."""

    result: QueryResult
    reason: str | None
    message: str | None
    event: str


def system_said(answer: QueryResult, spec: ActionRecordSpec) -> Said:
    """The effect's query's answer (counted in ``durable_agents_action_queries_total``)."""
    metrics.ACTION_QUERIES.labels(spec.effect, type(answer).__name__).inc()
    key = spec.idempotency_key
    if isinstance(answer, Applied):
        return Said(answer, None, None, f"the authoritative system applied key={key}")
    if isinstance(answer, NotApplied):
        message = "the authoritative system has no record of this key"
        return Said(answer, "NotApplied", message, f"key={key} was not applied: dispatching again")
    assert isinstance(answer, Unknown)
    return Said(answer, answer.reason, answer.message, f"query: {answer.reason}: {answer.message}")


class PersonAnswers:
    """People's verified answers for the dispatcher's unknown outcomes."""

    def __init__(self, events: EventRecorder, keyring: Keyring | None) -> None:
        self.events = events
        self.keyring = keyring
        self._warned: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()

    async def said(
        self, record: dict[str, Any], status: ActionRecordStatus, run: dict[str, Any] | None
    ) -> Said | None:
        """The answer of a person for ``record`` (at its attempt now) that verifies, or None."""
        if run is None or status.state is not ActionState.OUTCOME_UNKNOWN:
            return None
        name = record["metadata"]["name"]
        found, ignored = person_answer(run, name, status.attempts, self.keyring)
        for item in ignored:
            await self._warn(record, run, item)
        if found is None:
            return None
        spec = ActionRecordSpec.model_validate(record["spec"])
        said = found.said()
        log.info("%s/%s %s", record["metadata"]["namespace"], name, said)
        if found.applied:
            outcome = {"reconciledBy": found.by, "reason": found.reason}
            return Said(Applied(outcome), "ReconciledApplied", said, f"{said}: not sent again")
        event = f"{said}: dispatching again with the same key={spec.idempotency_key}"
        return Said(NotApplied(), "ReconciledNotApplied", said, event)

    async def _warn(self, record: dict[str, Any], run: dict[str, Any], item: Ignored) -> None:
        meta = record["metadata"]
        seen = (meta["namespace"], meta["name"], item.key, item.problem.reason)
        if seen in self._warned:
            return
        self._warned[seen] = None
        while len(self._warned) > _WARNED_LIMIT:
            self._warned.popitem(last=False)
        message = (
            f"not acting on spec.reconciliations[{item.key!r}] for ActionRecord {meta['name']}: "
            f"{item.problem.reason}: {item.problem.message}; its outcome stays unknown"
        )
        log.warning("%s/%s: %s", meta["namespace"], run["metadata"]["name"], message)
        await self.events.record(run, NOT_ACTED_ON, message, warning=True)
        await self.events.record(record, NOT_ACTED_ON, message, warning=True)
