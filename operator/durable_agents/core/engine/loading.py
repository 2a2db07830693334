"""The checkpoint a decision starts from: a new run's initial one, or the stored one, loaded and
verified: its sealed values still unseal, and its integrity stamp proves this operator wrote it."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import ActionTier
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.authority import cancellation_unproven
from durable_agents.core.checkpoint import (
    FIRST_STAMPED_SCHEMA_VERSION,
    Checkpoint,
    Fencing,
    Loaded,
    PolicyRef,
    Position,
    Quarantine,
    RuntimeConfig,
    Timestamps,
    dump_checkpoint,
    stamp_checkpoint,
    verify_integrity,
    verify_sealed,
)
from durable_agents.core.engine.snapshot import RunSnapshot, Settings
from durable_agents.core.positions import describe, position_verifies, stamps_positions
from durable_agents.core.sealing import Keyring

# States whose status may name another position than the checkpoint: entered by a commit that
# leaves the stored checkpoint untouched (quarantine; a cancellation from quarantine; a cancel of
# an unreadable checkpoint), or terminal.
UNBOUND_STATES = frozenset(
    {RunState.QUARANTINED, RunState.CANCEL_REQUESTED} | {state for state in RunState if state.terminal}
)


def initial_checkpoint(run: RunSnapshot, now: datetime, epoch: Fencing, settings: Settings) -> dict[str, Any]:
    """A new run's first checkpoint: the runtime configuration and policy it starts under."""
    agent = run.spec.agent
    cp = Checkpoint(
        position=Position(state=RunState.PENDING.value, step=0, state_version=run.status.state_version),
        fencing=epoch,
        runtime_config=RuntimeConfig(
            model=agent.model if agent else None,
            prompt=agent.prompt if agent else None,
            tool_set=agent.tool_set if agent else None,
            operator=settings.operator_version,
        ),
        policy=PolicyRef(
            name=settings.policy_name,
            version=settings.policy_version,
            kind=settings.policy_kind,
            digest=settings.policy_digest,
        )
        if settings.policy_name
        else None,
        timestamps=Timestamps(created_at=now, updated_at=now, entered_state_at=now),
        definition=settings.definition if run.spec.agent_ref else None,
        plan=run.plan,
    )
    if settings.keyring is not None:  # a takeover's fencing write stores it as it is
        cp = stamp_checkpoint(cp, keyring=settings.keyring, run_id=run.run_id)
    return dump_checkpoint(cp)


def load_stored(run: RunSnapshot, settings: Settings) -> Loaded | Quarantine:
    """The stored checkpoint, migrated and validated, with every sealed value still unsealable and,
    where this operator has keys, its integrity stamp verified and its position the status's.

    A sealed value that cannot be unsealed (its key retired, the ciphertext tampered with, or no
    keyring here at all) quarantines the run: resuming would act without data the run relies on.
    Sealed values and stamps are bound to the recorded run ID, not the uid, so a restored run
    still verifies. Without a keyring (pure tests and tools: the operator never runs without one)
    nothing is stamped, so nothing is verified.
    """
    loaded = run.loaded
    if isinstance(loaded, Quarantine):
        return loaded
    keyring = settings.keyring
    if keyring is None:
        if loaded.checkpoint.sealed:
            names = ", ".join(sorted(loaded.checkpoint.sealed))
            return Quarantine(
                "Undecryptable", f"sealed fields ({names}) and this operator has no sealing keyring"
            )
        return loaded
    if loaded.migrated_from is not None and loaded.migrated_from < FIRST_STAMPED_SCHEMA_VERSION:
        unsealable = verify_sealed(loaded.checkpoint, keyring=keyring, run_uid=run.run_id)
        return unsealable or _adopt_legacy(run, loaded, settings)  # settings decide: never kept
    verified: Loaded | Quarantine = run.memo("verified", keyring, lambda: _verified(run, loaded, keyring))
    return verified


