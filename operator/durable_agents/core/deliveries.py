"""Answers and events (``spec.answers``, ``spec.events``): which ones the engine may act on.

An answer or an event carries no stamp of its own: its seal is its proof. The admission webhook
seals every answer and event it admits (after a SubjectAccessReview for verb ``answer`` on the
run) with the run's data key, bound to its field label ``answers/<key>`` or ``events/<key>``
(:mod:`durable_agents.core.sealed_values`). AES-GCM is authenticated: nobody without the
operator's keyring can make a value that opens under the run's data key and that label. So, on a
run that has a data key, a value that is not sealed, or does not open under its own label (copied
from another key or run, or tampered with), was not written through the webhook: the engine does
not act on it. It refuses it once (``status.refusedRequests``) and, since the key is taken for
good (the maps are append-only), waits under a new key (:func:`next_key`), so the real answer
can still be given.

A run without a data key was created before sealing existed (or by an operator without it): its
answers and events are believed as written (legacy). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final, Literal

from durable_agents.core.authority import Unproven
from durable_agents.core.sealed_values import DataKey, ValueSealingError, is_sealed, unseal_value

DeliveryField = Literal["answers", "events"]

UNSEALED: Final = "Unsealed"
SEAL_INVALID: Final = "SealInvalid"
KEY_MAX: Final = 63
"""The longest key asked under: an event name's limit (and a step name's)."""


def delivery_label(field: DeliveryField, key: str) -> str:
    """The label the webhook seals ``spec.<field>[<key>]`` under."""
    return f"{field}/{key}"


def delivery_unproven(
    data_key: DataKey | None, field: DeliveryField, key: str, value: str
) -> Unproven | None:
    """Why ``spec.<field>[<key>]`` cannot be acted on, or None.

    ``data_key``: the run's (None: a run without one, whose values are believed as written).
    """
    if data_key is None:
        return None
    what = "answer" if field == "answers" else "event"
    if not is_sealed(value):
        return Unproven(
            UNSEALED,
            f"the {what} is not sealed: the operator's admission webhook seals every {what} it "
            "admits on this run, so this one was written without it (the webhook off?); not acted on",
        )
    try:
        unseal_value(data_key, value, delivery_label(field, key))
    except ValueSealingError:
        return Unproven(
            SEAL_INVALID,
            f"the {what} does not open under this run's data key for {delivery_label(field, key)}: "
            "copied from another key or run, or tampered with; not acted on",
        )
    return None


def base_key(key: str) -> str:
    """The key a question or event was first asked under (``confirm`` for ``confirm.3``)."""
    head, _, tail = key.rpartition(".")
    return head if head and tail.isdigit() and int(tail) >= 2 else key


def next_key(key: str, taken: Collection[str]) -> str:
    """The key to ask again under once ``key``'s value was refused: ``<base>.2``, ``.3``, ... (the
    first not in ``taken``), within the request-ID pattern and :data:`KEY_MAX` characters."""
    base, n = base_key(key), 2
    while True:
        suffix = f".{n}"
        head = base[: KEY_MAX - len(suffix)].rstrip("-.")
        candidate = f"{head}{suffix}"
        if candidate not in taken and candidate != key:
            return candidate
        n += 1
