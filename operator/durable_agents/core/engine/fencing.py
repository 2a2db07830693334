"""Taking over a run: stamp the new lease epoch into its checkpoint without a transition."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from durable_agents.core.checkpoint import Fencing, Quarantine, dump_checkpoint
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
