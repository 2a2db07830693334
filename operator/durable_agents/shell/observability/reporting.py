"""What follows a committed transition: metrics, one log line, and a Kubernetes Event if notable.

A refused request (a :class:`~durable_agents.core.engine.commits.Refusal`, written once per
request) always gets a Warning Event ``RequestRefused`` naming it; a run rejected at acceptance
gets its Event under the outcome's reason (``ServiceAccountNotAuthorized``). Nothing here can
change what was committed; an Event that fails to post is logged and dropped.

The Events of commits are posted in the background, a few at a time (:data:`IN_FLIGHT`), so a
burst of them (100,000 runs parking at once) never takes the threads run work needs; past
:data:`MAX_PENDING` waiting, a new one is dropped and counted (``durable_agents_events_dropped_total``),
as client-go's recorder drops on a full queue: the run's status history has the transition.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import Commit
from durable_agents.core.engine.commits import REQUEST_REFUSED, Refusal, StatusNote
from durable_agents.core.statemachine import RunEvent
from durable_agents.shell.ground import metrics
from durable_agents.shell.observability import run_traces
from durable_agents.shell.observability.commit_metrics import observe_commit
from durable_agents.shell.observability.events import NOTABLE, EventRecorder, reason_of

log = logging.getLogger("durable_agents.shell.runs.worker")
IN_FLIGHT = 4  # Events of commits posted at once
MAX_PENDING = 1000  # Events of commits waiting or in flight, past which a new one is dropped


class CommitReporter:
    def __init__(self, events: EventRecorder, *, all_events: bool = False) -> None:
        self.events = events
        self.all_events = all_events  # an Event for every transition, not only the notable ones
        self._background: set[asyncio.Task[None]] = set()
        self._sending = asyncio.Semaphore(IN_FLIGHT)
        self._dropping = False  # since the backlog was last full: said once per burst

    def report(self, body: dict[str, Any], before: RunState, commit: Commit) -> None:
        if isinstance(commit, StatusNote):  # no transition: nothing to count, one log line
            meta = body["metadata"]
            log.info("%s/%s status: %s", meta["namespace"], meta["name"], commit.detail)
            return
        if isinstance(commit, Refusal):
            meta = body["metadata"]
            log.warning("%s/%s request refused: %s", meta["namespace"], meta["name"], commit.refused.message)
            self._post(body, REQUEST_REFUSED, commit.refused.message, warning=True)
            if not commit.moved:
                return  # nothing else happened: no transition to count or report
        self._count(commit)
        observe_commit(before, commit)  # waits, approval latency, resume failures, ...
        message = self._describe(body, before, commit)
        log.info(
            "%s/%s %s: %s",
            body["metadata"]["namespace"],
            body["metadata"]["name"],
            commit.event.value,
            message,
            extra=run_traces.committed(body, before, commit),  # its span; the JSON line's fields
        )
        if not self.all_events and commit.event.value not in NOTABLE:
            return
        status = commit.status
        warning = status.state in (RunState.FAILED, RunState.QUARANTINED, RunState.EXPIRED)
        reason = reason_of(commit.event.value)
        if commit.event is RunEvent.REJECTED and status.outcome is not None:
            reason = status.outcome.reason  # why the run was not accepted says more than "Rejected"
        self._post(body, reason, message, warning=warning)

    async def flush(self) -> None:
        """Let the Events still being posted land (on a graceful stop), for at most 5 s."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=5.0)

    def _post(self, body: dict[str, Any], reason: str, message: str, *, warning: bool) -> None:
        if len(self._background) >= MAX_PENDING:
            metrics.EVENTS_DROPPED.inc()
            if not self._dropping:
                self._dropping = True
                log.warning(
                    "%d Kubernetes Events are waiting to be posted: new ones are dropped until fewer"
                    " wait (the runs' status history has every transition)",
                    len(self._background),
                )
            return
        if len(self._background) < MAX_PENDING // 2:
            self._dropping = False
        task = asyncio.create_task(self._send(body, reason, message, warning))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _send(self, body: dict[str, Any], reason: str, message: str, warning: bool) -> None:
        async with self._sending:
            await self.events.record(body, reason, message, warning=warning)

    @staticmethod
    def _count(commit: Commit) -> None:
        metrics.TRANSITIONS.labels(commit.event.value).inc()
        status = commit.status
        if status.state.terminal:
            reason = status.outcome.reason if status.outcome else status.state.value
            metrics.TERMINAL_OUTCOMES.labels(status.state.value, reason).inc()
        if status.state is RunState.QUARANTINED and status.outcome:
            metrics.QUARANTINES.labels(status.outcome.reason).inc()
        if commit.migrated_from is not None:
            metrics.CHECKPOINT_MIGRATIONS.labels(str(commit.migrated_from)).inc()
        if (
            commit.event is RunEvent.CANCEL_REQUESTED
            and status.cancellation
            and status.cancellation.requested_at
        ):
            waited = (datetime.now(UTC) - status.cancellation.requested_at).total_seconds()
            metrics.CANCELLATION_LATENCY.observe(max(0.0, waited))

    @staticmethod
    def _describe(body: dict[str, Any], before: RunState, commit: Commit) -> str:
        status = commit.status
        policy = ""
        parent_ref = (body.get("spec") or {}).get("parentRef")
        parent = f" parent={parent_ref.get('uid')}" if parent_ref else ""
        checkpoint = commit.checkpoint or {}
        if isinstance(checkpoint.get("policy"), dict):
            policy = f" policy={checkpoint['policy'].get('name')}@{checkpoint['policy'].get('version', '')}"
        attempts = (checkpoint.get("retry") or {}).get("attempts", 0)
        return (
            f"task={body['metadata']['uid']} stateVersion={status.state_version} "
            f"{before.value} -> {status.state.value} attempt={attempts}"
            f"{policy}{parent}" + (f": {commit.detail}" if commit.detail else "")
        )
