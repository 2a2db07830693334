"""Quarantine: a checkpoint this operator cannot read parks the run, untouched, until a user acts.

A run whose unit of work keeps raising in the operator (a bug, an input nothing else refused) is
quarantined the same way, with reason ``InternalError`` (:func:`internal_error`): the worker
retries it a bounded number of times first. Its checkpoint is readable, so a retry resumes it.

Only two controls move a quarantined run: a task cancellation, or a retry token
(``spec.retryQuarantine``), typically after an upgrade or once the sealing key is back. Each
counts only if the operator's admission webhook stamped it; one that is not is refused once and
the run stays quarantined.
"""

from __future__ import annotations

from datetime import datetime

from durable_agents.api.v1alpha1 import CancellationStatus, CancelScope, Outcome
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.authority import cancellation_unproven, retry_unproven, service_account_unproven
from durable_agents.core.checkpoint import Checkpoint, Fencing, Loaded, Quarantine
from durable_agents.core.engine.commits import (
    CommitBuilder,
    already_refused,
    commit_untouched,
    refusal_of,
    refuse,
)
from durable_agents.core.engine.decisions import Commit, Decision, Idle
from durable_agents.core.engine.loading import initial_checkpoint, load_stored
from durable_agents.core.engine.snapshot import RunSnapshot, Settings
from durable_agents.core.policy_integrity import POLICY_DELETED
from durable_agents.core.positions import stamp_position
from durable_agents.core.sealing import Keyring
from durable_agents.core.statemachine import RunEvent


def enter_quarantine(run: RunSnapshot, now: datetime, epoch: Fencing, problem: Quarantine) -> Commit:
    """Quarantine the run; the checkpoint is left byte-for-byte as stored (a newer operator may read it)."""
    outcome = Outcome(reason=problem.reason, message=problem.message[:4000])
    return commit_untouched(
        run, now, epoch, RunEvent.QUARANTINE, outcome, problem.reason, problem.message[:512]
    )


INTERNAL_ERROR = "InternalError"


def internal_error(
    run: RunSnapshot, now: datetime, epoch: Fencing, where: str, error: str, keyring: Keyring | None = None
) -> Commit | None:
    """Quarantine a run the operator failed on again and again (``where``: the stage and the
    transition it was at; ``error``: the exception's type and message), leaving its checkpoint as
    stored. None when there is nothing to quarantine (ended, or quarantined already)."""
    if run.state.terminal or run.state is RunState.QUARANTINED:
        return None
    message = (
        f"the operator failed on this run at {where} (state {run.state.value}, stateVersion"
        f" {run.status.state_version}): {error}; retry with spec.retryQuarantine (kubectl agentrun retry)"
    )
    outcome = Outcome(reason=INTERNAL_ERROR, message=message[:4000])
    commit = commit_untouched(
        run, now, epoch, RunEvent.QUARANTINE, outcome, f"{INTERNAL_ERROR}: {message}"[:512]
    )
    if keyring is not None:  # made outside decide, which stamps every other commit's position
        commit.status.position_stamp = stamp_position(keyring, run.run_id, commit.status)
    return commit


def policy_deleted(
    run: RunSnapshot, now: datetime, epoch: Fencing, message: str, keyring: Keyring | None = None
) -> Commit | None:
    """Quarantine a run whose AgentPolicy was force-deleted (``PolicyDeleted``: ``message`` names
    the policy and the on-call's reason), its checkpoint as stored: it never acts without its
    policy. None when there is nothing to quarantine (ended, or quarantined already)."""
    if run.state.terminal or run.state is RunState.QUARANTINED:
        return None
    outcome = Outcome(reason=POLICY_DELETED, message=message[:4000])
    commit = commit_untouched(
        run, now, epoch, RunEvent.QUARANTINE, outcome, f"{POLICY_DELETED}: {message}"[:512]
    )
    if keyring is not None:  # made outside decide, which stamps every other commit's position
        commit.status.position_stamp = stamp_position(keyring, run.run_id, commit.status)
    return commit


