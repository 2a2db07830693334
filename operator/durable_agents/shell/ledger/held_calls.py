"""A ledger call held open while its server asks a person (protocol 2025-11-25, issue 36 item 1).

On the 2025-11-25 protocol a server asks while the ``tools/call`` is open (``elicitation/create``).
The client of a ledger call declares elicitation (its callback:
:class:`~durable_agents.shell.agent.mcp_elicitation.HoldOpen`) and :class:`HeldCall` is what it
asks: the question is recorded on the ActionRecord as the durable path records one
(``input_required``, ``status.input`` marked ``heldOpen``: no request state, under the outcome
stamp), with the sender's claim lasting the hold; the run asks it (``waiting_input`` on
``mcp-<step>-<round>-<key>``); the person's answer, once the run records it, is read from the
run, checked again against the schema, and goes back on the open call. The record returns to
``dispatching``: the call completes and settles as usual.

The bound is the run's policy's ``mcp.holdOpen`` (default 10m): past it the server is told
``cancel``. A call lost while held (the operator restarted, lost its claim) cannot be answered:
its claim expires and the record becomes ``outcome_unknown`` (``HeldCallLost``), reconciled like
any other; nothing is sent again by itself, UNLESS the run's policy (read then) trusts the tool as
idempotent (``mcp.idempotentTools``): then it is sent again under the same idempotency key, a
fresh attempt whose server asks again (``HeldCallResent``, :meth:`HeldCalls.resend_lost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from durable_agents.api.v1alpha1 import (
    ActionInput,
    ActionRecordSpec,
    ActionRecordStatus,
    ActionState,
    AgentPolicySpec,
    ResolvedReference,
)
from durable_agents.api.v1alpha1.mcp_policy import HOLD_OPEN_DEFAULT
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.agent.mcp_elicitation import ElicitationAnswer, ElicitationQuestion
from durable_agents.core.agent.mcp_questions import answer_ref_id, question_name
from durable_agents.core.agent.mcp_trust import trusted_idempotent
from durable_agents.core.durations import parse_duration
from durable_agents.core.sealed_values import DataKey
from durable_agents.shell.effects import Failed, InputRequired, Unknown
from durable_agents.shell.ground.kube import ObjectKey
from durable_agents.shell.ground.store import Gone, RunStore
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.ledger.input_asked import asked_input
from durable_agents.shell.ledger.input_rounds import AnswerRefused, InputRounds, answer_refs
from durable_agents.shell.ledger.progress_writes import ProgressWrites
from durable_agents.shell.ledger.record_writes import HELD_CALL_LOST, RecordWrites
from durable_agents.shell.ledger.unsealing import CannotUnseal, data_key_of

log = logging.getLogger(__name__)

HELD_PAST_BOUND = "HeldPastBound"
HELD_ANSWERED = "HeldAnswered"
HELD_CALL_RESENT = "HeldCallResent"
HELD_RECHECK = 5.0
"""Seconds between two reads of the run while a held call waits (besides its watch events)."""
CLAIM_MARGIN = timedelta(seconds=5)
R = TypeVar("R")


def _run_key(run: Mapping[str, Any]) -> ObjectKey:
    meta = run.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


class HeldCalls:
    """The calls this dispatcher holds open, woken by their run's watch events."""

    def __init__(
        self, runs: RunStore, writes: RecordWrites, inputs: InputRounds, policies: PolicyCache, timeout: float
    ) -> None:
        self.runs, self.writes, self.inputs, self.policies = runs, writes, inputs, policies
        self.timeout = timeout
        self._woken: dict[ObjectKey, asyncio.Event] = {}

    def answered(self, run: Mapping[str, Any]) -> None:
        """A run's watch event: a call held for it reads the run again now."""
        event = self._woken.get(_run_key(run))
        if event is not None:
            event.set()

    async def _policy_of(
        self, run_body: Mapping[str, Any] | None
    ) -> tuple[str | None, AgentPolicySpec | None]:
        """The policy governing the run (the one its checkpoint recorded, else named, else its
        namespace's or the cluster's default), read now; its name too."""
        key = self.policies.governing_key(run_body) if run_body is not None else None
        if key is None:
            return None, None
        return key[1], await self.policies.read(*key)

    async def hold_for(self, run_body: Mapping[str, Any] | None) -> float:
        """Seconds the run's policy lets a call be held open (``mcp.holdOpen``)."""
        _, policy = await self._policy_of(run_body)
        text = policy.mcp.hold_open if policy is not None else HOLD_OPEN_DEFAULT
        return parse_duration(text).total_seconds()

    async def resend_lost(
        self, body: Mapping[str, Any], status: ActionRecordStatus, spec: ActionRecordSpec
    ) -> bool:
        """A claim found expired: whether it is a call lost while held open whose tool the run's
        policy, read now, trusts as idempotent (``mcp.idempotentTools``). Then it is sent again
        under the same key (said by a ``HeldCallResent`` Event); else it is given up, unknown. Never a
        task's question: its tool was called once and the task is the server's to finish."""
        if (
            status.state is not ActionState.INPUT_REQUIRED
            or status.input is None
            or not status.input.held_open
            or status.task is not None  # a task's question: the task is polled again (task_polls)
        ):
            return False
        target = spec.target or {}
        url, tool = target.get("url"), target.get("tool")
        if spec.effect != "mcp.call" or not isinstance(url, str) or not isinstance(tool, str):
            return False
        namespace = str(body["metadata"]["namespace"])
        try:
            run = await self.runs.get(namespace, spec.run_ref.name)
        except Gone:
            return False
        name, policy = await self._policy_of(run)
        if not trusted_idempotent(policy, url, tool):
            return False
        message = (
            f"the call {status.claimed_by or 'its sender'} held open while its server's question waited "
            f"was lost; the policy {name!r} trusts {tool} as idempotent: sent again under the same key"
        )
        await self.writes.event(dict(body), HELD_CALL_RESENT, message)
        return True

    @staticmethod
    def resent_answer(sent_from: ActionRecordStatus, result: R) -> R | Unknown:
        """What a send's answer means for the record: a send made from a lost held call (its
        re-send, :meth:`resend_lost`) that failed says nothing of the first send, whose outcome
        stays unknown (to be asked about, or told by a person), never ``failed``."""
        held = sent_from.input is not None and sent_from.input.held_open
        if sent_from.state is not ActionState.INPUT_REQUIRED or not held or not isinstance(result, Failed):
            return result
        message = (
            f"sent again after a lost held call, it failed ({result.reason}: {result.message}); "
            "whether the first send applied is unknown"
        )
        return Unknown(HELD_CALL_LOST, message[:4096])

    def call(self, spec: ActionRecordSpec, namespace: str, data_key: DataKey | None, hold: float) -> HeldCall:
        return HeldCall(self, spec, namespace, data_key, hold)


