"""Tasks as ledger handles: a call the system answered with a durable handle (an MCP task,
:class:`~durable_agents.shell.effects.Tasked`) is waited on through its ActionRecord.

- At dispatch, the handle is written into the record's ``status.task`` (stamped, by
  compare-and-swap) before anything else: the first poll only ever reads it from the record. The
  claim ends with that write (the call was answered); the record stays in the state it was sent
  in (``dispatching``, or ``intent`` under its creator's first claim) with the task, so the run
  keeps waiting on the action.
- A record with a task and no outcome is polled (:class:`~durable_agents.core.ledger.PollTask`)
  by whichever dispatcher sees it, after any restart, upgrade or failover: a poll is a read, and
  the call itself is never sent again. Each poll writes the task's status and message (what
  ``kubectl agentrun status`` and the console show) and waits the server's interval with backoff
  (:func:`~durable_agents.core.ledger.task_poll_delay`).
- A terminal task settles the action with the task's result (completed: ``succeeded``, its result
  sealed like any outcome; failed or cancelled: ``failed``); a task the server no longer knows is
  ``outcome_unknown`` and reconciled like any other; a task that outlives the wait
  (the run's policy's ``waitExpiries.external``) is canceled at the server and ``outcome_unknown`` (reason
  ``TaskWaitExpired``).
- When the run is canceled (or gone), the task is canceled at the server (``tasks/cancel``) once,
  and the server's answer recorded in ``status.task.cancelAnswer``; polling goes on until the
  task says how it ended.
- A task ID the server already gave another action of the namespace (same server) is not waited
  on: the action is ``outcome_unknown`` (reason ``TaskIdReused``), never settled with another
  call's result.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from durable_agents.api.v1alpha1 import (
    GROUP,
    VERSION,
    ActionRecordSpec,
    ActionRecordStatus,
    ActionState,
    ActionTask,
    RunState,
)
from durable_agents.core.agent.mcp_tasks import TASK_FORM_2025
from durable_agents.core.durations import parse_duration
from durable_agents.core.regions import owning_region_of
from durable_agents.core.sealed_values import DataKey
from durable_agents.shell.effects import Action, Applied, Effect, EffectContext, Failed, Tasked, TaskEffect
from durable_agents.shell.effects.mcp import HOLD_EXTRA
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ground.store import Gone, RunStore
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.ledger.dispatch_config import DispatcherConfig
from durable_agents.shell.ledger.held_calls import HeldCall, HeldCalls
from durable_agents.shell.ledger.progress_writes import ProgressWrites
from durable_agents.shell.ledger.record_writes import RecordWrites
from durable_agents.shell.ledger.unsealing import UNDECRYPTABLE, CannotUnseal, data_key_of, sealed_outcome

log = logging.getLogger(__name__)
A = ActionState

TASK_WAIT_MAX: Final = timedelta(hours=24)
"""How long a task is waited on before it is canceled and its outcome is unknown, for a run
without a policy; a run's policy sets it: ``spec.waitExpiries.external``, the bound of every
external wait."""
TASK_ID_REUSED: Final = "TaskIdReused"
TASK_QUESTION_LOST: Final = "TaskQuestionLost"
_CANCELING = (RunState.CANCEL_REQUESTED, RunState.CANCELED)


def _run_canceled(run_body: dict[str, Any] | None) -> bool:
    state = ((run_body or {}).get("status") or {}).get("state")
    return run_body is None or state in _CANCELING


ContextOf = Callable[[ActionRecordSpec, str, dict[str, Any] | None], EffectContext]
RECHECK: Final = timedelta(seconds=30)  # a task not pollable here now: looked at again after this


class TaskPolls:
    """One dispatcher's task writes and polls."""

    def __init__(
        self,
        kube: Kube,
        writes: RecordWrites,
        runs: RunStore,
        config: DispatcherConfig,
        context_of: ContextOf,
        policies: PolicyCache,
    ) -> None:
        self.kube, self.writes, self.runs, self.config = kube, writes, runs, config
        self.context_of, self.policies = context_of, policies
        self.held: HeldCalls | None = None  # asks a 2025-11-25 task's questions (the dispatcher's)
        # Cancels sent by this process and not yet in the record, by (record UID, task ID): a poll
        # that meets a 409 after sending, or runs beside another poll of the record, reuses the
        # answer instead of sending ``tasks/cancel`` again.
        self._cancels: dict[tuple[str, str], asyncio.Future[str]] = {}

    async def _cancel_once(
        self, body: dict[str, Any], task_id: str, send: Callable[[], Awaitable[str]]
    ) -> str:
        """The server's answer to this task's cancel, sent at most once by this process until the
        record holds it (the caller writes it, then :meth:`_cancel_written`)."""
        key = (str(body["metadata"].get("uid", "")), task_id)
        pending = self._cancels.get(key)
        if pending is None:
            pending = self._cancels[key] = asyncio.ensure_future(send())
            answer = await _forget_on_error(self._cancels, key, pending)
            log.info("%s/%s: task %s canceled at the server: %s", *_key(body), task_id, answer)
            await self.writes.event(body, "TaskCancelRequested", f"task {task_id}: {answer}")
            return answer
        return await _forget_on_error(self._cancels, key, pending)

    def _cancel_written(self, body: dict[str, Any], task_id: str) -> None:
        self._cancels.pop((str(body["metadata"].get("uid", "")), task_id), None)

    async def _wait_max(self, namespace: str, run_body: dict[str, Any] | None) -> timedelta:
        """The run's policy's bound on an external wait (``waitExpiries.external``)."""
        ref = (((run_body or {}).get("spec") or {}).get("policyRef") or {}).get("name")
        policy = await self.policies.read(namespace, ref) if isinstance(ref, str) else None
        return parse_duration(policy.wait_expiries.external) if policy is not None else TASK_WAIT_MAX

    async def poll_record(
        self, body: dict[str, Any], status: ActionRecordStatus, spec: ActionRecordSpec, effect: Effect | None
    ) -> dict[str, Any] | datetime:
        """Poll the record's task: the record as written, or when to look at it again (its
        effect cannot poll here, its run is another region's, its data key cannot be read)."""
        later = datetime.now(UTC) + RECHECK
        if effect is None or not isinstance(effect, TaskEffect):
            return later
        namespace = body["metadata"]["namespace"]
        try:
            run_body: dict[str, Any] | None = await self.runs.get(namespace, spec.run_ref.name)
        except Gone:
            run_body = None
        if run_body is not None and owning_region_of(run_body, self.config.keyring) != self.config.region:
            return later  # another region's run: its dispatchers poll it
        try:
            data_key = data_key_of(run_body, self.config.keyring)
        except CannotUnseal as err:  # its outcome could not be sealed: asked again later
            await self.writes.event(body, UNDECRYPTABLE, f"task not polled: {err}", warning=True)
            return later
        ctx = self.context_of(spec, namespace, run_body)
        task = status.task
        if self.held is not None and task is not None and task.protocol == TASK_FORM_2025:
            # Its server may ask while it waits (input_required): held_calls asks the run.
            hold = await self.held.hold_for(run_body)
            ctx.extra[HOLD_EXTRA] = self.held.call(spec, namespace, data_key, hold)
        wait_max = await self._wait_max(namespace, run_body)
        return await self.poll(body, status, effect, ctx, spec, run_body, data_key, wait_max)

    async def _write_task(
        self, body: dict[str, Any], status: ActionRecordStatus, task: ActionTask, **update: Any
    ) -> dict[str, Any]:
        """The record with ``task`` in its status, same state (a compare-and-swap, stamped)."""
        new = status.model_copy(update={"task": task, "progress": None, **update})
        return await self.writes.store.commit_status(body, new.wire())

    async def _reused(self, body: dict[str, Any], task_id: str, server: str) -> str | None:
        """Another ActionRecord of the namespace that holds this server's task ID."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        listed = await self.kube.call(
            self.kube.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "actionrecords"
        )
        for other in listed.get("items", []):
            task = ((other.get("status") or {}).get("task")) or {}
            if (
                other["metadata"]["name"] != name
                and task.get("id") == task_id
                and task.get("server") == server
            ):
                return str(other["metadata"]["name"])
        return None

    async def started(
        self,
        claimed: dict[str, Any],
        status: ActionRecordStatus,
        spec: ActionRecordSpec,
        result: Tasked,
        *,
        first: bool,
    ) -> dict[str, Any]:
        """Record the handle the dispatch answered with, before anything else."""
        server = str((spec.target or {}).get("url") or "")
        other = await self._reused(claimed, result.task_id, server)
        if other is not None:
            message = f"{server} answered with task {result.task_id!r}, which belongs to ActionRecord {other}"
            out = await self.writes.write(
                claimed, status, A.OUTCOME_UNKNOWN, reason=TASK_ID_REUSED, message=message, first=first
            )
            await self.writes.event(out, TASK_ID_REUSED, message, warning=True)
            return out
        now = datetime.now(UTC)
        task = ActionTask(
            id=result.task_id,
            server=server,
            status=result.status,
            status_message=result.status_message,
            poll_interval_ms=result.poll_interval_ms,
            created_at=now,
            protocol=result.protocol,  # how it is polled, by whichever dispatcher polls it
            session=result.session,
        )
        update: dict[str, Any] = {
            "claim_expires_at": None,
            "reason": "TaskStarted",
            "message": f"waiting on task {task.id}",
        }
        if first:  # sent under the first claim: the attempt is recorded with its answer
            update |= {"attempts": status.attempts + 1, "last_attempt_at": now}
            update["first_dispatched_at"] = status.first_dispatched_at or now
        out = await self._write_task(claimed, status, task, **update)
        await self.writes.event(
            out, "TaskStarted", f"{spec.effect} key={spec.idempotency_key}: task {task.id}"
        )
        return out

    async def poll(
        self,
        body: dict[str, Any],
        status: ActionRecordStatus,
        effect: TaskEffect,
        ctx: EffectContext,
        spec: ActionRecordSpec,
        run_body: dict[str, Any] | None,
        data_key: DataKey | None,
        wait_max: timedelta = TASK_WAIT_MAX,
    ) -> dict[str, Any]:
        """Poll the record's task once (cancel it first when its run was canceled) and write what it said."""
        task = status.task
        assert task is not None
        action = Action(spec.idempotency_key, dict(spec.target or {}), {})
        now = datetime.now(UTC)
        if _run_canceled(run_body) and task.cancel_requested_at is None:
            sent = task  # the task as it was when the cancel was sent (for the closure below)
            answer = await self._cancel_once(
                body,
                task.id,
                lambda: effect.cancel(ctx, action, sent.id, protocol=sent.protocol, session=sent.session),
            )
            task = task.model_copy(update={"cancel_requested_at": now, "cancel_answer": answer[:512]})
            body = await self._write_task(body, status, task)
            self._cancel_written(body, task.id)
            status = ActionRecordStatus.model_validate(body["status"])
        if now - task.created_at > wait_max:
            return await self._expired(body, status, task, effect, ctx, action, wait_max)
        held = ctx.extra.get(HOLD_EXTRA)
        if isinstance(held, HeldCall):  # a question asked meanwhile is written on this record
            held.record = ProgressWrites(self.writes.store, body, status)
        result = await effect.poll(ctx, action, task.id, protocol=task.protocol, session=task.session)
        if isinstance(held, HeldCall) and held.record is not None:  # as the questions left it
            body, status = held.record.body, held.record.status
        metrics.ACTION_QUERIES.labels(spec.effect, f"Task{type(result).__name__}").inc()
        polled = task.model_copy(update={"polls": task.polls + 1, "polled_at": now})
        if isinstance(result, Tasked):
            polled = polled.model_copy(
                update={
                    "status": result.status,
                    "status_message": result.status_message,
                    "poll_interval_ms": result.poll_interval_ms or task.poll_interval_ms,
                }
            )
            return await self._write_task(body, status, polled)
        status = status.model_copy(update={"task": polled})
        if isinstance(result, Applied):
            outcome = sealed_outcome(result.outcome, data_key, body["metadata"]["name"])
            status = status.model_copy(update={"task": polled.model_copy(update={"status": "completed"})})
            out = await self.writes.write(body, status, A.SUCCEEDED, outcome=outcome, reason="TaskCompleted")
            await self.writes.routine_event(out, "Succeeded", f"task {task.id} completed")
            return out
        if isinstance(result, Failed):
            status = status.model_copy(update={"task": polled.model_copy(update={"status": "failed"})})
            out = await self.writes.write(
                body, status, A.FAILED, reason=result.reason, message=result.message[:4096]
            )
            await self.writes.event(out, "Failed", f"{result.reason}: {result.message}", warning=True)
            return out
        out = await self.writes.write(
            body, status, A.OUTCOME_UNKNOWN, reason=result.reason, message=result.message[:4096]
        )
        # Its own reason: the query that follows writes (and tells) what it finds.
        await self.writes.event(out, result.reason, f"{result.message}; asking by key", warning=True)
        return out

    async def give_up(
        self, body: dict[str, Any], status: ActionRecordStatus, spec: ActionRecordSpec
    ) -> dict[str, Any]:
        """A claim expired: given up (record_writes), except a task's question whose asker is gone."""
        if status.state is A.INPUT_REQUIRED and status.task is not None:
            return await self.question_lost(body, status)
        return await self.writes.give_up(body, status, spec)

    async def question_lost(self, body: dict[str, Any], status: ActionRecordStatus) -> dict[str, Any]:
        """A 2025-11-25 task's question whose asker is gone (an operator restart while the person
        had not answered: the ``tasks/result`` stream it came on is lost). The task is still the
        server's: its record is polled again (``dispatching``, the same task; the run's question
        closes), and ``tasks/result`` is fetched again when it still waits for input, so that its
        server may ask again. The tool is never called again."""
        task = status.task
        assert task is not None
        message = (
            f"the question of task {task.id} was lost with its asker (an operator restart): closed "
            "unanswered; the task is polled again"
        )
        out = await self.writes.write(body, status, A.DISPATCHING, reason=TASK_QUESTION_LOST, message=message)
        await self.writes.event(out, TASK_QUESTION_LOST, message, warning=True)
        return out

    async def _expired(
        self,
        body: dict[str, Any],
        status: ActionRecordStatus,
        task: ActionTask,
        effect: TaskEffect,
        ctx: EffectContext,
        action: Action,
        wait_max: timedelta,
    ) -> dict[str, Any]:
        """Waited too long: canceled at the server; whether the call applied is unknown."""
        answer = task.cancel_answer or await effect.cancel(
            ctx, action, task.id, protocol=task.protocol, session=task.session
        )
        message = f"task {task.id} did not end within {wait_max}; canceled at the server: {answer}"
        stopped = task.model_copy(
            update={
                "cancel_requested_at": task.cancel_requested_at or datetime.now(UTC),
                "cancel_answer": answer[:512],
            }
        )
        status = status.model_copy(update={"task": stopped})
        out = await self.writes.write(
            body, status, A.OUTCOME_UNKNOWN, reason="TaskWaitExpired", message=message[:4096]
        )
        await self.writes.event(out, "TaskWaitExpired", message, warning=True)
        return out


async def _forget_on_error(
    pending: dict[tuple[str, str], asyncio.Future[str]], key: tuple[str, str], future: asyncio.Future[str]
) -> str:
    """``future``'s answer; a cancel that failed is forgotten, so that the next poll sends it again."""
    try:
        return await asyncio.shield(future)
    except BaseException:
        if future.done():
            pending.pop(key, None)
        raise


def _key(body: dict[str, Any]) -> tuple[str, str]:
    return (body["metadata"]["namespace"], body["metadata"]["name"])
