"""Sealing of sensitive checkpoint fields: AES-GCM round trip, binding, key rotation, keyring loading."""

from __future__ import annotations

import base64
import os

import pytest
from pydantic import ValidationError

from durable_agents.core.sealing import (
    Keyring,
    KeyringError,
    SealedField,
    SealingError,
    UndecryptableError,
    generate_key,
    seal,
    sealing_aad,
    unseal,
)

pytestmark = pytest.mark.unit

RUN_UID = "4c1f9a2e-7d3b-4e6f-9a8c-1b2d3e4f5a6b"
AAD = sealing_aad(RUN_UID, "actionArguments")


def _ring(*key_ids: str, active: str | None = None) -> Keyring:
    keys = {key_id: bytes([index]) * 32 for index, key_id in enumerate(key_ids, start=1)}
    return Keyring(keys=keys, active_key_id=active or key_ids[-1])


def test_seal_then_unseal_returns_the_plaintext() -> None:
    ring = _ring("k1")
    sealed = seal(ring, b'{"amount": 125, "currency": "EUR"}', AAD, entropy=os.urandom)
    assert sealed.key_id == "k1"
    assert b"amount" not in base64.b64decode(sealed.ciphertext)
    assert unseal(ring, sealed, AAD) == b'{"amount": 125, "currency": "EUR"}'


def test_every_seal_uses_a_fresh_nonce() -> None:
    ring = _ring("k1")
    first, second = seal(ring, b"same", AAD, entropy=os.urandom), seal(ring, b"same", AAD, entropy=os.urandom)
    assert first.nonce != second.nonce
    assert first.ciphertext != second.ciphertext


def test_sealed_field_dumps_camel_case_and_reloads() -> None:
    sealed = seal(_ring("k1"), b"secret", AAD, entropy=os.urandom)
    raw = sealed.model_dump(by_alias=True)
    assert set(raw) == {"keyId", "nonce", "ciphertext"}
    assert SealedField.model_validate(raw) == sealed


@pytest.mark.parametrize(
    "aad",
    [
        sealing_aad("another-run-uid", "actionArguments"),
        sealing_aad(RUN_UID, "question"),
        b"",
    ],
    ids=["other-run", "other-field", "no-aad"],
)
def test_a_value_bound_elsewhere_does_not_unseal(aad: bytes) -> None:
    ring = _ring("k1")
    sealed = seal(ring, b"secret", AAD, entropy=os.urandom)
    with pytest.raises(UndecryptableError) as caught:
        unseal(ring, sealed, aad)
    assert caught.value.key_id == "k1"


def test_tampered_ciphertext_does_not_unseal() -> None:
    ring = _ring("k1")
    sealed = seal(ring, b"secret", AAD, entropy=os.urandom)
    raw = bytearray(base64.b64decode(sealed.ciphertext))
    raw[0] ^= 0x01
    tampered = sealed.model_copy(update={"ciphertext": base64.b64encode(bytes(raw)).decode()})
    with pytest.raises(UndecryptableError):
        unseal(ring, tampered, AAD)


def test_a_missing_key_is_undecryptable_not_a_key_error() -> None:
    sealed = seal(_ring("k1"), b"secret", AAD, entropy=os.urandom)
    with pytest.raises(UndecryptableError, match="'k1' is not in the keyring") as caught:
        unseal(_ring("k2"), sealed, AAD)
    assert caught.value.key_id == "k1"
    assert isinstance(caught.value, SealingError)


def test_rotation_new_key_seals_old_keys_still_unseal() -> None:
    old_ring = _ring("k1")
    sealed_before = seal(old_ring, b"before rotation", AAD, entropy=os.urandom)

    rotated = _ring("k1", "k2", active="k2")
    sealed_after = seal(rotated, b"after rotation", AAD, entropy=os.urandom)
    assert sealed_after.key_id == "k2"
    assert unseal(rotated, sealed_before, AAD) == b"before rotation"
    assert unseal(rotated, sealed_after, AAD) == b"after rotation"

    retired = Keyring(keys={"k2": rotated.keys["k2"]}, active_key_id="k2")
    assert unseal(retired, sealed_after, AAD) == b"after rotation"
    with pytest.raises(UndecryptableError):
        unseal(retired, sealed_before, AAD)


def test_keyring_loads_from_base64_secret_data() -> None:
    k1, k2 = generate_key(entropy=os.urandom), generate_key(entropy=os.urandom)
    ring = Keyring.from_b64(
        {"2025-01": base64.b64encode(k1).decode(), "2025-02": base64.b64encode(k2).decode()},
        active_key_id="2025-02",
    )
    assert ring.keys == {"2025-01": k1, "2025-02": k2}
    assert seal(ring, b"x", AAD, entropy=os.urandom).key_id == "2025-02"


@pytest.mark.parametrize(
    ("encoded", "active", "complaint"),
    [
        ({"k1": "not base64!"}, "k1", "not valid base64"),
        ({"k1": base64.b64encode(b"short").decode()}, "k1", "must be 32 bytes"),
        ({"k1": base64.b64encode(bytes(32)).decode()}, "k2", "active key ID 'k2'"),
        ({"bad/id": base64.b64encode(bytes(32)).decode()}, "bad/id", "key ID 'bad/id'"),
    ],
    ids=["bad-base64", "wrong-length", "active-missing", "bad-key-id"],
)
def test_malformed_keyring_material_is_refused(encoded: dict[str, str], active: str, complaint: str) -> None:
    with pytest.raises(KeyringError, match=complaint):
        Keyring.from_b64(encoded, active_key_id=active)


def test_keyring_never_prints_key_material_and_is_read_only() -> None:
    source = {"k1": b"\x07" * 32}
    ring = Keyring(keys=source, active_key_id="k1")
    assert "\\x07" not in repr(ring)
    source["k2"] = b"\x08" * 32
    assert set(ring.keys) == {"k1"}
    with pytest.raises(TypeError):
        ring.keys["k3"] = b"\x09" * 32  # type: ignore[index]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("nonce", base64.b64encode(bytes(8)).decode()),
        ("nonce", "***"),
        ("ciphertext", base64.b64encode(bytes(4)).decode()),
        ("key_id", "no spaces"),
    ],
)
def test_malformed_sealed_field_is_a_validation_error(field: str, value: str) -> None:
    valid = seal(_ring("k1"), b"secret", AAD, entropy=os.urandom).model_dump()
    with pytest.raises(ValidationError):
        SealedField.model_validate({**valid, field: value})


def test_sealing_aad_is_unambiguous() -> None:
    assert sealing_aad("a", "bc") != sealing_aad("ab", "c")
    with pytest.raises(ValueError, match="NUL"):
        sealing_aad("run\x00uid", "field")
    with pytest.raises(ValueError, match="non-empty"):
        sealing_aad("", "field")
