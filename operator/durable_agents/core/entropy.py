"""Randomness handed in: the core draws no random bytes of its own.

Every nonce, key and ephemeral key the core makes (sealing, sealed values, disclosure) comes from
an :data:`Entropy` its caller passes. The shell passes :func:`os.urandom`; a test passes a seeded
source, so that what is sealed is the same bytes on every call.
"""

from __future__ import annotations

from collections.abc import Callable

Entropy = Callable[[int], bytes]
"""A source of random bytes: ``entropy(n)`` answers ``n`` of them (the shape of ``os.urandom``)."""


def draw(entropy: Entropy, size: int) -> bytes:
    """``size`` bytes from ``entropy``; :class:`ValueError` when the source answers another number
    (a broken source must never shorten a nonce or a key)."""
    raw = entropy(size)
    if not isinstance(raw, bytes) or len(raw) != size:
        got = f"{len(raw)} bytes" if isinstance(raw, bytes) else type(raw).__name__
        raise ValueError(f"the entropy source answered {got} when asked for {size} bytes")
    return raw