def _verified(run: RunSnapshot, loaded: Loaded, keyring: Keyring) -> Loaded | Quarantine:
    """A stamped checkpoint's sealed values unsealable, its stamp verified, its position bound."""
    unsealable = verify_sealed(loaded.checkpoint, keyring=keyring, run_uid=run.run_id)
    if unsealable is not None:
        return unsealable
    stored = run.raw_checkpoint
    assert stored is not None  # load_checkpoint quarantines a missing one
    return verify_integrity(stored, keyring=keyring, run_id=run.run_id) or _bound_to_status(run, loaded)


def _bound_to_status(run: RunSnapshot, loaded: Loaded) -> Loaded | Quarantine:
    """The engine acts by ``status.state``: it must be the stamped position (else the status was
    moved by someone other than the operator, e.g. into ``resume_validation``)."""
    position = loaded.checkpoint.position
    if run.state in UNBOUND_STATES or (position.state, position.state_version) == (
        run.state.value,
        run.status.state_version,
    ):
        return loaded
    return Quarantine(
        "IntegrityFailed",
        f"status says {run.state.value} at stateVersion {run.status.state_version} but the stamped "
        f"checkpoint says {position.state} at stateVersion {position.state_version}: the status was "
        "written by someone other than the operator",
    )


def _adopt_legacy(run: RunSnapshot, loaded: Loaded, settings: Settings) -> Loaded | Quarantine:
    """A checkpoint of a schema from before stamps (the previous operator version wrote it) is
    adopted and stamped, if nothing in it claims more than the record can corroborate: each
    recorded decision is in ``spec.approvals`` as the webhook stamped it (append-only), and each
    pending action whose tier needs approval names an approved request."""
    assert settings.keyring is not None
    problem = _uncorroborated(run, loaded.checkpoint, settings)
    if problem is not None:
        return Quarantine(
            "IntegrityFailed",
            f"schemaVersion {loaded.migrated_from} checkpoint (from before checkpoints were stamped) "
            f"not adopted: {problem}",
        )
    bound = _bound_to_status(run, loaded)
    if isinstance(bound, Quarantine):
        return bound
    adopted = stamp_checkpoint(loaded.checkpoint, keyring=settings.keyring, run_id=run.run_id)
    return Loaded(adopted, migrated_from=loaded.migrated_from)


def _uncorroborated(run: RunSnapshot, cp: Checkpoint, settings: Settings) -> str | None:
    for record in cp.approvals:
        if record.decision is None:
            continue
        given = run.spec.approvals.get(record.request_id)
        if (
            given is None
            or given.digest != record.digest
            or given.approver is None
            or given.approver.username != record.decided_by
            or ("approved" if given.decision == "approve" else "rejected") != record.decision
        ):
            return (
                f"approval {record.request_id!r} is recorded as {record.decision} by {record.decided_by}, "
                "but spec.approvals holds no such decision"
            )
    policy = settings.policy
    if policy is None:
        if not settings.policy_required:
            return None
        for pending in cp.pending_actions:  # the engine commits none without a policy
            tier = settings.tiers.get(pending.effect, ActionTier.CONSEQUENTIAL)
            if tier is not ActionTier.READ_ONLY:
                return (
                    f"pending action {pending.idempotency_key!r} ({tier.value}) but no policy governs the run"
                )
        return None
    approved = {record.request_id for record in cp.approvals if record.decision == "approved"}
    for pending in cp.pending_actions:
        tier = settings.tiers.get(pending.effect, ActionTier.CONSEQUENTIAL)
        if tier in policy.approval_required_tiers and pending.approval_request_id not in approved:
            return (
                f"pending action {pending.idempotency_key!r} ({tier.value}) needs an approval "
                "and names no approved request"
            )
    return None


