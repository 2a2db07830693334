"""Retention: when a finished run may be deleted, what a deleted run leaves behind, and what a
run being deleted needs next. Pure: no I/O (the shell is :mod:`durable_agents.shell.runs.retention`).

The rules:

- A run is due for deletion once ``ttlAfterFinished`` (its policy's ``retention``) has passed
  since it reached its terminal state (``status.stateSince`` of that state). No TTL: kept forever.
  Only a top-level run is due by itself: a child goes with its parent, so a parent never finds its
  finished child gone.
- A run is never let go while an action of its ledger is unsettled (``intent``, ``dispatching``,
  ``outcome_unknown``: an effect that may have happened and whose outcome is not known yet), nor
  while a child of it is not terminal.
- Deletion always goes through the finalizer :data:`FINALIZER`, added once a run is parked (waiting,
  quarantined or finished: no worker commits then): a run being deleted that is not finished is
  canceled first (a task-scope cancellation the operator stamps itself), and once it
  is settled its compact record (:func:`build_record`) is written before the finalizer goes. So
  the record of an effect that happened is never lost, whoever deleted the run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import (
    API_VERSION,
    RECORD_EVIDENCE_LIMIT,
    RECORD_LEDGER_LIMIT,
    AgentRunRecord,
    AgentRunRecordSpec,
    ApprovalSummary,
    CancellationStatus,
    CancelRequest,
    CancelScope,
    ChildSummary,
    EvidenceDigest,
    HistoryEntry,
    LedgerEntry,
    Outcome,
    RecordedRun,
    Retention,
)
from durable_agents.api.v1alpha1.actionrecord import ActionState
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.authority import instant, stamp_cancellation
from durable_agents.core.durations import InvalidDuration, parse_duration
from durable_agents.core.outcome_stamps import believed_status
from durable_agents.core.sealing import Keyring

FINALIZER = "durable-agents.io/cancel-before-delete"
"""Put on every run by the operator: deleting a run first settles it and writes its record."""
DELETION_REQUEST_ID = "deleted"
"""The request ID of the task-scope cancellation the operator stamps when a live run is deleted."""
RECORD_RUN_LABEL = "durable-agents.io/run"
UNSETTLED: frozenset[str] = frozenset(
    {ActionState.INTENT.value, ActionState.DISPATCHING.value, ActionState.OUTCOME_UNKNOWN.value}
)
_TERMINAL = frozenset(s.value for s in RunState if s.terminal)
_PARKED = frozenset(s.value for s in RunState if s.terminal or s.waiting or s is RunState.QUARANTINED)
"""Where no worker commits until something happens: the finalizer is added there, so that its
write never races a worker's commit (which would then be refused and retried)."""


def _status(run: Mapping[str, Any]) -> Mapping[str, Any]:
    status = run.get("status")
    return status if isinstance(status, Mapping) else {}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def needs_finalizer(run: Mapping[str, Any]) -> bool:
    """Whether the operator adds its finalizer now: not there yet, and the run is parked."""
    meta = _meta(run)
    if meta.get("deletionTimestamp") is not None or FINALIZER in (meta.get("finalizers") or []):
        return False
    return _status(run).get("state") in _PARKED


def is_terminal(run: Mapping[str, Any]) -> bool:
    return _status(run).get("state") in _TERMINAL


def finished_at(run: Mapping[str, Any]) -> datetime | None:
    """When the run reached its terminal state; None while it is not finished."""
    return _time(_status(run).get("stateSince")) if is_terminal(run) else None


def retention_of(policy: Mapping[str, Any] | None) -> Retention:
    """The policy's retention (its ``spec``); a missing or unreadable one keeps runs and records."""
    spec = (policy or {}).get("spec")
    raw = spec.get("retention") if isinstance(spec, Mapping) else None
    if not isinstance(raw, Mapping):
        return Retention()
    try:
        return Retention.model_validate(raw)
    except ValidationError:
        return Retention()


def ttl_of(retention: Retention) -> timedelta | None:
    """The TTL after finishing; None keeps the run (unset, or not a duration the API allows)."""
    if retention.ttl_after_finished is None:
        return None
    try:
        return parse_duration(retention.ttl_after_finished)
    except InvalidDuration:
        return None


def due_at(run: Mapping[str, Any], ttl: timedelta | None) -> datetime | None:
    """When a top-level finished run may be deleted; None: never by itself (yet)."""
    if ttl is None or is_child(run):
        return None
    finished = finished_at(run)
    return None if finished is None else finished + ttl


def is_child(run: Mapping[str, Any]) -> bool:
    spec = run.get("spec")
    return isinstance(spec, Mapping) and spec.get("parentRef") is not None


def owned_by(run: Mapping[str, Any], parent: Mapping[str, Any]) -> bool:
    """Whether ``run`` is a child of ``parent`` (by owner reference uid)."""
    uid = _meta(parent).get("uid")
    refs = _meta(run).get("ownerReferences") or []
    return any(isinstance(r, Mapping) and r.get("uid") == uid for r in refs)


