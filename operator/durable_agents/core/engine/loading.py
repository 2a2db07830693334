"""The checkpoint a decision starts from: a new run's initial one, or the stored one, loaded."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import (
    Checkpoint,
    Fencing,
    Loaded,
    PolicyRef,
    Position,
    Quarantine,
    RuntimeConfig,
    Timestamps,
    dump_checkpoint,
    load_checkpoint,
    verify_sealed,
)
from durable_agents.core.engine.snapshot import RunSnapshot, Settings


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
        policy=PolicyRef(name=settings.policy_name, version=settings.policy_version)
        if settings.policy_name
        else None,
        timestamps=Timestamps(created_at=now, updated_at=now, entered_state_at=now),
    )
    return dump_checkpoint(cp)


def load_stored(run: RunSnapshot, settings: Settings) -> Loaded | Quarantine:
    """The stored checkpoint, migrated and validated, with every sealed value still unsealable.

    A sealed value that cannot be unsealed (its key retired, the ciphertext tampered with, or no
    keyring here at all) quarantines the run: resuming would act without data the run relies on.
    Sealed values are bound to the recorded run ID, not the uid, so a restored run still unseals.
    """
    loaded = load_checkpoint(run.raw_checkpoint)
    if isinstance(loaded, Quarantine) or not loaded.checkpoint.sealed:
        return loaded
    if settings.keyring is None:
        names = ", ".join(sorted(loaded.checkpoint.sealed))
        return Quarantine(
            "Undecryptable", f"sealed fields ({names}) and this operator has no sealing keyring"
        )
    return verify_sealed(loaded.checkpoint, keyring=settings.keyring, run_uid=run.run_id) or loaded
