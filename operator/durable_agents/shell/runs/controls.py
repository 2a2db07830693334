"""The operator's side of the on-call controls ``spec.reconcileNow`` and ``spec.escalation``
(:mod:`durable_agents.core.controls`; stamped by :mod:`.controls_admission`).

The run's worker (the replica holding its shard) looks at each run before deciding on it
(:meth:`Controls.look`). A request not yet acted on whose stamp does not verify (written while the
webhook was off, or by hand) is refused once: ``status.refusedRequests``, condition
``RequestRefused`` and a Warning Event, as for the other controls. A verified one:

- escalation: condition ``Escalated`` (True, who and why), ``status.escalation``, a Warning Event
  ``Escalated``, ``durable_agents_escalations_total``; ``durable_agents_escalated_runs`` counts the
  runs this replica holds that carry the condition.
- reconcile now: each of the run's ActionRecords whose outcome is unknown (or the one named) is
  asked about at once through this process's dispatcher (its paced wait dropped), and the answers
  go to ``status.reconcileNow`` (``kubectl agentrun reconcile RUN --wait`` prints them), each
  counted in ``durable_agents_reconcile_requests_total{answer}``.

These are status writes between transitions (compare-and-swap on the resourceVersion read, the
other conditions kept); the engine's commits carry both fields and the ``Escalated`` condition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import Counter, Gauge

from durable_agents.api.v1alpha1 import (
    GROUP,
    VERSION,
    ActionState,
    AgentRunStatus,
    EscalationRequest,
    EscalationStatus,
    ReconcileAnswer,
    ReconcileNowRequest,
    ReconcileNowStatus,
)
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.core.controls import (
    ESCALATED,
    ControlField,
    control_unproven,
    escalated_condition,
    is_escalated,
    pending,
    who,
    with_condition,
)
from durable_agents.core.engine.commits import REQUEST_REFUSED, already_refused, refusal_of, refuse
from durable_agents.core.engine.snapshot import RunSnapshot
from durable_agents.core.outcome_stamps import believed_status
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ground.store import Conflict, Gone, RunStore
from durable_agents.shell.observability.events import EventRecorder
from durable_agents.shell.ownership.leases import run_label

if TYPE_CHECKING:
    from durable_agents.shell.ledger.dispatcher import Dispatcher

log = logging.getLogger(__name__)
ObjectKey = tuple[str, str]

ANSWERS: Final = (
    "Applied",
    "NotApplied",
    "Unknown",
    "NotUnknown",
    "NothingUnknown",
    "NoDispatcher",
    "Refused",
)
RECONCILE_REQUESTS = Counter(
    "durable_agents_reconcile_requests_total",
    "On-call 'ask now' requests (kubectl agentrun reconcile RUN) acted on: one per action asked, by "
    "its answer (NothingUnknown: no action of the run was unknown; Refused: not stamped)",
    ["answer"],
)
for _answer in ANSWERS:
    RECONCILE_REQUESTS.labels(_answer)
ESCALATIONS = Counter("durable_agents_escalations_total", "Runs escalated to a person (verified requests)")
ESCALATED_RUNS = Gauge(
    "durable_agents_escalated_runs", "Runs whose shard this replica holds with condition Escalated=True"
)


def answer_of(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, str]:
    """What the system said, from the record before and after asking: sent again (more attempts)
    after "not applied", succeeded after "applied", or still unknown."""
    was, status = before.get("status") or {}, after.get("status") or {}
    state = status.get("state") or ActionState.INTENT.value
    message = str(status.get("message") or status.get("reason") or "")[:512]
    if int(status.get("attempts") or 0) > int(was.get("attempts") or 0):
        return "NotApplied", f"not applied: sent again with the same key (now {state})"
    if state == ActionState.SUCCEEDED.value:
        return "Applied", message
    if state == ActionState.OUTCOME_UNKNOWN.value:
        return "Unknown", message
    return "NotApplied", f"not applied ({state})"


class Controls:
    def __init__(
        self,
        kube: Kube,
        store: RunStore,
        events: EventRecorder,
        keyring: Keyring | None,
        held: Callable[[str, str], object] = lambda _namespace, _name: True,
    ) -> None:
        self.kube, self.store, self.events, self.keyring = kube, store, events, keyring
        self.dispatcher: Callable[[], Dispatcher | None] = lambda: None  # set by the manager
        self._escalated: set[ObjectKey] = set()
        # Counted when scraped: only the runs whose shard is held now (a shard lost since the run
        # was last looked at no longer counts here; its new holder counts it).
        self._held = held
        ESCALATED_RUNS.set_function(lambda: sum(1 for key in list(self._escalated) if self._held(*key)))

    def forget(self, key: ObjectKey) -> None:
        self._escalated.discard(key)

    async def look(self, key: ObjectKey, body: dict[str, Any], snap: RunSnapshot, owned: bool) -> bool:
        """Act on the run's pending control requests if this replica holds it; True when the run
        was written (the caller reads it again)."""
        if not owned:
            self.forget(key)
            return False
        spec, status = snap.spec, snap.status
        (self._escalated.add if is_escalated(status) else self._escalated.discard)(key)
        try:
            fields: tuple[ControlField, ...] = ("escalation", "reconcileNow")
            for field in fields:
                request = pending(spec, status, field)
                if request is not None and await self._act(key, body, field, request):
                    return True
        except (Conflict, Gone):
            return True  # it moved meanwhile: looked at again from what is stored
        return False

    async def _act(self, key: ObjectKey, body: dict[str, Any], field: ControlField, request: Any) -> bool:
        snap = RunSnapshot.from_object(body)
        problem = control_unproven(self.keyring, snap.run_id, field, request)
        if problem is not None:
            if already_refused(snap.status, field, request.token):
                return False
            refusal = refuse(snap, refusal_of(field, request.token, problem, datetime.now(UTC)))
            written = await self.store.commit_status(body, refusal.wire_status())
            if field == "reconcileNow":
                RECONCILE_REQUESTS.labels("Refused").inc()
            log.warning("%s/%s request refused: %s", *key, refusal.refused.message)
            await self.events.record(written, REQUEST_REFUSED, refusal.refused.message, warning=True)
            return True
        if isinstance(request, EscalationRequest):
            await self._escalate(key, body, request)
        else:
            await self._ask_now(key, body, request)
        return True

    async def _escalate(self, key: ObjectKey, body: dict[str, Any], request: EscalationRequest) -> None:
        now = datetime.now(UTC)
        status = AgentRunStatus.model_validate(body.get("status") or {})
        condition = escalated_condition(request, now, (body.get("metadata") or {}).get("generation"))
        wire = dict(body.get("status") or {})
        wire["conditions"] = [c.wire() for c in with_condition(status.conditions, condition)]
        wire["escalation"] = EscalationStatus(
            token=request.token,
            reason=request.reason,
            escalated_by=who(request.requested_by),
            escalated_at=now,
        ).wire()
        written = await self.store.commit_status(body, wire)
        ESCALATIONS.inc()
        self._escalated.add(key)
        log.warning("%s/%s escalated: %s", *key, condition.message)
        await self.events.record(written, ESCALATED, condition.message, warning=True)

    async def _ask_now(self, key: ObjectKey, body: dict[str, Any], request: ReconcileNowRequest) -> None:
        answers: list[ReconcileAnswer] = []
        dispatcher = self.dispatcher()
        for record in await self._records(key, request.action):
            name = record["metadata"]["name"]
            state = self._believed(record)["status"]["state"]
            if state != ActionState.OUTCOME_UNKNOWN.value:
                answers.append(ReconcileAnswer(action=name, answer="NotUnknown", message=f"it is {state}"))
            elif dispatcher is None:
                message = "this operator process runs no dispatcher: asked at the next paced query"
                answers.append(ReconcileAnswer(action=name, answer="NoDispatcher", message=message))
            else:
                dispatcher.pacing.forget((key[0], name))  # asked now, not after the paced wait
                after = await dispatcher.reconcile(record)
                said, message = answer_of(self._believed(record), self._believed(after))
                answers.append(ReconcileAnswer(action=name, answer=said, message=message))
        if request.action is not None and not answers:
            message = "no ActionRecord of this run has that name"
            answers.append(ReconcileAnswer(action=request.action, answer="NotUnknown", message=message))
        for answer in answers or [ReconcileAnswer(action="", answer="NothingUnknown")]:
            RECONCILE_REQUESTS.labels(answer.answer).inc()
        asked = ReconcileNowStatus(
            token=request.token,
            asked_by=who(request.requested_by),
            asked_at=datetime.now(UTC),
            answers=answers[:32],
        )
        current = await self.store.get(*key)  # the dispatcher's answers may have moved the run on
        if ((current.get("spec") or {}).get("reconcileNow") or {}).get("token") != request.token:
            return  # a newer request: acted on in its own turn
        await self.store.commit_status(
            current, {**(current.get("status") or {}), "reconcileNow": asked.wire()}
        )
        said = ", ".join(f"{a.action}: {a.answer}" for a in answers) or "no action's outcome is unknown"
        log.info("%s/%s asked now (%s): %s", *key, request.token, said)

    async def _records(self, key: ObjectKey, action: str | None) -> list[dict[str, Any]]:
        """The run's ActionRecords (or the one named): asked about when their outcome is unknown."""
        listed = await self.kube.call(
            self.kube.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            key[0],
            "actionrecords",
            label_selector=f"{RUN_LABEL}={run_label(key[1])}",
        )
        items = [
            item
            for item in listed.get("items") or []
            if ((item.get("spec") or {}).get("runRef") or {}).get("name") == key[1]
        ]
        if action is not None:
            return [item for item in items if item["metadata"]["name"] == action]
        unknown = ActionState.OUTCOME_UNKNOWN.value
        return [i for i in items if self._believed(i)["status"]["state"] == unknown]

    def _believed(self, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` with its status as the operator wrote it (outcome stamp verified): a forged
        settled state is unknown, and asked about."""
        return {**record, "status": believed_status(record, self.keyring, datetime.now(UTC)).wire()}
