"""Sealed values in AgentRuns and ActionRecords: what a viewer of the API (or of etcd) never reads.

Each run tree (a run and its children) has one random data key. The data key is stored wrapped
(AES-GCM) under the keyring's active key in the run's annotation :data:`DATA_KEY_ANNOTATION`,
bound to the run's namespace and name, so the annotation copied to another run never opens.
Sensitive values are sealed with the data key (AES-GCM), each bound to its field label:

- ``steps/<step>/question`` and ``steps/<step>/arguments`` (the scripted questions and effect
  arguments, also inside a child step's steps),
- ``answers/<request>`` and ``events/<name>`` (what people and systems deliver to a live run),
- ``actions/<record>/outcome`` (an effect's response, in its ActionRecord's status).

A sealed string is ``sealed:v1:<base64 nonce+ciphertext>``; a sealed object is
``{"durable-agents.io/sealed": "<sealed string>"}``. The plaintext of both is the RFC 8785
canonical JSON of the value. The operator copies sealed values as they are (the pending question,
the approval request's arguments, the ActionRecord's arguments): approval digests and intent
digests cover the sealed form, which authenticates exactly one plaintext under the run's data
key. Only the dispatcher (to call the effect) and the reveal path (for an approver) unseal.

Key rotation rewraps the data key under the new active key: one annotation write per run,
whatever the number of values. Pure: no I/O, no Kubernetes import.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from durable_agents.core.digest import canonical_json
from durable_agents.core.entropy import Entropy, draw
from durable_agents.core.sealing import (
    KEY_BYTES,
    NONCE_BYTES,
    Keyring,
    SealingError,
    UndecryptableError,
    sealing_aad,
)

DATA_KEY_ANNOTATION: Final = "durable-agents.io/data-key"
SEALED_KEY: Final = "durable-agents.io/sealed"
TOKEN_PREFIX: Final = "sealed:v1:"
PLAINTEXT_LIMIT: Final = 4096
"""The longest sealable string, in characters (its sealed form is longer: see SEALED_STRING_MAX)."""

_VALUE_AAD: Final = b"durable-agents.io/sealed-value/v1\x00"
_DATA_KEY_FIELD: Final = "data-key"


class ValueSealingError(SealingError):
    """A value cannot be sealed as given (too long), or a sealed value is not this run's."""


@dataclass(frozen=True)
class DataKey:
    """A run tree's data key (never printed)."""

    key: bytes = field(repr=False)


# --- the data key ------------------------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def _scope(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def new_data_key(*, entropy: Entropy) -> DataKey:
    """A fresh random data key for a run tree, from ``entropy``."""
    return DataKey(draw(entropy, KEY_BYTES))


def wrap_data_key(keyring: Keyring, data_key: DataKey, namespace: str, name: str, *, entropy: Entropy) -> str:
    """The annotation value: ``<key ID>:<base64 nonce+wrapped key>``, under the active key."""
    nonce = draw(entropy, NONCE_BYTES)
    aad = sealing_aad(_scope(namespace, name), _DATA_KEY_FIELD)
    wrapped = AESGCM(keyring.keys[keyring.active_key_id]).encrypt(nonce, data_key.key, aad)
    return f"{keyring.active_key_id}:{_b64(nonce + wrapped)}"


def data_key_id(annotation: str | None) -> str | None:
    """The keyring key ID an annotation value is wrapped with (None when there is none)."""
    if not annotation or ":" not in annotation:
        return None
    return annotation.split(":", 1)[0]


