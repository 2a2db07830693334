"""Building one commit: the state machine's transition, the state version, the lease epoch
(fencing token), timestamps, conditions and history, all in one status written at once; the
checkpoint stamped last (its integrity stamp, :mod:`durable_agents.core.checkpoint`).

Also the two writes that are not transitions: a :class:`StatusNote` shows the approvals a quorum
has so far; a :class:`Refusal` records a request the operator
will not act on (its authority cannot be verified) in ``status.refusedRequests`` with the
``RequestRefused`` condition, once per request, and leaves everything else as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Literal

from durable_agents.api.v1alpha1 import (
    HISTORY_LIMIT,
    REFUSED_LIMIT,
    AgentRunStatus,
    Condition,
    ConditionStatus,
    HistoryEntry,
    Outcome,
    RefusedRequest,
)
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.authority import Unproven
from durable_agents.core.checkpoint import (
    Checkpoint,
    Fencing,
    Loaded,
    RetryState,
    dump_checkpoint,
    stamp_checkpoint,
)
from durable_agents.core.engine.decisions import Commit
from durable_agents.core.engine.snapshot import RunSnapshot, Settings, run_traceparent
from durable_agents.core.health import run_health
from durable_agents.core.sealed_values import ValueSealingError, fingerprint, open_data_key
from durable_agents.core.sealing import Keyring, UndecryptableError
from durable_agents.core.statemachine import Position as MachinePosition
from durable_agents.core.statemachine import RunEvent, transition


class CommitBuilder:
    """Assembles one commit: state machine, version, fencing, timestamps, conditions, history."""

    def __init__(
        self, run: RunSnapshot, loaded: Loaded, now: datetime, epoch: Fencing, settings: Settings
    ) -> None:
        self.run, self.cp, self.now, self.epoch = run, loaded.checkpoint, now, epoch
        self.operator_version = settings.operator_version
        self.migrated_from = loaded.migrated_from
        self.keyring = settings.keyring

    def commit(
        self,
        event: RunEvent,
        *,
        checkpoint: Checkpoint | None = None,
        waiting_for: str | None = None,
        outcome: Outcome | None = None,
        detail: str = "",
    ) -> Commit:
        run, now = self.run, self.now
        after = transition(MachinePosition(run.state, run.status.state_version), event)
        cp = checkpoint or self.cp
        changed = after.state is not run.state
        timestamps = cp.timestamps.model_copy(
            update={"updated_at": now, "entered_state_at": now if changed else cp.timestamps.entered_state_at}
        )
        if cp.position.step > self.cp.position.step:
            cp = cp.model_copy(update={"retry": RetryState()})  # attempts are counted per step
        if cp.plan is None:  # accepted by a release before plans were recorded: from now on
            cp = cp.model_copy(update={"plan": run.plan})
        runtime = cp.runtime_config
        if self.operator_version is not None:
            runtime = runtime.model_copy(update={"operator": self.operator_version})
        cp = cp.model_copy(
            update={
                "position": cp.position.model_copy(
                    update={"state": after.state.value, "state_version": after.state_version}
                ),
                "fencing": self.epoch,
                "timestamps": timestamps,
                "runtime_config": runtime,
                "trace_link": run_traceparent(run.trace_id),  # the root of the run's one trace
                # Its committer stamps every position: a status without a stamp is then forged.
                "position_stamped": True if self.keyring is not None else cp.position_stamped,
                # Once it had a data key, its answers must be sealed with that key: removing or
                # swapping the annotation (the webhook off) makes no hand-written answer count.
                "data_key_digest": data_key_fingerprint(self.keyring, run) or cp.data_key_digest,
            }
        )
        # Last, over the finished checkpoint: the proof that this operator committed its decisive
        # fields (bound to the run ID the status records). Without keys, no stale stamp survives.
        cp = (
            stamp_checkpoint(cp, keyring=self.keyring, run_id=run.run_id)
            if self.keyring is not None
            else cp.model_copy(update={"integrity": None})
        )
        status = status_after(
            run,
            after.state,
            after.state_version,
            event,
            now,
            self.epoch,
            waiting_for=waiting_for if after.state.waiting else None,
            outcome=outcome,
            detail=detail,
        )
        stamped = cp if self.keyring is not None else None
        return Commit(
            event,
            status,
            dump_checkpoint(cp),
            detail,
            migrated_from=self.migrated_from,
            stamped=stamped,
            stamped_by=self.keyring,
        )


def committed_read(obj: Mapping[str, Any], commit: Commit, *, prior: RunSnapshot) -> RunSnapshot:
    """The run as the worker holds it right after deciding ``commit`` (``obj``: the record with the
    commit's status, ``commit.wire_status()``, not read back): ``prior``'s spec, the commit's status
    model (validating its own dump gives it back), and the checkpoint the commit stamped, known
    loaded and verified (loading its dump back gives the same model: the checkpoint's round trip,
    ``tests/unit/engine/test_engine_read_once.py``); its stamp is this keyring's, its position the
    status's, its sealed values those the read before it verified or sealed anew. A status that
    does not hold the commit's own checkpoint object was not made by ``wire_status``: read as stored."""
    own = (obj.get("status") or {}).get("checkpoint") is commit.checkpoint
    read = RunSnapshot.from_object(obj, prior=prior, status=commit.status if own else None)
    stamped, keyring = commit.stamped, commit.stamped_by
    if stamped is not None and keyring is not None and read.raw_checkpoint is commit.checkpoint:
        loaded = Loaded(stamped)
        read.memo("loaded", None, lambda: loaded)
        read.memo("verified", keyring, lambda: loaded)
    return read


def data_key_fingerprint(keyring: Keyring | None, run: RunSnapshot) -> str | None:
    """The fingerprint of the run's data key, or None (no key, or none this keyring opens)."""
    if keyring is None or run.data_key is None:
        return None
    try:
        return fingerprint(open_data_key(keyring, run.data_key, run.namespace, run.name))
    except (UndecryptableError, ValueSealingError):
        return None


def commit_untouched(
    run: RunSnapshot,
    now: datetime,
    epoch: Fencing,
    event: RunEvent,
    outcome: Outcome | None,
    history: str,
    detail: str = "",
) -> Commit:
    """A transition that leaves the stored checkpoint exactly as it is (it may be unreadable here)."""
    after = transition(MachinePosition(run.state, run.status.state_version), event)
    status = status_after(
        run,
        after.state,
        after.state_version,
        event,
        now,
        epoch,
        waiting_for=None,
        outcome=outcome,
        detail=history,
    )
    raw = dict(run.raw_checkpoint) if run.raw_checkpoint is not None else None
    return Commit(event, status, raw, detail=detail or history)


def commit_forged(run: RunSnapshot, now: datetime, epoch: Fencing, problem: str) -> Commit:
    """Quarantine a run whose status names a position the operator did not write (its position
    stamp does not verify): ``IntegrityFailed``, the checkpoint untouched. The state machine has
    no transition out of a forged state (it may claim to be terminal): the run's real position is
    unknown here, so the quarantine follows the claimed version and a retry resumes from the
    verified checkpoint (resume validation), never from the forged claim."""
    outcome = Outcome(reason="IntegrityFailed", message=problem[:4000])
    status = status_after(
        run,
        RunState.QUARANTINED,
        run.status.state_version + 1,
        RunEvent.QUARANTINE,
        now,
        epoch,
        waiting_for=None,
        outcome=outcome,
        detail=f"IntegrityFailed: {problem}"[:512],
    )
    raw = dict(run.raw_checkpoint) if run.raw_checkpoint is not None else None
    return Commit(RunEvent.QUARANTINE, status, raw, detail=problem[:512])


def status_after(
    run: RunSnapshot,
    state: RunState,
    version: int,
    event: RunEvent,
    now: datetime,
    epoch: Fencing,
    *,
    waiting_for: str | None,
    outcome: Outcome | None,
    detail: str,
) -> AgentRunStatus:
    """The run's status once ``event`` moved it to ``state``: one more history entry, fresh
    conditions (its position stamp is made over the final status, as a commit leaves :func:`decide`)."""
    old = run.status
    entry = HistoryEntry(
        state_version=version,
        event=event.value,
        from_state=old.state,
        to_state=state,
        at=now,
        holder=epoch.holder,
        epoch=epoch.lease_transitions,
        detail=detail[:512] or None,
    )
    conditions = [
        *conditions_for(state, old.conditions, now, run.generation, outcome, waiting_for),
        *refusal_conditions(old.refused_requests, old.conditions, now, run.generation),
        # Written between transitions by the on-call controls (durable_agents.shell.runs.controls):
        # a transition keeps them.
        *(c for c in old.conditions if c.type in CARRIED_CONDITIONS),
    ]
    status = AgentRunStatus(
        state=state,
        state_version=version,
        state_since=now if state is not old.state or old.state_since is None else old.state_since,
        run_id=run.run_id,
        trace_id=run.trace_id,
        waiting_for=waiting_for,
        observed_generation=run.generation,
        outcome=outcome if outcome is not None else old.outcome,
        conditions=conditions,
        history=[*old.history, entry][-HISTORY_LIMIT:],
        cancellation=old.cancellation,
        quarantine_retried=old.quarantine_retried,
        refused_requests=old.refused_requests,
        ownership=old.ownership,  # the owning region (an adoption's stamp) outlives every commit
        reconcile_now=old.reconcile_now,
        escalation=old.escalation,
    )
    return status


# Conditions no transition decides, written between transitions: kept as they are by every
# commit (Escalated: durable_agents.shell.runs.controls).
CARRIED_CONDITIONS = frozenset({"Escalated", "Stuck"})


def conditions_for(
    state: RunState,
    previous: list[Condition],
    now: datetime,
    generation: int,
    outcome: Outcome | None,
    waiting_for: str | None,
) -> list[Condition]:
    """Waiting, Succeeded, Finished, Quarantined: kept current so ``kubectl wait`` is useful; and
    Reconciling, Ready, Stalled: health as kstatus and Argo CD read it (:mod:`durable_agents.core.health`)."""
    true, false, unknown = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN
    camel = "".join(part.capitalize() for part in state.value.split("_"))
    message = (outcome.message if outcome else "") or ""
    wanted = {
        "Waiting": (true, camel, waiting_for or "") if state.waiting else (false, camel, ""),
        "Succeeded": (true, "Completed", message)
        if state is RunState.COMPLETED
        else (false, outcome.reason if outcome else camel, message)
        if state.terminal
        else (unknown, camel, ""),
        "Finished": (true, camel, message) if state.terminal else (false, camel, ""),
        "Quarantined": (true, outcome.reason if outcome else camel, message)
        if state is RunState.QUARANTINED
        else (false, camel, ""),
        **run_health(state, outcome, waiting_for),
    }
    before = {condition.type: condition for condition in previous}
    out: list[Condition] = []
    for ctype, (status, reason, text) in wanted.items():
        prior = before.get(ctype)
        since = prior.last_transition_time if prior is not None and prior.status == status else now
        out.append(
            Condition(
                type=ctype,
                status=status,
                reason=reason,
                message=text[:32768],
                last_transition_time=since,
                observed_generation=generation,
            )
        )
    return out


def noted_waiting(
    status: Mapping[str, Any], waiting_for: str, generation: int, now: datetime
) -> dict[str, Any]:
    """The status (wire) of a run that cannot start yet, saying what it waits for, before any
    commit: ``waitingFor``, ``observedGeneration`` and its pending conditions (``Reconciling`` with
    the reason): a run with no status reads as Current to kstatus (Flux, kpt)."""
    health = [c.wire() for c in conditions_for(RunState.PENDING, [], now, generation, None, waiting_for)]
    types = {c["type"] for c in health}
    kept = [
        c for c in status.get("conditions") or [] if isinstance(c, Mapping) and c.get("type") not in types
    ]
    return {
        **status,
        "waitingFor": waiting_for,
        "observedGeneration": generation,
        "conditions": [*kept, *health],
    }


# --- a status note: no transition --------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StatusNote(Commit):
    """A commit that is not a transition: it changes what the status shows (the approvals a
    quorum has so far) and nothing else: the same state and state version, no history entry, the
    checkpoint as stored. Its ``event`` only repeats the run's last transition."""


def note_status(run: RunSnapshot, status: AgentRunStatus, detail: str) -> StatusNote:
    """``status`` (the run's own, one shown field changed) written without a transition."""
    history = run.status.history
    last = RunEvent(history[-1].event) if history else RunEvent.ACCEPTED
    raw = dict(run.raw_checkpoint) if run.raw_checkpoint is not None else None
    return StatusNote(last, status, raw, detail=detail)


# --- refusals --------------------------------------------------------------------------------

REQUEST_REFUSED = "RequestRefused"
RefusedField = Literal[
    "approvals",
    "cancellations",
    "retryQuarantine",
    "reconcileNow",
    "escalation",
    "reconciliations",
    "answers",
    "events",
]


@dataclass(frozen=True, kw_only=True)
class Refusal(Commit):
    """A commit that records one refused request (reported by an Event once written).

    ``moved``: whether it is also a transition. When it is not, it moves nothing: the same state
    and state version, no history entry, the checkpoint as stored; its ``event`` only repeats the
    run's last transition (the log names it).
    """

    refused: RefusedRequest
    moved: bool = True


def refusal_of(field: RefusedField, key: str, problem: Unproven, now: datetime) -> RefusedRequest:
    message = f"{field}[{key}] refused: {problem.message}"
    return RefusedRequest(field=field, key=key[:128], reason=problem.reason, message=message[:512], at=now)


def already_refused(status: AgentRunStatus, field: RefusedField, key: str) -> bool:
    return any((refused.field, refused.key) == (field, key[:128]) for refused in status.refused_requests)


def _recorded(status: AgentRunStatus, refused: RefusedRequest, now: datetime, generation: int) -> None:
    """Add ``refused`` to the status (in place) and bring its condition up to date."""
    status.refused_requests = [*status.refused_requests, refused][-REFUSED_LIMIT:]
    others = [c for c in status.conditions if c.type != REQUEST_REFUSED]
    status.conditions = [
        *others,
        *refusal_conditions(status.refused_requests, status.conditions, now, generation),
    ]


def refuse_in(commit: Commit, refused: RefusedRequest) -> Refusal:
    """``commit`` (a transition), also recording ``refused``."""
    status = commit.status.model_copy(deep=True)
    _recorded(status, refused, refused.at, status.observed_generation or 0)
    carried = {field.name: getattr(commit, field.name) for field in fields(Commit)}
    return Refusal(**{**carried, "status": status}, refused=refused)


def refuse(run: RunSnapshot, refused: RefusedRequest) -> Refusal:
    """Record ``refused`` and change nothing else: the run goes on waiting (or working) as it was."""
    status = run.status.model_copy(deep=True)
    _recorded(status, refused, refused.at, run.generation)
    history = run.status.history
    last = RunEvent(history[-1].event) if history else RunEvent.ACCEPTED
    raw = dict(run.raw_checkpoint) if run.raw_checkpoint is not None else None
    return Refusal(last, status, raw, detail=refused.message, refused=refused, moved=False)


def refusal_conditions(
    refused: Sequence[RefusedRequest], previous: Sequence[Condition], now: datetime, generation: int
) -> list[Condition]:
    """``RequestRefused`` (True, the newest refusal's reason) once any request was refused."""
    if not refused:
        return []
    newest = refused[-1]
    prior = next((c for c in previous if c.type == REQUEST_REFUSED), None)
    since = prior.last_transition_time if prior is not None and prior.status is ConditionStatus.TRUE else now
    more = f" ({len(refused)} requests refused in all)" if len(refused) > 1 else ""
    return [
        Condition(
            type=REQUEST_REFUSED,
            status=ConditionStatus.TRUE,
            reason=newest.reason,
            message=(newest.message + more)[:32768],
            last_transition_time=since,
            observed_generation=generation,
        )
    ]
