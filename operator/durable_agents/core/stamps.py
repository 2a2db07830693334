"""Stamps: message authentication codes only the operator can make and check.

A stamp proves that the operator itself (its admission webhook, or its worker at commit time)
wrote a set of fields: an approval decision with its approver, a cancellation request, a
checkpoint's decisive fields. Anyone who can write the object through the API (a user with
``patch`` while the webhook is off, a user with ``agentruns/status``) can copy a field, but cannot
make its stamp: the key never leaves the operator.

Keys: one HMAC-SHA256 key per sealing key and purpose, derived with HKDF from the sealing keyring
(so stamps rotate with it, and a purpose's stamp is never valid for another purpose). A stamp is
``<key ID>:<base64 MAC>`` over the RFC 8785 canonical JSON of the stamped fields. Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from durable_agents.core.digest import canonical_json
from durable_agents.core.sealing import Keyring

_INFO_PREFIX = b"durable-agents.io/stamp/v1/"


class Purpose(StrEnum):
    """What a stamp vouches for; a stamp made for one purpose never verifies for another."""

    DECISION = "decision"  # an approval decision: request, digest, decision, approver, time
    CONTROL = "control"  # a cancellation, a quarantine retry, a reconcile: who asked, when
    SERVICE_ACCOUNT = "service-account"  # the run's creator may act as its ServiceAccount
    CHECKPOINT = "checkpoint"  # the fields that decide what a run does next
    CHILD = "child"  # a child run created by the operator for its parent's step
    POSITION = "position"  # a run's state, state version and outcome, as the operator committed them
    OUTCOME = "outcome"  # an ActionRecord's status: state, attempts, claim, outcome, as the operator wrote it
    NOTIFIED = "notified"  # a run's record of the notifications done (core/notifications.py)


def _key(keyring: Keyring, key_id: str, purpose: Purpose) -> bytes:
    return _derived(keyring.keys[key_id], purpose)


@functools.lru_cache(maxsize=256)
def _derived(secret: bytes, purpose: Purpose) -> bytes:
    # Pure and deterministic: derived once per (key, purpose), not for every stamp and check.
    derive = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO_PREFIX + purpose.encode())
    return derive.derive(secret)


def _mac(key: bytes, payload: Mapping[str, Any]) -> bytes:
    mac = hmac.HMAC(key, hashes.SHA256())
    mac.update(canonical_json(dict(payload)))
    return mac.finalize()


def stamp(keyring: Keyring, purpose: Purpose, payload: Mapping[str, Any]) -> str:
    """The active key's stamp over ``payload``."""
    key_id = keyring.active_key_id
    tag = _mac(_key(keyring, key_id, purpose), payload)
    return f"{key_id}:{base64.b64encode(tag).decode('ascii')}"


def verify(keyring: Keyring | None, purpose: Purpose, payload: Mapping[str, Any], value: str | None) -> bool:
    """True only if ``value`` is this keyring's stamp over exactly ``payload`` for ``purpose``."""
    if keyring is None or not value:
        return False
    key_id, _, encoded = value.partition(":")
    if key_id not in keyring.keys:
        return False
    try:
        tag = base64.b64decode(encoded.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return False
    mac = hmac.HMAC(_key(keyring, key_id, purpose), hashes.SHA256())
    mac.update(canonical_json(dict(payload)))
    try:
        mac.verify(tag)
    except InvalidSignature:
        return False
    return True


def stamp_key_id(value: str | None) -> str | None:
    """The key ID a stamp was made with (for rotation: which stamps still need an old key)."""
    if not value or ":" not in value:
        return None
    return value.partition(":")[0]
