"""Region ownership, the pure part: what a region name may be, and which owner fences which.

Each AgentRun has a home region; one process at a time owns a region (a leader-election Lease,
:mod:`durable_agents.shell.ownership.regions`). The region epoch (the Lease's ``leaseTransitions``) grows
with every new hold, so an owner that was paused or partitioned carries a lower epoch than the
current one and is fenced out of commits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from durable_agents.api.v1alpha1 import NAME_PATTERN
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp, verify

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


# --- which region owns a run -----------------------------------------------------------------


def adoption_payload(run_id: str, region: str, adopted_from: str, failover: str) -> dict[str, Any]:
    """What an adoption's stamp covers: the run (its stable run ID), the region that adopted it,
    the region it came from and the failover that moved it (never the epoch, which each commit
    of the owning region moves on)."""
    return {
        "kind": "RegionOwnership",
        "runId": run_id,
        "region": region,
        "adoptedFrom": adopted_from,
        "failover": failover,
    }


def stamp_adoption(keyring: Keyring, run_id: str, region: str, adopted_from: str, failover: str) -> str:
    return stamp(keyring, Purpose.CONTROL, adoption_payload(run_id, region, adopted_from, failover))


def owning_region(
    home: str | None, ownership: Mapping[str, Any] | None, run_id: str, keyring: Keyring | None
) -> str:
    """The region that owns a run now: the one that adopted it by a failover, when the adoption's
    stamp verifies; else its home region. Every deployment computes the same answer from the same
    record, so a run is never owned by two regions (nor by none)."""
    home_region = home or DEFAULT_REGION
    if not ownership or not ownership.get("adoptedFrom"):
        return home_region
    region, failover = ownership.get("region"), ownership.get("failover")
    if not isinstance(region, str) or not isinstance(failover, str):
        return home_region
    payload = adoption_payload(run_id, region, str(ownership["adoptedFrom"]), failover)
    return region if verify(keyring, Purpose.CONTROL, payload, ownership.get("stamp")) else home_region


def with_region_epoch(ownership: Mapping[str, Any] | None, region: str, epoch: int) -> dict[str, Any]:
    """The ownership a commit of ``region`` at region epoch ``epoch`` records: an adoption's
    stamped fields are kept as they are (the run stays adopted). Per run, the recorded epoch only
    grows (``max`` with the one recorded): a region Lease that starts again at 0 (a restore into a
    fresh cluster) strands no run. What keeps a paused former holder in the region from committing
    is its shard Lease and the compare-and-swap; what keeps another region out is the owner."""
    kept = dict(ownership) if ownership and ownership.get("region") == region else {}
    recorded = kept.get("regionEpoch")
    floor = recorded if isinstance(recorded, int) else 0
    return {**kept, "region": region, "regionEpoch": max(epoch, floor)}


def owning_region_of(run: Mapping[str, Any], keyring: Keyring | None) -> str:
    """:func:`owning_region` of a run as stored (its spec, status and metadata)."""
    spec, status = run.get("spec") or {}, run.get("status") or {}
    run_id = status.get("runId") or (run.get("metadata") or {}).get("uid") or ""
    return owning_region(spec.get("region"), status.get("ownership"), run_id, keyring)
