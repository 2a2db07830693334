"""The admission webhook seals what people write into an AgentRun before the API server stores it.

On create, the run gets its data key (a new one, or the one the operator gave a child run) in the
``durable-agents.io/data-key`` annotation, and every question and effect argument of its steps is
sealed; on update, every new answer and event. A value re-sent as plaintext that equals what is
already sealed in that field keeps its sealed form, so re-applying a manifest changes nothing
(and immutable steps stay equal). ``kubectl apply``'s ``last-applied-configuration`` annotation
would keep a plaintext copy: its sealable values are replaced by the sealed ones.

The data-key annotation is the operator's: a change that does not open to the same data key (only
the operator's rewrap under a new active key does) is put back as it was. The rules are pure over
the admission request's objects; :func:`sealing_changes` raises :class:`SealingRefused` with the
message the API server returns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from durable_agents.core.entropy import Entropy
from durable_agents.core.sealed_values import (
    DATA_KEY_ANNOTATION,
    DataKey,
    ValueSealingError,
    is_sealed,
    new_data_key,
    open_data_key,
    seal_spec,
    spec_slots,
    wrap_data_key,
)
from durable_agents.core.sealing import Keyring, UndecryptableError

LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"
SEALED_SPEC_FIELDS: Final = ("steps", "answers", "events")


class SealingRefused(Exception):
    """The request cannot be admitted as it is; the message says why."""


@dataclass
class SealingChanges:
    """What the mutating webhook changes: spec fields and annotations (None: remove)."""

    spec: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, str | None] = field(default_factory=dict)


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annotation(obj: Mapping[str, Any] | None, key: str) -> str | None:
    annotations = _meta(obj).get("annotations")
    value = annotations.get(key) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) else None


def _opens(keyring: Keyring, annotation: str | None, namespace: str, name: str) -> DataKey | None:
    try:
        return open_data_key(keyring, annotation, namespace, name)
    except UndecryptableError:
        return None


def _data_key(
    operation: str, new: Mapping[str, Any], old: Mapping[str, Any] | None, keyring: Keyring, entropy: Entropy
) -> tuple[DataKey, str | None]:
    """The run's data key, and the annotation value to store (None: leave the annotation as is)."""
    namespace, name = str(_meta(new).get("namespace") or ""), str(_meta(new).get("name") or "")
    if not name:
        raise SealingRefused(
            "metadata.name: name the run: its data key is bound to its name (generateName is not supported)"
        )
    given = _annotation(new, DATA_KEY_ANNOTATION)
    if operation == "CREATE":
        opened = _opens(keyring, given, namespace, name)
        if opened is not None:  # a child run: the operator wrapped its parent's data key for it
            return opened, None
        key = new_data_key(entropy=entropy)
        return key, wrap_data_key(keyring, key, namespace, name, entropy=entropy)
    stored = _annotation(old, DATA_KEY_ANNOTATION)
    if stored is None:  # a run created before sealing: it gets its data key now
        key = new_data_key(entropy=entropy)
        return key, wrap_data_key(keyring, key, namespace, name, entropy=entropy)
    key_now = _opens(keyring, stored, namespace, name)
    if key_now is None:
        raise SealingRefused(
            f"the run's data key cannot be opened with this operator's keyring (annotation "
            f"{DATA_KEY_ANNOTATION}): nothing new can be sealed for it; restore the sealing key"
        )
    if given == stored:
        return key_now, None
    rewrapped = _opens(keyring, given, namespace, name)
    if rewrapped is not None and rewrapped.key == key_now.key:
        return key_now, None  # the operator's rewrap under the active key
    return key_now, stored  # anyone else's change is put back


def _data_key_lost(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """True for a run that had a data key (its checkpoint holds the key's fingerprint) and whose
    annotation is gone (removed with the webhook off): a new key would not be the run's, so
    nothing new is sealed, and a request that brings a value to seal is refused (one that does not,
    a cancellation, passes). :class:`SealingRefused` says how to repair it."""
    checkpoint = ((old or {}).get("status") or {}).get("checkpoint")
    had = isinstance(checkpoint, Mapping) and checkpoint.get("dataKeyDigest") is not None
    if not had or _annotation(old, DATA_KEY_ANNOTATION) is not None:
        return False
    before = {label: holder[key] for holder, key, label in spec_slots(json.loads(json.dumps(_spec_of(old))))}
    for holder, key, label in spec_slots(json.loads(json.dumps(_spec_of(new)))):
        if before.get(label) != holder[key]:
            raise SealingRefused(
                f"spec: {label}: the run's {DATA_KEY_ANNOTATION} annotation is gone (removed by "
                "someone other than the operator): nothing can be sealed for it until the annotation "
                "is restored (its value is in the API server's audit log, or a backup)"
            )
    return True


def _spec_of(obj: Mapping[str, Any] | None) -> dict[str, Any]:
    spec = (obj or {}).get("spec")
    return dict(spec) if isinstance(spec, Mapping) else {}


def _sealed_last_applied(text: str, sealed_spec: dict[str, Any]) -> str | None:
    """``last-applied-configuration`` with its sealable values replaced by the sealed ones."""
    try:
        document = json.loads(text)
    except ValueError:
        return None
    spec = document.get("spec") if isinstance(document, dict) else None
    if not isinstance(spec, dict):
        return None
    sealed = {label: holder[key] for holder, key, label in spec_slots(sealed_spec)}
    changed = False
    for holder, key, label in spec_slots(spec):
        if not is_sealed(holder[key]):
            # A value the spec no longer has (or that failed) is dropped rather than kept in clear.
            holder[key] = sealed.get(label, "(sealed)")
            changed = True
    return json.dumps(document, separators=(",", ":")) if changed else None


def sealing_changes(
    operation: str,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    keyring: Keyring,
    *,
    entropy: Entropy,
) -> SealingChanges:
    """What to change in ``new`` so that nothing sensitive is stored in clear (a new data key and
    every nonce drawn from ``entropy``)."""
    changes = SealingChanges()
    if operation not in ("CREATE", "UPDATE"):
        return changes
    if operation == "UPDATE" and _data_key_lost(new, old):
        return changes
    data_key, annotation = _data_key(operation, new, old, keyring, entropy)
    if annotation is not None:
        changes.annotations[DATA_KEY_ANNOTATION] = annotation
    spec = (new.get("spec") if isinstance(new.get("spec"), Mapping) else None) or {}
    old_spec = (old or {}).get("spec") if isinstance((old or {}).get("spec"), Mapping) else None
    try:
        sealed = seal_spec(spec, data_key, old_spec, entropy=entropy)
    except ValueSealingError as err:
        raise SealingRefused(f"spec: {err}") from err
    changes.spec = {f: sealed[f] for f in SEALED_SPEC_FIELDS if f in sealed and sealed[f] != spec.get(f)}
    if (
        operation == "UPDATE"
        and "steps" in changes.spec
        and changes.spec["steps"] != (old_spec or {}).get("steps")
    ):
        # Steps are immutable: an update only maps re-sent plaintext back to what is stored (steps
        # of a run created before sealing stay as they were; a real change is refused by the schema).
        del changes.spec["steps"]
    last_applied = _annotation(new, LAST_APPLIED)
    if last_applied is not None:
        rewritten = _sealed_last_applied(last_applied, sealed)
        if rewritten is not None:
            changes.annotations[LAST_APPLIED] = rewritten
    return changes