def quarantine_controls(run: RunSnapshot, now: datetime, epoch: Fencing, settings: Settings) -> Decision:
    """A quarantined run moves only on a user's stamped control: cancel, or retry (after an
    upgrade); an unstamped one is refused once."""
    spec, status, keyring = run.spec, run.status, settings.keyring
    handled = status.cancellation.request_id if status.cancellation else None
    # Only the whole task can be canceled: narrower scopes need a readable checkpoint.
    unproven = {
        request_id: cancellation_unproven(keyring, run.run_id, request_id, request)
        for request_id, request in sorted(spec.cancellations.items())
        if request_id != handled and request.scope is CancelScope.TASK
    }
    pending = [request_id for request_id, problem in unproven.items() if problem is None]
    if pending:
        request = spec.cancellations[pending[0]]
        commit = commit_untouched(
            run, now, epoch, RunEvent.CANCEL_REQUESTED, None, f"cancellation {pending[0]}"
        )
        commit.status.cancellation = CancellationStatus(
            request_id=pending[0],
            scope=CancelScope.TASK,
            reason=request.reason,
            requested_at=request.requested_at,
        )
        return commit
    for request_id, problem in unproven.items():
        if problem is not None and not already_refused(status, "cancellations", request_id):
            return refuse(run, refusal_of("cancellations", request_id, problem, now))
    token = spec.retry_quarantine
    if token is None or token == status.quarantine_retried:
        return Idle(reason="quarantined: retry (spec.retryQuarantine) or cancel")
    problem = retry_unproven(keyring, run.run_id, token, spec.retry_quarantine_request)
    if problem is not None:
        if already_refused(status, "retryQuarantine", token):
            return Idle(reason=f"quarantined: retry {token} refused ({problem.reason})")
        return refuse(run, refusal_of("retryQuarantine", token, problem, now))
    loaded = (
        load_stored(run, settings)
        if run.raw_checkpoint is not None
        else _accept_anew(run, now, epoch, settings)
    )
    if isinstance(loaded, Quarantine):
        return Idle(reason=f"quarantined: still unreadable: {loaded.message}")
    if isinstance(loaded, str):
        return Idle(reason=f"quarantined: {loaded}")
    builder = CommitBuilder(run, loaded, now, epoch, settings)
    commit = builder.commit(
        RunEvent.RELEASE_QUARANTINE,
        detail=f"retry {token}: checkpoint readable"
        + (f" (migrated from schemaVersion {loaded.migrated_from})" if loaded.migrated_from else ""),
    )
    commit.status.quarantine_retried = token
    return commit


def _accept_anew(run: RunSnapshot, now: datetime, epoch: Fencing, settings: Settings) -> Loaded | str:
    """A run quarantined before it was ever accepted (no checkpoint: e.g. an internal error while
    accepting it) starts from a new checkpoint on retry, once acceptance's own check passes
    (else: why it stays quarantined)."""
    unproven = service_account_unproven(
        settings.keyring, run.namespace, run.name, run.spec, run.created_at, settings.untimed_stamps_before
    )
    if unproven is not None:
        return f"not accepted on retry: ServiceAccountNotAuthorized: {unproven.message}"
    return Loaded(Checkpoint.model_validate(initial_checkpoint(run, now, epoch, settings)))


def cancel_unreadable(run: RunSnapshot, now: datetime, epoch: Fencing, problem: Quarantine) -> Commit:
    """Finish a cancellation whose checkpoint cannot be read."""
    # Nothing can be reconciled from an unreadable checkpoint; say so rather than assume anything.
    outcome = Outcome(
        reason="Canceled",
        message=f"canceled with an unreadable checkpoint ({problem.reason}): in-flight actions of this run "
        "were not reconciled by it; see its ActionRecords",
    )
    commit = commit_untouched(run, now, epoch, RunEvent.CANCEL_FINISHED, outcome, problem.reason)
    commit.status.cancellation = run.status.cancellation
    return commit
