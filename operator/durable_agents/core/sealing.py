"""Sealing of sensitive checkpoint fields with AES-256-GCM.

This module owns the sealed-field format (key ID, nonce, ciphertext), the keyring (which keys may
unseal, which one seals) and the associated data that binds a sealed value to its run and field.

It must not do I/O and must not import Kubernetes: the shell reads the keyring's base64 values
from a Secret and hands them to :meth:`Keyring.from_b64`. A value that cannot be unsealed (its key
was retired, or the ciphertext or its binding was tampered with) raises
:class:`UndecryptableError`, which the caller turns into a quarantine, never a crash loop.

Rotation: the keyring's active key seals; every key still in the keyring unseals. Retire a key
only after no checkpoint sealed with it remains.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints
from pydantic.alias_generators import to_camel

from durable_agents.core.entropy import Entropy, draw

KEY_BYTES: Final = 32
NONCE_BYTES: Final = 12
TAG_BYTES: Final = 16

# Key IDs become the data keys of a Kubernetes Secret, so they follow that alphabet.
_KEY_ID_PATTERN: Final = r"^[-._a-zA-Z0-9]{1,253}$"
_AAD_PREFIX: Final = b"durable-agents.io/sealed/v1"


class SealingError(Exception):
    """Base of every error raised by this module."""


class KeyringError(SealingError):
    """The keyring material is malformed: a bad key ID, bad base64, a wrong key length."""


class UndecryptableError(SealingError):
    """A sealed value cannot be unsealed: its key is not in the keyring, or authentication failed."""

    def __init__(self, key_id: str, message: str) -> None:
        super().__init__(message)
        self.key_id = key_id


def _b64decode(value: str) -> bytes:
    return base64.b64decode(value.encode("ascii"), validate=True)


def _b64_of_length(*, exact: int | None = None, minimum: int = 0) -> AfterValidator:
    def check(value: str) -> str:
        try:
            raw = _b64decode(value)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise ValueError("not valid base64") from exc
        if exact is not None and len(raw) != exact:
            raise ValueError(f"must decode to exactly {exact} bytes, got {len(raw)}")
        if len(raw) < minimum:
            raise ValueError(f"must decode to at least {minimum} bytes, got {len(raw)}")
        return value

    return AfterValidator(check)


KeyId = Annotated[str, StringConstraints(pattern=_KEY_ID_PATTERN)]


class SealedField(BaseModel):
    """One sealed value as stored in a checkpoint: plain JSON, safe to persist and to show."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)

    key_id: KeyId
    """Which keyring entry sealed the value."""
    nonce: Annotated[str, _b64_of_length(exact=NONCE_BYTES)]
    """Base64 of the 96-bit GCM nonce, unique per seal."""
    ciphertext: Annotated[str, _b64_of_length(minimum=TAG_BYTES)]
    """Base64 of the ciphertext followed by the 128-bit authentication tag."""


@dataclass(frozen=True)
class Keyring:
    """Sealing keys by key ID, and the ID of the key that seals new values."""

    keys: Mapping[str, bytes] = field(repr=False)  # never print key material
    active_key_id: str

    def __post_init__(self) -> None:
        for key_id, key in self.keys.items():
            if not re.fullmatch(_KEY_ID_PATTERN, key_id):
                raise KeyringError(f"key ID {key_id!r} must match {_KEY_ID_PATTERN}")
            if len(key) != KEY_BYTES:
                raise KeyringError(f"key {key_id!r} must be {KEY_BYTES} bytes, got {len(key)}")
        if self.active_key_id not in self.keys:
            raise KeyringError(f"active key ID {self.active_key_id!r} is not in the keyring")
        # A read-only copy: a keyring handed around must not change under its users.
        object.__setattr__(self, "keys", MappingProxyType(dict(self.keys)))

    @classmethod
    def from_b64(cls, encoded: Mapping[str, str], active_key_id: str) -> Keyring:
        """Build a keyring from key ID -> base64 key, the shape of a Kubernetes Secret's ``data``."""
        keys: dict[str, bytes] = {}
        for key_id, value in encoded.items():
            try:
                keys[key_id] = _b64decode(value.strip())
            except (binascii.Error, UnicodeEncodeError) as exc:
                raise KeyringError(f"key {key_id!r} is not valid base64") from exc
        return cls(keys=keys, active_key_id=active_key_id)


def generate_key(*, entropy: Entropy) -> bytes:
    """A fresh random 256-bit sealing key, from ``entropy``."""
    return draw(entropy, KEY_BYTES)


def sealing_aad(run_uid: str, field_name: str) -> bytes:
    """Associated data binding a sealed value to one run and one field.

    A sealed value copied into another run, or moved to another field, fails to unseal.
    """
    if not run_uid or not field_name or "\x00" in run_uid or "\x00" in field_name:
        raise ValueError("run UID and field name must be non-empty and free of NUL characters")
    return b"\x00".join((_AAD_PREFIX, run_uid.encode(), field_name.encode()))


def seal(keyring: Keyring, plaintext: bytes, aad: bytes, *, entropy: Entropy) -> SealedField:
    """Seal ``plaintext`` with the keyring's active key, authenticating ``aad`` alongside it; the
    nonce is drawn from ``entropy``."""
    nonce = draw(entropy, NONCE_BYTES)
    ciphertext = AESGCM(keyring.keys[keyring.active_key_id]).encrypt(nonce, plaintext, aad)
    return SealedField(
        key_id=keyring.active_key_id,
        nonce=base64.b64encode(nonce).decode("ascii"),
        ciphertext=base64.b64encode(ciphertext).decode("ascii"),
    )


def unseal(keyring: Keyring, sealed: SealedField, aad: bytes) -> bytes:
    """Recover the plaintext of ``sealed``; raise :class:`UndecryptableError` when that is impossible."""
    key = keyring.keys.get(sealed.key_id)
    if key is None:
        raise UndecryptableError(sealed.key_id, f"sealing key {sealed.key_id!r} is not in the keyring")
    try:
        nonce = _b64decode(sealed.nonce)
        ciphertext = _b64decode(sealed.ciphertext)
        return AESGCM(key).decrypt(nonce, ciphertext, aad)
    except (InvalidTag, binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise UndecryptableError(
            sealed.key_id,
            f"sealed value does not authenticate with key {sealed.key_id!r} (tampered, or bound elsewhere)",
        ) from exc
