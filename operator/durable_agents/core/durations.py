"""Go-style durations ("90s", "15m", "1h30m"), as Kubernetes users write them in manifests."""

from __future__ import annotations

import re
from datetime import timedelta

_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class InvalidDuration(ValueError):
    pass


def parse_duration(text: str) -> timedelta:
    """Parse "1h30m" into a timedelta; anything else raises :class:`InvalidDuration`."""
    pos, seconds = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise InvalidDuration(f"not a duration: {text!r} (expected e.g. 90s, 15m, 1h30m)")
    return timedelta(seconds=seconds)
