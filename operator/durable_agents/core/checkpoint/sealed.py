"""Sealed values in a checkpoint (``sealed``, by field name), each bound to its run and field."""

from __future__ import annotations

from durable_agents.core.checkpoint.record import Checkpoint
from durable_agents.core.checkpoint.versions import Quarantine
from durable_agents.core.entropy import Entropy
from durable_agents.core.sealing import Keyring, UndecryptableError, seal, sealing_aad, unseal


def seal_field(
    checkpoint: Checkpoint, name: str, plaintext: bytes, *, keyring: Keyring, run_uid: str, entropy: Entropy
) -> Checkpoint:
    """A copy of ``checkpoint`` with ``plaintext`` sealed under ``name``, bound to the run and field."""
    sealed = {
        **(checkpoint.sealed or {}),
        name: seal(keyring, plaintext, sealing_aad(run_uid, name), entropy=entropy),
    }
    # Validate the whole record again: the field name must be acceptable to the contract.
    return type(checkpoint).model_validate({**checkpoint.model_dump(), "sealed": sealed})


def unseal_field(checkpoint: Checkpoint, name: str, *, keyring: Keyring, run_uid: str) -> bytes:
    """The plaintext sealed under ``name``; ``KeyError`` if absent, ``UndecryptableError`` if unreadable."""
    sealed = (checkpoint.sealed or {})[name]
    return unseal(keyring, sealed, sealing_aad(run_uid, name))


def verify_sealed(checkpoint: Checkpoint, *, keyring: Keyring, run_uid: str) -> Quarantine | None:
    """Check that every sealed value still unseals with ``keyring``; a quarantine if one does not."""
    for name in sorted(checkpoint.sealed or {}):
        try:
            unseal_field(checkpoint, name, keyring=keyring, run_uid=run_uid)
        except UndecryptableError as exc:
            return Quarantine("Undecryptable", f"sealed field {name!r}: {exc}")
    return None
