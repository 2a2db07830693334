"""Disclosure to one reader: a document encrypted to a public key the reader made for one request.

``kubectl agentrun status --reveal`` makes an ephemeral X25519 key pair and sends the public half
in a server-side dry-run patch; the operator's admission webhook answers with the run's sealed
values, encrypted to it (ECIES: an ephemeral X25519 key of its own, HKDF-SHA256 over the shared
secret and both public keys, AES-256-GCM with the binding as associated data). Only the holder of
the private key reads the answer; the API server's audit log, which records the dry-run response,
holds ciphertext only. The binding (the run's ``namespace/name``) stops an answer for one run
from being shown as another's.

The sealed form is ``<base64 ephemeral public key>.<base64 nonce+ciphertext>``; its plaintext is
the RFC 8785 canonical JSON of the document. Pure: no I/O, no Kubernetes import.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from durable_agents.core.digest import canonical_json
from durable_agents.core.entropy import Entropy, draw

PUBLIC_KEY_BYTES: Final = 32
PRIVATE_KEY_BYTES: Final = 32
NONCE_BYTES: Final = 12
_INFO: Final = b"durable-agents.io/disclosure/v1\x00"
_AAD: Final = b"durable-agents.io/disclosure/v1/binding\x00"


class DisclosureError(Exception):
    """A reader key or a disclosed value is malformed, or it does not open for this reader and
    binding (another reader's, another run's, or tampered with)."""


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise DisclosureError(f"{what} is not valid base64") from exc


def _raw(public: X25519PublicKey) -> bytes:
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _key(shared: bytes, ephemeral_public: bytes, reader_public: bytes) -> bytes:
    # Both public keys in the derivation: the key belongs to this exchange and no other.
    hkdf = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO + ephemeral_public + reader_public
    )
    return hkdf.derive(shared)


def _aad(binding: str) -> bytes:
    if not binding or "\x00" in binding:
        raise DisclosureError("a binding must be non-empty and free of NUL characters")
    return _AAD + binding.encode()


def reader_public_key(public_b64: str) -> X25519PublicKey:
    """The reader's public key from its base64 raw form; :class:`DisclosureError` if malformed."""
    raw = _unb64(public_b64, "the reader's public key")
    if len(raw) != PUBLIC_KEY_BYTES:
        raise DisclosureError(f"the reader's public key must be {PUBLIC_KEY_BYTES} bytes, got {len(raw)}")
    return X25519PublicKey.from_public_bytes(raw)


def _private_key(entropy: Entropy) -> X25519PrivateKey:
    # Any 32 bytes are an X25519 private key (the scalar is clamped when used).
    return X25519PrivateKey.from_private_bytes(draw(entropy, PRIVATE_KEY_BYTES))


def new_reader_key(*, entropy: Entropy) -> tuple[X25519PrivateKey, str]:
    """A fresh reader key pair, from ``entropy``: the private key (kept by the reader), the public
    key in base64."""
    private = _private_key(entropy)
    return private, _b64(_raw(private.public_key()))


def seal_for_reader(public_b64: str, document: Mapping[str, Any], binding: str, *, entropy: Entropy) -> str:
    """``document`` encrypted so that only the holder of ``public_b64``'s private key reads it
    (its ephemeral key and nonce drawn from ``entropy``)."""
    reader = reader_public_key(public_b64)
    ephemeral = _private_key(entropy)
    ephemeral_raw = _raw(ephemeral.public_key())
    try:
        shared = ephemeral.exchange(reader)
    except ValueError as exc:  # a low-order point: no secret to share
        raise DisclosureError("the reader's public key is not usable") from exc
    key = _key(shared, ephemeral_raw, _raw(reader))
    nonce = draw(entropy, NONCE_BYTES)
    sealed = AESGCM(key).encrypt(nonce, canonical_json(dict(document)), _aad(binding))
    return f"{_b64(ephemeral_raw)}.{_b64(nonce + sealed)}"


def open_as_reader(private: X25519PrivateKey, value: str, binding: str) -> dict[str, Any]:
    """The document ``value`` discloses to ``private``'s holder for ``binding``."""
    ephemeral_b64, sep, sealed_b64 = value.partition(".")
    if not sep:
        raise DisclosureError("a disclosed value is '<ephemeral public key>.<ciphertext>'")
    ephemeral = reader_public_key(ephemeral_b64)
    raw = _unb64(sealed_b64, "the disclosed ciphertext")
    if len(raw) <= NONCE_BYTES:
        raise DisclosureError("the disclosed ciphertext is too short")
    try:
        shared = private.exchange(ephemeral)
        key = _key(shared, _raw(ephemeral), _raw(private.public_key()))
        plain = AESGCM(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(binding))
    except (InvalidTag, ValueError) as exc:
        raise DisclosureError(
            "the disclosed value does not open with this key for this run (another reader's, "
            "another run's, or tampered with)"
        ) from exc
    document = json.loads(plain)
    if not isinstance(document, dict):
        raise DisclosureError("the disclosed document is not an object")
    return document