class HeldCall:
    """One send's questions asked while its call is open (``ask``: :class:`HoldOpen`'s)."""

    def __init__(
        self, calls: HeldCalls, spec: ActionRecordSpec, namespace: str, data_key: DataKey | None, hold: float
    ) -> None:
        self.calls, self.spec, self.namespace, self.data_key, self.hold = (
            calls,
            spec,
            namespace,
            data_key,
            hold,
        )
        self.record: ProgressWrites | None = None  # the record as last written (the dispatcher's)
        self.first = False  # sent under a first claim: the attempt is recorded with the first question
        self.first_recorded = False
        self.references: list[ResolvedReference] = []  # read for this send: recorded with its attempt

    async def ask(self, question: ElicitationQuestion) -> ElicitationAnswer:
        """Record the question, wait for the run's answer (at most the hold), then record that
        the call goes on. Never raises for the person's side: an answer that cannot be used is
        told to the server as ``cancel`` and the record says why."""
        record = self.record
        if record is None:  # not wired (no record to write on): nobody can be asked
            return ElicitationAnswer("cancel")
        asked = asked_input(
            record.status,
            self.spec,
            InputRequired({question.key: question.for_person()}, {}, None),
            self.data_key,
        )
        if isinstance(asked, Failed):
            await self._goes_on(record, asked.reason, asked.message)
            return ElicitationAnswer("cancel")
        asked = asked.model_copy(update={"held_open": True})
        first = self.first and not self.first_recorded
        until = datetime.now(UTC) + timedelta(seconds=self.hold + self.calls.timeout) + CLAIM_MARGIN
        body = await self.calls.writes.write(
            record.body,
            record.status,
            ActionState.INPUT_REQUIRED,
            reason="InputRequired",
            message=f"the server asks {question.key} while the call is held open (at most {self.hold:.0f}s)",
            first=first,
            references=self.references if first else None,
            asked=asked,
            claim_until=until,
        )
        self.first_recorded = self.first_recorded or first
        self._keep(record, body)
        await self.calls.writes.event(body, "InputRequired", body["status"]["message"])
        try:
            answer, reason, why = await asyncio.wait_for(self._answer(asked, question.key), self.hold)
        except TimeoutError:
            answer, reason = ElicitationAnswer("cancel"), HELD_PAST_BOUND
            why = f"nobody answered within the policy's mcp.holdOpen ({self.hold:.0f}s): told cancel"
        await self._goes_on(record, reason, why)
        return answer

    async def _answer(self, asked: ActionInput, key: str) -> tuple[ElicitationAnswer, str, str]:
        """The run's checked answer to ``key`` (or ``cancel``, and why), read on each run event."""
        calls, run_name = self.calls, self.spec.run_ref.name
        name = question_name(self.spec.step_index, asked.round, key)
        event = calls._woken.setdefault((self.namespace, run_name), asyncio.Event())
        try:
            while True:
                event.clear()
                try:
                    run = await calls.runs.get(self.namespace, run_name)
                except Gone:
                    return ElicitationAnswer("cancel"), "HeldRunGone", f"its run {run_name!r} is gone"
                state = str((run.get("status") or {}).get("state") or "")
                if (
                    state in {s.value for s in RunState if s.terminal}
                    or state == RunState.CANCEL_REQUESTED.value
                ):
                    return (
                        ElicitationAnswer("cancel"),
                        "HeldRunEnded",
                        f"its run is {state}: the server is told cancel",
                    )
                refs = answer_refs(run)
                if answer_ref_id(name) in refs:
                    try:
                        given = calls.inputs.answer_of(
                            run, self.spec, asked, key, refs, data_key_of(run, calls.inputs.keyring)
                        )
                    except (AnswerRefused, CannotUnseal) as err:
                        return (
                            ElicitationAnswer("cancel"),
                            "McpAnswerRefused",
                            f"{err}; the server is told cancel",
                        )
                    return given, HELD_ANSWERED, f"answered ({given.action}); the call goes on"
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), HELD_RECHECK)
        finally:
            calls._woken.pop((self.namespace, run_name), None)

    async def _goes_on(self, record: ProgressWrites, reason: str, message: str) -> None:
        """The call goes on (answered, or told cancel): ``dispatching`` again, under a claim that
        lasts a dispatch timeout. The run's question closes (its record no longer asks)."""
        if record.status.state is not ActionState.INPUT_REQUIRED:
            return
        until = datetime.now(UTC) + timedelta(seconds=self.calls.timeout) + CLAIM_MARGIN
        try:
            body = await self.calls.writes.write(
                record.body, record.status, ActionState.DISPATCHING, reason=reason, message=message[:4096],
                claim_until=until,
            )  # fmt: skip
        except Exception as err:  # the call's answer is still written on the last record known
            log.warning("%s: held call's answer not recorded: %s", record.body["metadata"]["name"], err)
            return
        self._keep(record, body)

    @staticmethod
    def _keep(record: ProgressWrites, body: dict[str, Any]) -> None:
        from durable_agents.api.v1alpha1 import ActionRecordStatus

        record.body, record.status = body, ActionRecordStatus.model_validate(body["status"])
