"""Taking over a run: stamp the new lease epoch into its checkpoint without a transition; and the
epoch a run last recorded, which tells a new holder whether to fence it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from durable_agents.core.checkpoint import Fencing, Loaded, Quarantine, dump_checkpoint, load_checkpoint
from durable_agents.core.engine.loading import initial_checkpoint, load_stored
from durable_agents.core.engine.snapshot import RunSnapshot, Settings


def fence(
    run: RunSnapshot, epoch: Fencing, *, now: datetime, settings: Settings | None = None
) -> dict[str, Any] | None:
    """The status that stamps a new lease epoch into the run without a transition, or None.

    A worker that takes over an expired (not released) lease writes this first, by compare-and-
    swap, before the Lease names it: from then on a zombie holder's commit, prepared against the
    old resourceVersion, is refused. A run without a checkpoint gets its initial checkpoint (still
    ``pending``); an unreadable checkpoint is never rewritten (None: quarantine will follow).
    """
    if run.raw_checkpoint is None:
        status = run.status.wire()
        status["checkpoint"] = initial_checkpoint(run, now, epoch, settings or Settings())
        return status
    loaded = load_stored(run, settings or Settings())
    if isinstance(loaded, Quarantine):
        return None
    status = run.status.wire()
    status["checkpoint"] = dump_checkpoint(loaded.checkpoint.model_copy(update={"fencing": epoch}))
    return status


def checkpoint_epoch(raw: Any) -> Fencing | None:
    """The lease epoch a stored checkpoint was committed under; None when it has none (or does
    not read)."""
    loaded = load_checkpoint(raw) if isinstance(raw, dict) else None
    return loaded.checkpoint.fencing if isinstance(loaded, Loaded) else None


def snapshot_epoch(run: RunSnapshot) -> Fencing | None:
    """:func:`checkpoint_epoch` of a read, its checkpoint loaded once per read."""
    loaded = run.loaded if isinstance(run.raw_checkpoint, dict) else None
    return loaded.checkpoint.fencing if isinstance(loaded, Loaded) else None


def recorded_epoch(run: RunSnapshot) -> tuple[str, int] | None:
    """The (holder, epoch) a run last recorded: its checkpoint's, or (unreadable) its history's."""
    epoch = snapshot_epoch(run)
    if epoch is not None:
        return epoch.holder, epoch.lease_transitions
    last = max(
        (h for h in run.status.history if h.epoch is not None), key=lambda h: h.epoch or 0, default=None
    )
    return (last.holder or "", last.epoch) if last is not None and last.epoch is not None else None
