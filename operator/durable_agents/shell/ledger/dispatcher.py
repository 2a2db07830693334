"""The dispatcher and reconciler of the action ledger: for each ActionRecord, what
:func:`durable_agents.core.ledger.next_dispatch_step` allows.

- ``intent``: claim it by compare-and-swap (one dispatcher wins; no claim write under this
  process's first claim), ask the authoritative system by key first (a record restored from an
  old backup says ``intent`` for an effect that happened after it), dispatch it with its
  idempotency key, record ``succeeded``, ``failed`` or ``outcome_unknown`` (timeout, 5xx);
- a claim that expired (its dispatcher died mid-call): ``outcome_unknown``;
- ``outcome_unknown``: ask by key (a person's stamped answer first: :mod:`.reconciling`; paced:
  :mod:`.query_pacing`). Applied: ``succeeded``; not applied: dispatch again with the SAME key.

Only the run's own intents are sent: before a claim for a send, the run (``spec.runRef``) must
exist and its committed checkpoint, verified by its integrity stamp, must hold exactly this intent
(same key, record name and digest of effect, target, arguments and ServiceAccount as the engine's
intent: :mod:`.intent_checks`). Otherwise nothing is sent: the record fails ``NotInCheckpoint``
with Warning Events and a metric. A checkpoint that cannot be verified here (quarantined, from a
newer operator) holds its intents back, looked at later. What is written of a record, and the
Events that say so: :mod:`.record_writes`.

Effects act as the run's ServiceAccount. A claim is a lease on the record: the request is sent
only while the claim has a whole dispatch timeout (plus a margin) left on this process's monotonic
clock, so a dispatcher paused after its claim sends nothing when it wakes; a pause between that
check and the request's bytes leaving the socket stays open (a system deduplicating by key absorbs it).
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_agents.api.v1alpha1 import ActionRecordSpec, ActionRecordStatus, ActionState
from durable_agents.core.engine import Settings
from durable_agents.core.engine.actions import Refused, Unverified
from durable_agents.core.ledger import (
    AwaitInput,
    Claim,
    GiveUpClaim,
    PollTask,
    Query,
    SendFirst,
    WaitUntil,
    next_dispatch_step,
)
from durable_agents.core.regions import owning_region_of
from durable_agents.shell.agent.resolver import AgentResolver
from durable_agents.shell.effects import Applied, Effect, EffectContext, NotApplied, Tasked, Unknown
from durable_agents.shell.effects.mcp import (
    HOLD_EXTRA,
    INPUT_EXTRA,
    MCP_SERVERS_EXTRA,
    PROGRESS_EXTRA,
    McpInputAnswers,
    run_mcp_servers,
)
from durable_agents.shell.effects.plugins import load_effects, load_planners
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.faults import process_faults
from durable_agents.shell.ground.kube import ImpersonationRefused, Kube, ObjectKey
from durable_agents.shell.ground.lifecycle import Background
from durable_agents.shell.ground.store import Conflict, Gone, RunStore
from durable_agents.shell.ground.workqueue import WorkQueue
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.ledger.actions import ActionStore
from durable_agents.shell.ledger.dispatch_config import DispatcherConfig, Send
from durable_agents.shell.ledger.first_ask import ask_before_first_dispatch
from durable_agents.shell.ledger.held_calls import HeldCall, HeldCalls
from durable_agents.shell.ledger.input_rounds import InputRounds
from durable_agents.shell.ledger.intent_checks import DESTINATION_NOT_ALLOWED, check_intent, query_refusal
from durable_agents.shell.ledger.progress_writes import ProgressWrites
from durable_agents.shell.ledger.query_pacing import QueryPacing, observe_unknown_duration
from durable_agents.shell.ledger.reconciling import PersonAnswers, system_said
from durable_agents.shell.ledger.record_writes import RecordWrites
from durable_agents.shell.ledger.references import (
    SECRET_REFERENCE_UNRESOLVED,
    UnresolvedReference,
    resolve_references,
)
from durable_agents.shell.ledger.task_polls import TaskPolls
from durable_agents.shell.ledger.unsealing import (
    UNDECRYPTABLE,
    CannotUnseal,
    action_of,
    data_key_of,
    sealed_outcome,
)
from durable_agents.shell.observability import run_traces
from durable_agents.shell.observability.census import UnknownOutcomes
from durable_agents.shell.observability.events import EventRecorder
from durable_agents.shell.ownership.namespaces import ManagedNamespaces

log = logging.getLogger(__name__)
A = ActionState

SEND_MARGIN = 0.5
"""Seconds of claim, beyond a whole dispatch timeout, that must remain when a request is sent."""
UNVERIFIED_RECHECK = timedelta(seconds=30)
"""How soon an intent held back (its run's checkpoint could not be verified) is looked at again."""
FOREIGN_RECHECK = timedelta(seconds=30)  # another region's intent: looked at again after this


class Dispatcher(Background):
    def __init__(
        self,
        kube: Kube,
        config: DispatcherConfig,
        effects: dict[str, Effect] | None = None,
        policies: PolicyCache | None = None,
    ) -> None:
        self.kube = kube
        self.config = config
        self.store = ActionStore(kube, config.keyring, claim_ttl=config.claim_ttl)  # stamps each write
        self.events = EventRecorder(kube, config.identity)
        self.writes = RecordWrites(
            self.store, self.events, config.identity, config.claim_ttl, all_events=config.all_events
        )
        self.effects = effects if effects is not None else load_effects()
        self.runs = RunStore(kube)
        self.policies = policies if policies is not None else PolicyCache(kube)
        self.agents = AgentResolver(kube, config.keyring, load_planners())
        self.base_settings = Settings(
            tiers={name: effect.tier for name, effect in self.effects.items()}, keyring=config.keyring
        )
        self.queue = WorkQueue("dispatcher", self.process, concurrency=config.concurrency)
        self.first_claims = config.first_claims  # intents this process's worker created for us
        self._unknown = UnknownOutcomes()  # and since when: the gauges of unknown outcomes
        self.people = PersonAnswers(self.events, config.keyring)  # spec.reconciliations, verified
        self.pacing = QueryPacing()  # unknown answers: asked again after a backoff
        self.namespaces = ManagedNamespaces(kube)  # acting as a run's ServiceAccount: where let
        # Calls answered with a task: polled (task_polls).
        self.tasks = TaskPolls(kube, self.writes, self.runs, self.config, self._context, self.policies)
        self.inputs = InputRounds(self.runs, self.writes, config.keyring)  # input_required: answers
        # Calls held open while their server asks a person (2025-11-25): held_calls.
        self.held = HeldCalls(self.runs, self.writes, self.inputs, self.policies, config.timeout)
        self.tasks.held = self.held  # a 2025-11-25 task's questions are asked as a held call's

    def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.queue.forget(key)
            self.pacing.forget(key)
            return
        self.queue.add(key, body)

    def observe_run(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A run's watch event: records a person answered for are asked about at once, records
        waiting for the run's answers to their system's questions are looked at again."""
        for key in self.pacing.answered(body) if event_type != "DELETED" else ():
            self.queue.add(key)
        for key in self.inputs.answered(body):
            self.queue.add(key)
        self.held.answered(body)

    async def run(self) -> None:
        await self.queue.run()  # its consumers, until cancelled

    # --- one record -----------------------------------------------------------------------

    async def process(self, key: ObjectKey, body: dict[str, Any] | None) -> None:
        log.debug("dispatcher looks at %s/%s", *key)
        if body is None:
            try:
                body = await self.store.get(*key)
            except Gone:
                return
        spec = ActionRecordSpec.model_validate(body["spec"])
        for _ in range(8):  # bounded: a record moves through at most a few states per pass
            if await self.namespaces.refused_before(key[0]):  # opted out: nothing sent, queried or failed
                self.queue.wake_at(key, self.namespaces.due(key[0]))
                return
            status = await self._believed(body)
            self._track_unknown(key, status)
            step = next_dispatch_step(status, datetime.now(UTC), spec.first_claim, self.config.identity)
            if isinstance(step, WaitUntil):
                self.queue.wake_at(key, step.at)
                return
            try:
                if isinstance(step, Claim | SendFirst):
                    claimed = await self._claim_and_dispatch(body, status, first=isinstance(step, SendFirst))
                    if claimed is None:  # held back until its run can be verified
                        return
                    body = claimed
                elif isinstance(step, AwaitInput):  # sent again once the run holds every answer
                    given = await self.inputs.answers(body, status, spec)
                    if isinstance(given, datetime):
                        self.queue.wake_at(key, given)
                        return
                    retried = await self._claim_and_dispatch(body, status, answers=given)
                    if retried is None:
                        return
                    body = retried
                elif isinstance(step, GiveUpClaim):  # a lost held call trusted as idempotent: sent again
                    if not await self.held.resend_lost(body, status, spec):
                        body = await self.tasks.give_up(body, status, spec)
                    elif (resent := await self._claim_and_dispatch(body, status)) is None:
                        return
                    else:
                        body = resent
                elif isinstance(step, PollTask):
                    if step.at > datetime.now(UTC):
                        self.queue.wake_at(key, step.at)
                        return
                    polled = await self.tasks.poll_record(body, status, spec, self.effects.get(spec.effect))
                    if isinstance(polled, datetime):  # not pollable here now (task_polls)
                        self.queue.wake_at(key, polled)
                        return
                    body = polled
                elif isinstance(step, Query):
                    next_body = await self._query(body, status)
                    if next_body is None:
                        return
                    body = next_body
            except ImpersonationRefused:  # its namespace opted out meanwhile: the request was not made
                self.namespaces.refused(key[0])  # so the record waits (above), untouched
            except Conflict:
                log.info("%s/%s moved on meanwhile (409); reading it again", *key)
                body = await self.store.get(*key)  # someone else moved it: decide again

    async def reconcile(self, body: dict[str, Any]) -> dict[str, Any]:
        """Settle a record by asking its authoritative system now, whichever region owns its run: a
        claim that expired is given up (its sender is gone) and an unknown outcome is queried. For
        a failover's checks; the record as it stands after (sent again only if its run is ours)."""
        key = self._key(body)
        spec = ActionRecordSpec.model_validate(body["spec"])
        for _ in range(3):
            status = await self._believed(body)
            step = next_dispatch_step(status, datetime.now(UTC), spec.first_claim)
            try:
                if isinstance(step, GiveUpClaim):
                    body = await self.tasks.give_up(body, status, spec)
                    continue
                if isinstance(step, Query):
                    await self._query(body, status)
                return await self.store.get(*key)
            except Conflict:
                body = await self.store.get(*key)
        return body

    async def _believed(self, body: dict[str, Any]) -> ActionRecordStatus:
        """The record's status as written by the operator (its outcome stamp verifies), or
        ``outcome_unknown`` (IntegrityFailed) to be reconciled by query (:mod:`..core.outcome_stamps`)."""
        belief = self.store.belief(body)
        if belief.forged is not None:
            log.warning("%s/%s: %s", *self._key(body), belief.forged)
            await self.writes.event(body, "IntegrityFailed", belief.forged, warning=True)
        return belief.status

    def _track_unknown(self, key: ObjectKey, status: ActionRecordStatus) -> None:
        self._unknown.track(key, status.state is A.OUTCOME_UNKNOWN, status.outcome_unknown_since)

    def _context(self, spec: ActionRecordSpec, namespace: str, run: dict[str, Any] | None) -> EffectContext:
        extra = run_traces.effect_extra(run, spec.run_ref.name, namespace, self.config)
        extra[MCP_SERVERS_EXTRA] = run_mcp_servers(run)  # credentials are read per call, as the run
        return EffectContext(self.kube, namespace, spec.service_account_name, self.config.timeout, extra)

    async def _claim_and_dispatch(
        self,
        body: dict[str, Any],
        status: ActionRecordStatus,
        *,
        first: bool = False,
        answers: McpInputAnswers | dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """Claim the record and send it; ``first``: under this process's first claim, with no
        claim write (when it began is known only here: a first claim whose start this process
        does not know, or lost to a lapse, is never sent under; it expires and is reconciled).
        ``answers``: a retry with a person's answers (or the record as it settled without them)."""
        if isinstance(answers, dict):
            return answers
        spec = ActionRecordSpec.model_validate(body["spec"])
        first_started: float | None = None
        if first:
            first_started = self.first_claims.take(self._key(body)) if self.first_claims else None
            if first_started is None:
                assert spec.first_claim is not None
                self.queue.wake_at(self._key(body), spec.first_claim.expires_at)
                return None
        send = await self._prepare_send(body, status, spec, direct=first_started is not None)
        if not isinstance(send, Send):
            return send  # settled without a send (refused, failed), or held back (None)
        if answers is not None:
            send.ctx.extra[INPUT_EXTRA] = answers
        return await self._send(body, status, spec, send, first_started)

    async def _prepare_send(
        self, body: dict[str, Any], status: ActionRecordStatus, spec: ActionRecordSpec, *, direct: bool
    ) -> Send | dict[str, Any] | None:
        """What sending the record takes: the run's own intent, an effect to send it with, its
        action unsealed, its references read. Else the record as it settled without a send (failed,
        with the reason), or None: held back (another region's run, or not verifiable here).
        ``direct``: under our own first claim (a failure is written without a claim first)."""
        verdict, run_body = await check_intent(
            body, spec, self.runs, self.policies, self.agents, self.base_settings
        )
        if run_body is not None and self._other_region(run_body) is not None:
            # Another region owns the run (its home, or a failover's): its dispatchers send this.
            log.debug(
                "%s/%s: run owned by region %s; not ours", *self._key(body), self._other_region(run_body)
            )
            # Looked at again now and then: a failover to our region may hand it to us.
            self.queue.wake_at(self._key(body), datetime.now(UTC) + FOREIGN_RECHECK)
            return None
        if isinstance(verdict, Refused):
            return await self._refuse(body, status, spec, verdict, direct)
        if isinstance(verdict, Unverified):
            self._hold(body, spec, verdict)
            return None
        effect = self.effects.get(spec.effect)
        if effect is None:
            message = f"no effect plugin named {spec.effect!r} is installed"
            return await self.writes.fail_before_dispatch(body, status, "UnknownEffect", message, direct)
        try:
            action = action_of(spec, run_body, self.config.keyring)
            data_key = data_key_of(run_body, self.config.keyring)
        except CannotUnseal as err:
            message = f"not dispatched: {err}"
            return await self.writes.fail_before_dispatch(body, status, UNDECRYPTABLE, message, direct)
        ctx = self._context(spec, body["metadata"]["namespace"], run_body)
        if spec.effect == "mcp.call":  # its server may ask while the call is open: held_calls
            hold = await self.held.hold_for(run_body)
            ctx.extra[HOLD_EXTRA] = self.held.call(spec, ctx.namespace, data_key, hold)
        try:  # read as the run's ServiceAccount, right before the send; never stored
            action, references = await resolve_references(ctx, action, data_key)
        except UnresolvedReference as err:
            reason, message = SECRET_REFERENCE_UNRESOLVED, f"not dispatched: {err}"
            return await self.writes.fail_before_dispatch(body, status, reason, message, direct)
        return Send(effect, ctx, action, data_key, references)

    async def _send(
        self,
        body: dict[str, Any],
        status: ActionRecordStatus,
        spec: ActionRecordSpec,
        send: Send,
        first_started: float | None,
    ) -> dict[str, Any]:
        """Claim the record (under our first claim, that is the claim: no write before the send),
        ask before its first send, send it while the claim holds, and record the answer."""
        if first_started is not None:
            claimed_at, claimed, claimed_status = first_started, body, status
        else:
            claimed_at = time.monotonic()  # before the write: the claim cannot outlive this
            claimed = await self.writes.write(
                body, status, A.DISPATCHING, claim=True, references=send.references
            )
            claimed_status = ActionRecordStatus.model_validate(claimed["status"])
        if status.state is A.INTENT:  # never sent before
            asked = await ask_before_first_dispatch(self.writes, claimed, claimed_status, spec, send)
            if asked is not None:
                return asked
        if not self._claim_holds(claimed_at):
            return await self._claim_lapsed(claimed, spec)
        attempt = f"{spec.effect} attempt {claimed_status.attempts} key={spec.idempotency_key}"
        await self.writes.routine_event(claimed, "Dispatched", attempt)
        process_faults().before_send()
        if not self._claim_holds(claimed_at):
            return await self._claim_lapsed(claimed, spec)
        progress = ProgressWrites(self.writes.store, claimed, claimed_status)
        send.ctx.extra[PROGRESS_EXTRA] = progress.seen  # written coalesced: progress_writes
        held = send.ctx.extra.get(HOLD_EXTRA)
        if isinstance(held, HeldCall):  # a question asked meanwhile is written on this record
            held.record, held.first, held.references = progress, first_started is not None, send.references
        async with progress.writing():
            result = await run_traces.dispatched(send.effect, send.ctx, send.action)
        claimed, claimed_status = progress.body, progress.status
        metrics.ACTION_DISPATCHES.labels(spec.effect, type(result).__name__).inc()
        run_traces.log_dispatch(send.ctx, claimed, spec.effect, claimed_status.attempts, result)
        if isinstance(result, Tasked):  # the task ID is written before anything else
            return await self.tasks.started(
                claimed, claimed_status, spec, result, first=first_started is not None
            )
        result = self.held.resent_answer(status, result)  # a lost held call's re-send: never failed
        first = first_started is not None and not (isinstance(held, HeldCall) and held.first_recorded)
        return await self.writes.dispatch_answered(
            claimed, claimed_status, spec, result, send.data_key, first=first, references=send.references
        )

    def _other_region(self, run_body: dict[str, Any]) -> str | None:
        """The region that owns the run, when it is not ours (None when it is)."""
        owner = owning_region_of(run_body, self.config.keyring)
        return None if owner == self.config.region else owner

    async def _refuse(
        self,
        body: dict[str, Any],
        status: ActionRecordStatus,
        spec: ActionRecordSpec,
        verdict: Refused,
        direct: bool,
    ) -> dict[str, Any]:
        """Not the run's intent (or not one its policy allows now): nothing is sent, ever; the
        record fails with the reason."""
        namespace, name = self._key(body)
        why, reason = verdict.message, verdict.reason
        out = await self.writes.fail_unsent(body, status, direct, reason, f"not dispatched: {why}"[:4096])
        label = spec.effect if spec.effect in self.effects else "unknown"  # no label from a forger
        metrics.ACTION_DISPATCHES.labels(label, reason).inc()
        log.warning("%s/%s refused (%s): %s", namespace, name, reason, why)
        message = f"{spec.effect} key={spec.idempotency_key} not dispatched: {why}"
        await self.writes.event(out, reason, message, warning=True)
        try:
            run_body = await self.runs.get(namespace, spec.run_ref.name)
        except Gone:
            return out
        await self.writes.event(run_body, reason, f"ActionRecord {name}: {message}", warning=True)
        return out

    def _hold(self, body: dict[str, Any], spec: ActionRecordSpec, verdict: Unverified) -> None:
        """The run's checkpoint cannot be verified here: send nothing, fail nothing, look again later."""
        metrics.ACTION_DISPATCHES.labels(
            spec.effect if spec.effect in self.effects else "unknown", "Unverified"
        ).inc()
        log.warning(
            "%s/%s held back: run %s's checkpoint or policy cannot be verified (%s: %s)",
            *self._key(body),
            spec.run_ref.name,
            verdict.problem.reason,
            verdict.problem.message,
        )
        self.queue.wake_at(self._key(body), datetime.now(UTC) + UNVERIFIED_RECHECK)

    def _claim_holds(self, claimed_at: float) -> bool:
        """Whether a request sent now is answered (or abandoned) before the claim can expire."""
        claim_ends = claimed_at + self.config.claim_ttl.total_seconds()
        return time.monotonic() + self.config.timeout + SEND_MARGIN < claim_ends

    async def _claim_lapsed(self, claimed: dict[str, Any], spec: ActionRecordSpec) -> dict[str, Any]:
        # Paused past our own claim: another dispatcher may already have queried and sent. Send
        # nothing; read the record again and do what its state allows now.
        metrics.ACTION_DISPATCHES.labels(spec.effect, "ClaimLapsed").inc()
        log.warning(
            "%s/%s: claim lapsed before the request was sent (this process was paused); not sending",
            claimed["metadata"]["namespace"],
            claimed["metadata"]["name"],
        )
        return await self.store.get(*self._key(claimed))

    async def _query(self, body: dict[str, Any], status: ActionRecordStatus) -> dict[str, Any] | None:
        later = self.pacing.later(self._key(body))  # woken by our own write of the last answer
        if later is not None:
            self.queue.wake_at(self._key(body), later)
            return None
        spec = ActionRecordSpec.model_validate(body["spec"])
        effect = self.effects.get(spec.effect)
        if effect is None:
            self.queue.wake_at(self._key(body), self.pacing.asked(self._key(body), status.queries))
            return None
        try:
            run_body = await self.runs.get(body["metadata"]["namespace"], spec.run_ref.name)
        except Gone:
            run_body = None
        refused = await query_refusal(body, spec, run_body, self.policies)
        if refused is not None:  # kept unknown and visible: a person reconciles it, or the list grows
            await self.writes.event(body, DESTINATION_NOT_ALLOWED, f"not queried: {refused}", warning=True)
            self.queue.wake_at(self._key(body), self.pacing.asked(self._key(body), status.queries))
            return None
        ctx = self._context(spec, body["metadata"]["namespace"], run_body)
        try:
            action = action_of(spec, run_body, self.config.keyring)
            data_key = data_key_of(run_body, self.config.keyring)
            action, _ = await resolve_references(ctx, action, data_key)
        except (CannotUnseal, UnresolvedReference) as err:  # kept unknown and visible: it may come back
            reason = UNDECRYPTABLE if isinstance(err, CannotUnseal) else SECRET_REFERENCE_UNRESOLVED
            await self.writes.event(body, reason, f"cannot ask about it: {err}", warning=True)
            self.queue.wake_at(self._key(body), self.pacing.asked(self._key(body), status.queries))
            return None
        said = await self.people.said(body, status, run_body)  # a person's, stamped, first
        said = said or system_said(await run_traces.queried(effect, ctx, action), spec)
        answer, why, told = said.result, said.reason, said.message
        if isinstance(answer, Applied):
            observe_unknown_duration(status)
            outcome = sealed_outcome(answer.outcome, data_key, body["metadata"]["name"])
            out = await self.writes.write(
                body, status, A.SUCCEEDED, outcome=outcome, queried=True, reason=why, message=told
            )
            await self.writes.event(out, "Reconciled", said.event)
            return out
        if isinstance(answer, NotApplied):
            observe_unknown_duration(status)
            await self.writes.event(body, "Reconciled", said.event)
            queried = await self.writes.write(
                body, status, A.OUTCOME_UNKNOWN, queried=True, reason=why, message=told
            )
            return await self._claim_and_dispatch(
                queried, ActionRecordStatus.model_validate(queried["status"])
            )
        assert isinstance(answer, Unknown)
        await self.writes.write(
            body, status, A.OUTCOME_UNKNOWN, queried=True, reason=answer.reason, message=answer.message
        )
        # Still unknown: stays visible (state, Event, metric) and the run keeps waiting; ask later.
        await self.writes.event(body, "OutcomeUnknown", said.event, warning=True)
        self.queue.wake_at(self._key(body), self.pacing.asked(self._key(body), status.queries))
        return None

    @staticmethod
    def _key(body: dict[str, Any]) -> ObjectKey:
        return (body["metadata"]["namespace"], body["metadata"]["name"])
