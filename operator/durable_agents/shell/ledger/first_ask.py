"""The question asked of the authoritative system before an action's first send (a record
restored from an old backup says ``intent`` for an effect that may have happened after it)."""

from __future__ import annotations

import logging
from typing import Any

from durable_agents.api.v1alpha1 import ActionRecordSpec, ActionRecordStatus, ActionState
from durable_agents.shell.effects import NotApplied, Unknown
from durable_agents.shell.ground import metrics
from durable_agents.shell.ledger.dispatch_config import Send
from durable_agents.shell.ledger.record_writes import RecordWrites
from durable_agents.shell.ledger.unsealing import sealed_outcome
from durable_agents.shell.observability import run_traces

log = logging.getLogger(__name__)
A = ActionState


async def ask_before_first_dispatch(
    writes: RecordWrites,
    claimed: dict[str, Any],
    status: ActionRecordStatus,
    spec: ActionRecordSpec,
    send: Send,
) -> dict[str, Any] | None:
    """The key asked of the authoritative system before the first send.

    An ActionRecord restored from an older backup says ``intent`` for an effect that may have
    happened after the backup; only the authoritative system knows. None: send. A question it
    cannot answer (down, or the ServiceAccount may not read) does not hold the send back: the
    send meets the same system, and its answer (definite, or unknown and then reconciled) is
    what the record keeps. The restore guarantee therefore needs a system that answers queries.
    """
    answer = await run_traces.queried(send.effect, send.ctx, send.action)
    metrics.ACTION_QUERIES.labels(spec.effect, type(answer).__name__).inc()
    if isinstance(answer, Unknown):
        log.warning(
            "%s/%s: asking before the first dispatch got no answer (%s: %s); sending",
            claimed["metadata"]["namespace"],
            claimed["metadata"]["name"],
            answer.reason,
            answer.message,
        )
        return None
    if isinstance(answer, NotApplied):
        return None
    out = await writes.write(
        claimed,
        status,
        A.SUCCEEDED,
        outcome=sealed_outcome(answer.outcome, send.data_key, claimed["metadata"]["name"]),
        queried=True,
        reason="AlreadyApplied",
        message="the authoritative system had applied this key before its first dispatch here",
    )
    await writes.event(
        out,
        "Reconciled",
        f"key={spec.idempotency_key} was already applied (a restored record?): not sending",
        warning=True,
    )
    return out
