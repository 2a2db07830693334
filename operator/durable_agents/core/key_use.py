"""Which keyring keys an AgentRun still needs, and re-stamping a checkpoint under the active key.

Key rotation: the active key seals and stamps everything new; a pass (the shell's resealer)
rewraps each run's data key and re-stamps each checkpoint under it; a key may be retired once no
run uses it. What "uses" means, by key ID (:func:`keys_in_use`):

- the run's data key (annotation ``durable-agents.io/data-key``) is wrapped with it: every
  sealed value of the run tree opens through it;
- ``status.checkpoint.integrity`` is its stamp, or a legacy ``status.checkpoint.sealed`` field is
  sealed with it: the engine verifies both before it resumes the run;
- a stamp in the spec the operator will still verify: ``spec.createdBy.stamp`` while the run has
  not been accepted (no checkpoint yet, or ``pending``), every ``spec.approvals[*].stamp``,
  ``spec.cancellations[*].stamp``, ``spec.reconciliations[*].stamp``,
  ``spec.retryQuarantineRequest.stamp`` and the child stamp annotation, while the run is not
  terminal; ``spec.reconcileNow.stamp`` and ``spec.escalation.stamp`` until they are acted on.

Terminal runs count for their data key and checkpoint: their sealed values and ledger must stay
readable and verifiable for audit, so a key is in use as long as any run that names it exists.
Their spec stamps are never verified again (a terminal run decides nothing), so they do not count.
Pure: no I/O, no Kubernetes import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import integrity_payload, verify_integrity
from durable_agents.core.engine.children import CHILD_STAMP_ANNOTATION
from durable_agents.core.entropy import Entropy
from durable_agents.core.sealed_values import DATA_KEY_ANNOTATION, data_key_id
from durable_agents.core.sealing import Keyring, SealedField, UndecryptableError, seal, sealing_aad, unseal
from durable_agents.core.stamps import Purpose, stamp, stamp_key_id

DATA_KEY = "data key"
CHECKPOINT_INTEGRITY = "checkpoint integrity"
SPEC_STAMPED_MAPS = ("approvals", "cancellations", "reconciliations")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _terminal(state: Any) -> bool:
    try:
        return RunState(state).terminal
    except ValueError:  # no state yet, or one this version does not know: counts as live
        return False


def keys_in_use(run: Mapping[str, Any]) -> dict[str, list[str]]:
    """Key ID -> what in ``run`` (an AgentRun as the API returns it) still needs that key."""
    uses: dict[str, list[str]] = {}

    def add(key_id: str | None, what: str) -> None:
        if key_id and what not in uses.get(key_id, []):
            uses.setdefault(key_id, []).append(what)

    annotations = _mapping(_mapping(run.get("metadata")).get("annotations"))
    status, spec = _mapping(run.get("status")), _mapping(run.get("spec"))
    add(data_key_id(_text(annotations.get(DATA_KEY_ANNOTATION))), DATA_KEY)
    checkpoint = status.get("checkpoint")
    if isinstance(checkpoint, Mapping):
        add(stamp_key_id(_text(checkpoint.get("integrity"))), CHECKPOINT_INTEGRITY)
        for name, sealed in sorted(_mapping(checkpoint.get("sealed")).items()):
            add(_text(_mapping(sealed).get("keyId")), f"checkpoint sealed field {name!r}")
    # The status's position stamp is the other half of a run's integrity (core/positions.py).
    add(stamp_key_id(_text(status.get("positionStamp"))), CHECKPOINT_INTEGRITY)
    state = status.get("state")
    if _terminal(state):
        return uses
    if not isinstance(checkpoint, Mapping) or state in (None, RunState.PENDING.value):
        add(stamp_key_id(_text(_mapping(spec.get("createdBy")).get("stamp"))), "spec.createdBy stamp")
    for field in SPEC_STAMPED_MAPS:
        for request_id, entry in sorted(_mapping(spec.get(field)).items()):
            add(stamp_key_id(_text(_mapping(entry).get("stamp"))), f"spec.{field}[{request_id!r}] stamp")
    retry = _mapping(spec.get("retryQuarantineRequest"))
    add(stamp_key_id(_text(retry.get("stamp"))), "spec.retryQuarantineRequest stamp")
    for field in ("reconcileNow", "escalation"):  # the on-call controls, until acted on
        asked = _mapping(spec.get(field))
        if asked.get("token") != _mapping(status.get(field)).get("token"):
            add(stamp_key_id(_text(asked.get("stamp"))), f"spec.{field} stamp")
    add(stamp_key_id(_text(annotations.get(CHILD_STAMP_ANNOTATION))), "child stamp")
    return uses


def _stale_sealed(stored: Mapping[str, Any], active_key_id: str) -> list[str]:
    sealed = _mapping(stored.get("sealed"))
    return sorted(name for name, field in sealed.items() if _mapping(field).get("keyId") != active_key_id)


def needs_restamp(stored: Mapping[str, Any], active_key_id: str) -> bool:
    """Whether a stored checkpoint still names a key other than the active one (one with no stamp,
    from before stamps, names none: the engine adopts or quarantines it, this pass leaves it)."""
    stamped_with = stamp_key_id(_text(stored.get("integrity")))
    return stamped_with not in (None, active_key_id) or bool(_stale_sealed(stored, active_key_id))


def restamp_stored(
    stored: Mapping[str, Any], keyring: Keyring, run_id: str, *, entropy: Entropy
) -> dict[str, Any] | None:
    """``stored`` (a ``status.checkpoint``) under the active key: legacy sealed fields re-sealed and
    the integrity stamp made again over the same decisive fields. None when there is nothing to do
    or when ``stored`` does not verify (a checkpoint that fails is the engine's to quarantine, never
    to be blessed by a new stamp)."""
    sealed = _mapping(stored.get("sealed"))
    stale = _stale_sealed(stored, keyring.active_key_id)
    if not needs_restamp(stored, keyring.active_key_id):
        return None
    if verify_integrity(stored, keyring=keyring, run_id=run_id) is not None:
        return None
    out = dict(stored)
    if stale:
        resealed = dict(sealed)
        for name in stale:
            aad = sealing_aad(run_id, name)
            try:
                plaintext = unseal(keyring, SealedField.model_validate(sealed[name]), aad)
            except (UndecryptableError, ValueError):
                return None
            resealed[name] = seal(keyring, plaintext, aad, entropy=entropy).model_dump(
                mode="json", by_alias=True
            )
        out["sealed"] = resealed
    out["integrity"] = stamp(keyring, Purpose.CHECKPOINT, integrity_payload(out, run_id))
    return out