def open_data_key(keyring: Keyring, annotation: str | None, namespace: str, name: str) -> DataKey:
    """The run's data key; :class:`UndecryptableError` when the annotation is absent, its key is
    not in the keyring, or it was wrapped for another run (or tampered with)."""
    key_id = data_key_id(annotation) or ""
    if annotation is None or not key_id:
        raise UndecryptableError(key_id, f"the run has no {DATA_KEY_ANNOTATION} annotation")
    wrapping = keyring.keys.get(key_id)
    if wrapping is None:
        raise UndecryptableError(
            key_id, f"the run's data key is wrapped with key {key_id!r}, not in the keyring"
        )
    try:
        raw = _unb64(annotation.split(":", 1)[1])
        aad = sealing_aad(_scope(namespace, name), _DATA_KEY_FIELD)
        key = AESGCM(wrapping).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad)
    except (InvalidTag, binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise UndecryptableError(
            key_id,
            f"the run's data key does not open with key {key_id!r} (made for another run, or tampered)",
        ) from exc
    if len(key) != KEY_BYTES:
        raise UndecryptableError(key_id, "the run's data key has the wrong length")
    return DataKey(key)


def rewrap(keyring: Keyring, annotation: str, namespace: str, name: str, *, entropy: Entropy) -> str | None:
    """The annotation rewrapped under the active key, or None when it already is."""
    if data_key_id(annotation) == keyring.active_key_id:
        return None
    data_key = open_data_key(keyring, annotation, namespace, name)
    return wrap_data_key(keyring, data_key, namespace, name, entropy=entropy)


# --- values ------------------------------------------------------------------------------------


def is_sealed(value: Any) -> bool:
    if isinstance(value, str):
        return value.startswith(TOKEN_PREFIX)
    return isinstance(value, Mapping) and set(value) == {SEALED_KEY} and isinstance(value[SEALED_KEY], str)


def _aad(label: str) -> bytes:
    if not label or "\x00" in label:
        raise ValueError("a field label must be non-empty and free of NUL characters")
    return _VALUE_AAD + label.encode()


def seal_value(data_key: DataKey, value: Any, label: str, *, entropy: Entropy) -> Any:
    """``value`` sealed for field ``label``: a sealed string for a string, else a sealed object
    (the nonce drawn from ``entropy``)."""
    if isinstance(value, str) and len(value) > PLAINTEXT_LIMIT:
        raise ValueSealingError(f"{label}: at most {PLAINTEXT_LIMIT} characters, got {len(value)}")
    nonce = draw(entropy, NONCE_BYTES)
    token = TOKEN_PREFIX + _b64(
        nonce + AESGCM(data_key.key).encrypt(nonce, canonical_json(value), _aad(label))
    )
    return token if isinstance(value, str) else {SEALED_KEY: token}


def unseal_value(data_key: DataKey, value: Any, label: str) -> Any:
    """The plaintext of a sealed ``value`` (a value that is not sealed is returned as it is);
    :class:`ValueSealingError` when it was not sealed for this run tree and field."""
    if not is_sealed(value):
        return value
    token = value if isinstance(value, str) else value[SEALED_KEY]
    try:
        raw = _unb64(token[len(TOKEN_PREFIX) :])
        plain = AESGCM(data_key.key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(label))
        return json.loads(plain)
    except (InvalidTag, binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise ValueSealingError(f"{label}: a sealed value that is not this run's for this field") from exc


# --- where sealed values live in an AgentRun's spec ----------------------------------------------

# (dict holding the value, key in it, field label)
Slot = tuple[dict[str, Any], str, str]


def _step_slots(steps: Any) -> Iterator[Slot]:
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict) or not isinstance(step.get("name"), str):
            continue
        name = step["name"]
        ask, effect, child = step.get("ask"), step.get("effect"), step.get("child")
        if isinstance(ask, dict) and "question" in ask:
            yield ask, "question", f"steps/{name}/question"
        if isinstance(effect, dict) and effect.get("arguments"):
            yield effect, "arguments", f"steps/{name}/arguments"
        if isinstance(child, dict):
            yield from _step_slots(child.get("steps"))


def spec_slots(spec: dict[str, Any]) -> Iterator[Slot]:
    """Every sealable value in an AgentRun spec (a wire dict): questions, effect arguments,
    answers and events."""
    yield from _step_slots(spec.get("steps"))
    for field_name in ("answers", "events"):
        entries = spec.get(field_name)
        if isinstance(entries, dict):
            for key in list(entries):
                yield entries, key, f"{field_name}/{key}"


def _old_values(spec: dict[str, Any] | None) -> dict[str, Any]:
    return {label: holder[key] for holder, key, label in spec_slots(spec)} if spec else {}


def seal_spec(
    spec: Mapping[str, Any],
    data_key: DataKey,
    old_spec: Mapping[str, Any] | None = None,
    *,
    entropy: Entropy,
) -> dict[str, Any]:
    """A copy of ``spec`` with every sealable value sealed.

    A value exactly as the old spec stores it is left as it is, sealed or not (one written with
    the webhook off: the engine refuses it, and it must not block later requests); a plaintext
    value equal to what the old spec sealed in the same field keeps the old sealed form (a
    re-applied manifest is no change); a new value already sealed must be this run tree's for
    that field, or :class:`ValueSealingError` says which is not.
    """
    out: dict[str, Any] = json.loads(json.dumps(dict(spec)))
    old = _old_values(json.loads(json.dumps(dict(old_spec))) if old_spec is not None else None)
    for holder, key, label in spec_slots(out):
        value = holder[key]
        if label in old and old[label] == value:
            # Stored already, not this request's: left exactly as it is (sealing or refusing it
            # would change or block an append-only entry; the engine judges it by its seal).
            continue
        if is_sealed(value):
            unseal_value(data_key, value, label)  # refuses another run's or field's value
            continue
        previous = old.get(label)
        if previous is not None and is_sealed(previous):
            try:
                if unseal_value(data_key, previous, label) == value:
                    holder[key] = previous
                    continue
            except ValueSealingError:
                pass
        holder[key] = seal_value(data_key, value, label, entropy=entropy)
    return out


def reveal_spec(spec: Mapping[str, Any], data_key: DataKey) -> dict[str, Any]:
    """Field label -> plaintext, for every sealed value of ``spec``."""
    copy = json.loads(json.dumps(dict(spec)))
    return {label: unseal_value(data_key, holder[key], label) for holder, key, label in spec_slots(copy)}


def outcome_label(record_name: str) -> str:
    return f"actions/{record_name}/outcome"


def step_label(step_name: str, what: str) -> str:
    return f"steps/{step_name}/{what}"


def keyed_digest(data_key: DataKey, label: str, value: Any) -> str:
    """HMAC-SHA256 of ``value`` under the run tree's data key: two reads of one value compare
    equal, and the digest says nothing about a value nobody holding the key can test."""
    mac = hmac.HMAC(data_key.key, hashes.SHA256())
    mac.update(_aad(label) + b"\x00" + canonical_json(value))
    return "hmac-sha256:" + mac.finalize().hex()


def fingerprint(data_key: DataKey) -> str:
    """What identifies a data key without revealing it (an HMAC under the key itself)."""
    return keyed_digest(data_key, "data-key/fingerprint", "")
