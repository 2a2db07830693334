"""The checkpoint's integrity stamp: what it covers, how it is made and verified.

Integrity: anyone who may write ``agentruns/status`` could otherwise write what the run does next
(an approval, an intent, a finished child, a skipped step). Every commit therefore stamps the
checkpoint with :func:`durable_agents.core.stamps.stamp` (purpose ``CHECKPOINT``, keys derived
from the operator's sealing keyring) over :func:`integrity_payload`: the run ID and every field
of the checkpoint except these, which decide nothing about what happens next:

- ``fencing``: the lease epoch, rewritten by a takeover's fencing write without a transition and
  checked against the Lease itself (a forged epoch can only make a worker drop the run);
- ``timestamps``: wall-clock bookkeeping, deliberately never acted on;
- ``traceLink``: observability only;
- ``integrity`` itself.

So the stamp covers the position (state, step, state version), pending intents (``pendingActions``)
and completed tool calls, approval requests and recorded decisions (``approvals``), evidence, what
a wait waits on (``pendingInput``, ``pendingExternal``), retry attempts and windows, child runs,
handled cancellations, the policy and runtime configuration recorded, and the sealed values. A
field added later is covered unless it is added to :data:`UNSTAMPED_FIELDS`, which needs a new
schema version (the recorded version-3 fixtures verify against this definition). The stamp is
bound to the run ID (``status.runId``), so a checkpoint copied into another run does not verify.
A checkpoint whose stamp does not verify is quarantined (``IntegrityFailed``), never rewritten.

Checkpoints of versions 1 and 2 (written before stamps) are adopted on upgrade by the engine
(``core/engine/loading.py``): stamped at once, provided what they claim can be corroborated (each
recorded approval decision is in ``spec.approvals`` as the webhook stamped it; each pending intent
whose tier needs approval names an approved request; the status names the same position). The
residual risk, accepted so that runs cross the upgrade: whoever can write ``agentruns/status`` can
store a version-2 checkpoint instead of forging a stamp, and so move a run within its own spec
(skip a step, a wait, a retry) without an approval or an effect the run did not intend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from durable_agents.core.checkpoint.record import Checkpoint
from durable_agents.core.checkpoint.versions import Quarantine, dump_checkpoint, plain_copy
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp, stamp_key_id, verify

UNSTAMPED_FIELDS: Final = frozenset({"integrity", "fencing", "timestamps", "traceLink"})
"""Checkpoint fields the integrity stamp leaves out (see the module docstring for why each)."""


def integrity_payload(stored: Mapping[str, Any], run_id: str) -> dict[str, Any]:
    """What the integrity stamp covers: the run ID and every decisive field of the stored form.

    Computed from the stored (camelCase JSON) form, exactly as committed, so that a later schema
    version can still verify a stamp made under this one before migrating it.
    """
    return {
        "runId": run_id,
        "checkpoint": {key: value for key, value in stored.items() if key not in UNSTAMPED_FIELDS},
    }


def stamp_checkpoint(checkpoint: Checkpoint, *, keyring: Keyring, run_id: str) -> Checkpoint:
    """A copy of ``checkpoint`` carrying this operator's stamp over its decisive fields."""
    tag = stamp(keyring, Purpose.CHECKPOINT, integrity_payload(dump_checkpoint(checkpoint), run_id))
    return checkpoint.model_copy(update={"integrity": tag})


def verify_integrity(stored: Mapping[str, Any], *, keyring: Keyring, run_id: str) -> Quarantine | None:
    """None if the ``stored`` checkpoint carries this keyring's stamp over exactly its decisive
    fields and ``run_id``; otherwise a quarantine that says what is wrong. Never raises."""
    tag = stored.get("integrity")
    if not isinstance(tag, str) or not tag:
        return Quarantine(
            "IntegrityFailed",
            f"the schemaVersion {stored.get('schemaVersion')} checkpoint carries no integrity stamp: "
            "it was not committed by this operator",
        )
    key_id = stamp_key_id(tag)
    if key_id not in keyring.keys:
        return Quarantine(
            "IntegrityFailed",
            f"the checkpoint is stamped with key {key_id!r}, which is not in this operator's keyring "
            "(put the key back, then retry)",
        )
    try:
        payload = integrity_payload(plain_copy(stored), run_id)
        authentic = verify(keyring, Purpose.CHECKPOINT, payload, tag)
    except (TypeError, ValueError, RecursionError):  # not plain JSON: cannot be what was stamped
        authentic = False
    if not authentic:
        return Quarantine(
            "IntegrityFailed",
            f"the checkpoint's integrity stamp does not verify for run {run_id!r}: its decisive fields "
            "were written by someone other than the operator (or belong to another run)",
        )
    return None