def forged_position(run: RunSnapshot, settings: Settings) -> Quarantine | None:
    """Why the position ``run``'s status claims (its state, state version and outcome) was not
    written by the operator, or None when it was (or when nothing here can tell: no keyring).

    Checked before anything acts on the state, terminal states included: a status that claims
    ``completed`` must not be believed by the engine, a parent or retention. A status with a
    position stamp must verify; one without must come from before position stamps (its checkpoint
    does not say ``positionStamped``), and then a terminal state must be the verified checkpoint's
    own position. A run never committed (``pending``, no checkpoint) claims nothing yet."""
    keyring = settings.keyring
    if keyring is None or (run.raw_checkpoint is None and run.state is RunState.PENDING):
        return None
    claim = describe(run.status)
    if run.status.position_stamp is not None:
        if position_verifies(keyring, run.run_id, run.status):
            return None
        return Quarantine(
            "IntegrityFailed",
            f"the status says {claim}, but its position stamp does not verify for run {run.run_id!r}: "
            "the status was written by someone other than the operator",
        )
    # Without a stamp: an operator from before position stamps wrote it (a downgraded one writes
    # only these states over a newer checkpoint: it cannot read it), or someone forged it. A
    # quarantine only parks the run (a person's stamped control moves it on, from the checkpoint);
    # a cancellation counts only with the stamped request it names.
    if run.state is RunState.QUARANTINED or _stamped_cancellation(run, keyring):
        return None
    if stamps_positions(run.raw_checkpoint):
        return Quarantine(
            "IntegrityFailed",
            f"the status says {claim} with no position stamp, but its checkpoint was committed by an "
            "operator that stamps every position: the status was written by someone other than the operator",
        )
    if not run.state.terminal:
        return None  # from before position stamps: load_stored binds the state to the checkpoint
    loaded = load_stored(run, settings)
    if isinstance(loaded, Quarantine):
        return Quarantine("IntegrityFailed", f"the status says {claim}, and {loaded.message}")
    position = loaded.checkpoint.position
    if (position.state, position.state_version) == (run.state.value, run.status.state_version):
        return None
    return Quarantine(
        "IntegrityFailed",
        f"the status says {claim} with no position stamp, but the stamped checkpoint says "
        f"{position.state} at stateVersion {position.state_version}: the status was written by "
        "someone other than the operator",
    )


def forged_object(obj: Mapping[str, Any], keyring: Keyring | None) -> str | None:
    """:func:`forged_position` for an AgentRun as the API returns it (for its readers: a parent,
    retention, failover): why its claimed position is not to be believed, or None. A run whose
    spec or status does not even parse claims nothing to be believed either."""
    try:
        run = RunSnapshot.from_object(obj)
    except (ValidationError, KeyError, TypeError, ValueError) as err:
        return f"it does not parse: {type(err).__name__}"
    forged = forged_position(run, Settings(keyring=keyring))
    return forged.message if forged is not None else None


def unverified_record(obj: Mapping[str, Any], keyring: Keyring | None) -> str | None:
    """Why what a person would be shown of ``obj`` (an AgentRun as the API returns it: its
    position, checkpoint and approval request) is not what the operator wrote, or None. For a
    reveal: an approver must never be shown a request the run does not hold."""
    forged = forged_object(obj, keyring)
    if forged is not None:
        return forged
    run = RunSnapshot.from_object(obj)
    if keyring is None or run.raw_checkpoint is None:
        return None
    loaded = load_stored(run, Settings(keyring=keyring))
    if isinstance(loaded, Quarantine):
        return loaded.message
    request = run.status.approval_request
    if request is not None:
        pending = [approval for approval in loaded.checkpoint.approvals if approval.decision is None]
        held = (pending[-1].request_id, pending[-1].digest) if pending else None
        if held != (request.request_id, request.digest):
            return (
                f"status.approvalRequest {request.request_id!r} ({request.digest}) is not the request "
                "the run's stamped checkpoint holds"
            )
    return None


def _stamped_cancellation(run: RunSnapshot, keyring: Keyring) -> bool:
    """A cancellation in progress or done whose request in ``spec.cancellations`` is stamped."""
    handled = run.status.cancellation
    if run.state not in (RunState.CANCEL_REQUESTED, RunState.CANCELED) or handled is None:
        return False
    request = run.spec.cancellations.get(handled.request_id)
    return (
        request is not None
        and cancellation_unproven(keyring, run.run_id, handled.request_id, request) is None
    )
