"""Region ownership, the pure part: what a region name may be, and which owner fences which.

Each AgentRun has a home region; one process at a time owns a region (a leader-election Lease,
:mod:`durable_agents.shell.regions`). The region epoch (the Lease's ``leaseTransitions``) grows
with every new hold, so an owner that was paused or partitioned carries a lower epoch than the
current one and is fenced out of commits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from durable_agents.api.v1alpha1 import NAME_PATTERN

MAX_REGION_LENGTH = 63  # a DNS label: it is also a label value and part of the Lease's name
DEFAULT_REGION = "default"
_REGION = re.compile(NAME_PATTERN)


class InvalidRegion(ValueError):
    """A region name that is not a DNS label; the message says what is expected."""


REGION_EXPECTED = (
    f"a DNS label of at most {MAX_REGION_LENGTH} characters: lower-case letters, digits and '-',"
    " starting and ending with a letter or digit"
)


def region_problem(name: str) -> str | None:
    """Why ``name`` is not a valid region name (a short clause), or None when it is one."""
    if not name:
        return "it is empty"
    if len(name) > MAX_REGION_LENGTH:
        return f"it has {len(name)} characters (at most {MAX_REGION_LENGTH})"
    if not _REGION.fullmatch(name):
        return f"it is not {REGION_EXPECTED}"
    return None


def validate_region(name: str) -> str:
    """``name`` itself when it is a valid region name; :class:`InvalidRegion` otherwise."""
    problem = region_problem(name)
    if problem is not None:
        shown = name if len(name) <= 80 else f"{name[:77]}..."
        raise InvalidRegion(f"region {shown!r}: {problem}")
    return name


def region_lease_name(region: str) -> str:
    """The name of the region's leader-election Lease (at most 85 characters: a valid name)."""
    return f"durable-agents-region-{validate_region(region)}"


@dataclass(frozen=True)
class RegionOwnership:
    """Who may advance a region's runs: the region and the epoch of its owner's hold."""

    region: str
    epoch: int

    def __post_init__(self) -> None:
        validate_region(self.region)
        if self.epoch < 0:
            raise ValueError(f"a region epoch is never negative (got {self.epoch})")

    def fences(self, other: RegionOwnership) -> bool:
        """True when ``other`` is a former owner of the same region (a lower epoch): its commits
        must be refused. Another region's ownership is never fenced by this one."""
        return other.region == self.region and other.epoch < self.epoch
