"""Go-style durations ("90s", "15m", "1h30m"), as Kubernetes users write them in manifests.

Bounded: at most :data:`MAX_DURATION` (one year, as the API states) and :data:`MAX_TEXT`
characters. Anything longer, or a number too large for a float, is an :class:`InvalidDuration`
(a ``ValueError``) naming the text: never an ``OverflowError`` from ``timedelta``.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_DURATION = timedelta(days=365)
"""The longest duration anything may name (8760h): a wait, a backoff, an expiry."""
MAX_TEXT = 64


class InvalidDuration(ValueError):
    pass


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else f"{text[:37]}...")


def parse_duration(text: str) -> timedelta:
    """Parse "1h30m" into a timedelta; anything else raises :class:`InvalidDuration`."""
    if len(text) > MAX_TEXT:
        raise InvalidDuration(f"not a duration: {_shown(text)} is longer than {MAX_TEXT} characters")
    pos, seconds = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise InvalidDuration(f"not a duration: {_shown(text)} (expected e.g. 90s, 15m, 1h30m)")
    if not math.isfinite(seconds) or seconds > MAX_DURATION.total_seconds():
        raise InvalidDuration(f"duration {_shown(text)} exceeds the maximum of 8760h (one year)")
    return timedelta(seconds=seconds)
