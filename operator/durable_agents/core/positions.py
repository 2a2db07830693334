"""The position stamp: proof that the operator wrote a run's state, not someone with ``status``.

The engine acts by ``status.state``, and so do the readers of a run's state: a parent deciding on
its child's outcome, retention recording and deleting a finished run, the census and the stuck
check. The checkpoint's integrity stamp (:mod:`durable_agents.core.checkpoint`) covers the
position the checkpoint records, but some commits leave the checkpoint untouched (a quarantine, a
cancellation from quarantine or of an unreadable checkpoint), so the status may legitimately name
another position than the checkpoint. Every commit therefore also stamps, in
``status.positionStamp`` (purpose ``POSITION``), what a reader takes for a fact: the run ID, the
state, the state version, the outcome's reason, and the controls recorded as handled (the
cancellation, the quarantine retry token). A status whose stamp does not verify was written by
someone other than the operator.

A checkpoint committed by an operator that writes position stamps says so
(``positionStamped``, covered by the checkpoint's own stamp), so removing the position stamp from
the status does not make a forged state look like one written before position stamps existed.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durable_agents.api.v1alpha1 import AgentRunStatus
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp, stamp_key_id, verify

POSITION_STAMPED = "positionStamped"
"""The checkpoint key that says its committer stamps every position (see the module docstring)."""


def position_payload(run_id: str, status: AgentRunStatus) -> dict[str, Any]:
    """What a position stamp covers."""
    return {
        "kind": "RunPosition",
        "runId": run_id,
        "state": status.state.value,
        "stateVersion": status.state_version,
        "outcome": status.outcome.reason if status.outcome is not None else None,
        # The controls a commit records as handled: a forged one would make a person's request
        # look handled already (a cancellation of a quarantined run, a quarantine retry).
        "cancellation": status.cancellation.request_id if status.cancellation is not None else None,
        "quarantineRetried": status.quarantine_retried,
    }


def stamp_position(keyring: Keyring, run_id: str, status: AgentRunStatus) -> str:
    return stamp(keyring, Purpose.POSITION, position_payload(run_id, status))


def position_verifies(keyring: Keyring | None, run_id: str, status: AgentRunStatus) -> bool:
    return verify(keyring, Purpose.POSITION, position_payload(run_id, status), status.position_stamp)


def stamps_positions(raw_checkpoint: Mapping[str, Any] | None) -> bool:
    """Whether a stored checkpoint was committed by an operator that stamps every position."""
    return isinstance(raw_checkpoint, Mapping) and raw_checkpoint.get(POSITION_STAMPED) is True


def describe(status: AgentRunStatus) -> str:
    """``completed at stateVersion 7 (outcome Foo)``: the position a status claims."""
    outcome = f" (outcome {status.outcome.reason})" if status.outcome is not None else ""
    return f"{status.state.value} at stateVersion {status.state_version}{outcome}"


def restamped_position(keyring: Keyring, run_id: str, status: AgentRunStatus) -> str | None:
    """The position stamp made again under the active key (key rotation), or None when it is on
    the active key already, absent, or does not verify (a forged status is never blessed anew)."""
    if stamp_key_id(status.position_stamp) in (None, keyring.active_key_id):
        return None
    if not position_verifies(keyring, run_id, status):
        return None
    return stamp_position(keyring, run_id, status)