def records_of(run: Mapping[str, Any], records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ActionRecords of this run (labelled with its name; its uid or run ID in ``runRef``)."""
    meta, status = _meta(run), _status(run)
    ids = {meta.get("uid"), status.get("runId")} - {None}
    out = []
    for record in records:
        ref = (record.get("spec") or {}).get("runRef") or {}
        if ref.get("name") == meta.get("name") and (not ids or ref.get("uid") in ids):
            out.append(record)
    return out


def record_state(record: Mapping[str, Any]) -> str:
    status = record.get("status")
    return str((status or {}).get("state") or ActionState.INTENT.value)


def believed_state(record: Mapping[str, Any], keyring: Keyring | None, now: datetime) -> str:
    """The record's state as the operator wrote it: a settled state without a valid outcome stamp
    is ``outcome_unknown`` (:mod:`durable_agents.core.outcome_stamps`)."""
    if keyring is None:
        return record_state(record)
    return believed_status(record, keyring, now).state.value


def blockers(
    records: Iterable[Mapping[str, Any]],
    children: Iterable[Mapping[str, Any]],
    keyring: Keyring | None = None,
    now: datetime | None = None,
) -> list[str]:
    """Why the run may not be let go yet (empty: it may): unsettled actions (as believed: a forged
    settled state does not let a run with an action in flight go), running children."""
    at = now or datetime.now(UTC)
    states = [(_meta(r).get("name"), believed_state(r, keyring, at)) for r in records]
    out = [f"action {name} is {state}" for name, state in states if state in UNSETTLED]
    out += [
        f"child {_meta(c).get('name')} is {_status(c).get('state') or 'pending'}"
        for c in children
        if not is_terminal(c)
    ]
    return out


class Next(StrEnum):
    """What a run needs from the retention controller."""

    NOTHING = "nothing"
    ADD_FINALIZER = "add_finalizer"
    CANCEL = "cancel"  # being deleted while live: stamp a task-scope cancellation
    WAIT = "wait"  # being deleted: the cancellation or the ledger is not settled yet
    FINALIZE = "finalize"  # being deleted and settled: write the record, remove the finalizer


def next_step(run: Mapping[str, Any], blocked: Sequence[str]) -> Next:
    """The next step for ``run`` given its blockers (:func:`blockers`)."""
    meta, status = _meta(run), _status(run)
    finalizers = meta.get("finalizers") or []
    if meta.get("deletionTimestamp") is None:
        return Next.ADD_FINALIZER if needs_finalizer(run) else Next.NOTHING
    if FINALIZER not in finalizers:
        return Next.NOTHING
    # A run never committed did nothing; a quarantined one will do nothing until retried.
    idle = status.get("state") in (None, "", RunState.PENDING, RunState.QUARANTINED)
    if not (is_terminal(run) or idle):
        asked = (run.get("spec") or {}).get("cancellations") or {}
        return Next.WAIT if DELETION_REQUEST_ID in asked else Next.CANCEL
    return Next.WAIT if blocked else Next.FINALIZE


def deletion_cancellation(
    run: Mapping[str, Any], keyring: Keyring, operator: str, now: datetime
) -> dict[str, Any]:
    """``spec.cancellations`` entry that cancels a deleted live run, stamped as the webhook would
    (the operator holds the keys; the webhook, when it runs, re-stamps it as the operator's user)."""
    entry: dict[str, Any] = {
        "scope": CancelScope.TASK.value,
        "reason": "the run was deleted: canceled before it goes",
        "requestedBy": {"username": operator},
        "requestedAt": instant(now),
    }
    run_id = str(_status(run).get("runId") or _meta(run).get("uid") or "")
    request = CancelRequest.model_validate(entry)
    return {**entry, "stamp": stamp_cancellation(keyring, run_id, DELETION_REQUEST_ID, request)}


def record_name(run: Mapping[str, Any]) -> str:
    """``<run>-<uid prefix>``: a run recreated under the same name gets its own record."""
    meta = _meta(run)
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
    full = f"{name}-{uid[:8]}"
    if len(full) <= 253:
        return full
    return f"{full[:242].rstrip('-.')}-{hashlib.sha256(full.encode()).hexdigest()[:10]}"


def label_value(name: str) -> str:
    """A run's name as a label value (63 characters; longer names shortened with a hash), as the
    run's Leases, ActionRecords and children are labelled (a selector on it finds them; the full
    name and uid are checked after: :func:`records_of`, :func:`owned_by`)."""
    if len(name) <= 63:
        return name
    return f"{name[:52].rstrip('-.')}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


# --- the compact record ----------------------------------------------------------------------


def _valid(model: Any, raw: Any) -> Any:
    """``raw`` as ``model``, or None when it does not parse (a record never fails on one entry)."""
    try:
        return model.model_validate(raw)
    except ValidationError:
        return None


def _ledger(records: Iterable[Mapping[str, Any]]) -> list[LedgerEntry]:
    out = []
    for record in records:
        spec, status = record.get("spec") or {}, record.get("status") or {}
        entry = _valid(
            LedgerEntry,
            {
                "idempotencyKey": spec.get("idempotencyKey"),
                "actionRecord": _meta(record).get("name"),
                "effect": spec.get("effect"),
                "tier": spec.get("tier"),
                "stepIndex": spec.get("stepIndex"),
                "state": record_state(record),
                "attempts": status.get("attempts") or 0,
                "finishedAt": status.get("finishedAt"),
                "reason": status.get("reason"),
                "approvalRequestId": spec.get("approvalRequestId"),
                "compensates": spec.get("compensates"),
            },
        )
        if entry is not None:
            out.append(entry)
    return sorted(out, key=lambda e: (e.step_index, e.idempotency_key))


def _evidence(checkpoint: Mapping[str, Any]) -> list[EvidenceDigest]:
    out = []
    for field in ("inputRefs", "outputRefs", "evidence"):
        for ref in checkpoint.get(field) or []:
            if isinstance(ref, Mapping):
                keep = {k: ref.get(k) for k in ("id", "source", "stepIndex", "contentDigest")}
                digest = _valid(EvidenceDigest, {**keep, "source": ref.get("source") or "kubernetes"})
                if digest is not None:
                    out.append(digest)
    return out


def _approvals(run: Mapping[str, Any], checkpoint: Mapping[str, Any]) -> list[ApprovalSummary]:
    decisions = (run.get("spec") or {}).get("approvals") or {}
    out = []
    for raw in checkpoint.get("approvals") or []:
        if not isinstance(raw, Mapping):
            continue
        given = decisions.get(raw.get("requestId")) or {}
        approver = (given.get("approver") or {}).get("username") or raw.get("decidedBy")
        summary = _valid(
            ApprovalSummary,
            {
                "requestId": raw.get("requestId"),
                "digest": raw.get("digest"),
                "stepIndex": raw.get("stepIndex"),
                "policyVersion": raw.get("policyVersion"),
                "decision": raw.get("decision"),
                "approver": approver,
                "decidedAt": raw.get("decidedAt"),
            },
        )
        if summary is not None:
            out.append(summary)
    return out


def _children(checkpoint: Mapping[str, Any]) -> list[ChildSummary]:
    kept = (_valid(ChildSummary, c) for c in checkpoint.get("children") or [] if isinstance(c, Mapping))
    return [c for c in kept if c is not None]


def _recorded_run(run: Mapping[str, Any], policy_version: str | None) -> RecordedRun:
    meta, spec, status = _meta(run), run.get("spec") or {}, _status(run)
    return RecordedRun(
        name=str(meta.get("name")),
        uid=str(meta.get("uid")),
        run_id=status.get("runId"),
        task_type=str(spec.get("taskType") or ""),
        policy=(spec.get("policyRef") or {}).get("name"),
        policy_version=policy_version,
        parent=(spec.get("parentRef") or {}).get("name"),
        created_at=_time(meta.get("creationTimestamp")),
        created_by=(spec.get("createdBy") or {}).get("username"),
    )


def build_record(
    run: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    *,
    why: Literal["retention", "deleted"],
    now: datetime,
) -> dict[str, Any]:
    """The AgentRunRecord of ``run`` with the ActionRecords of its ledger: outcome, history,
    cancellation (its unreversed effects), digests of evidence and approvals, the ledger's keys
    and outcome states. Only fields chosen one by one: never a sealed value, argument or response."""
    status = _status(run)
    checkpoint = status.get("checkpoint") if isinstance(status.get("checkpoint"), Mapping) else {}
    assert isinstance(checkpoint, Mapping)
    ledger, evidence = _ledger(records), _evidence(checkpoint)
    history = [h for h in (_valid(HistoryEntry, e) for e in status.get("history") or []) if h is not None]
    policy_version = (checkpoint.get("policy") or {}).get("version")
    spec = AgentRunRecordSpec(
        run=_recorded_run(run, policy_version),
        state=str(status.get("state") or RunState.PENDING.value),
        outcome=_valid(Outcome, status.get("outcome")),
        finished_at=finished_at(run),
        recorded_at=now,
        why=why,
        history=history,
        cancellation=_valid(CancellationStatus, status.get("cancellation")),
        evidence=evidence[:RECORD_EVIDENCE_LIMIT],
        approvals=_approvals(run, checkpoint)[:64],
        ledger=ledger[:RECORD_LEDGER_LIMIT],
        children=_children(checkpoint)[:64],
        truncated=len(ledger) > RECORD_LEDGER_LIMIT or len(evidence) > RECORD_EVIDENCE_LIMIT,
    )
    meta = _meta(run)
    body = AgentRunRecord(
        metadata={
            "name": record_name(run),
            "namespace": meta.get("namespace"),
            "labels": {RECORD_RUN_LABEL: label_value(str(meta.get("name")))},
        },
        spec=spec,
    ).wire()
    body["apiVersion"] = API_VERSION
    return body
