"""Which region advances a run, and the region epoch each of its commits carries.

A run is advanced only by the deployment of the region that owns it: its home region, or the one
a stamped failover moved it to. Every commit records the region Lease's epoch as last seen (the
fencing token one level above the shard's): a region whose leader is not live stalls, it does not
commit under an epoch nobody holds.
"""

from __future__ import annotations

from typing import Any

from durable_agents.core.engine import RunSnapshot
from durable_agents.core.regions import owning_region, with_region_epoch
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ownership.shards import ShardLeases


class RegionEpochs:
    def __init__(self, shard_leases: ShardLeases, region: str, keyring: Keyring | None) -> None:
        self.shard_leases = shard_leases  # its last poll's view of the region Lease
        self.region = region
        self.keyring = keyring  # verifies a failover's adoption stamp

    def owner(self, run: RunSnapshot) -> str:
        """The region that owns the run: its home region, or the one a stamped failover moved it to."""
        raw = run.status.ownership.wire() if run.status.ownership is not None else None
        return owning_region(run.spec.region, raw, run.status.run_id or run.uid, self.keyring)

    def live_epoch(self) -> int | None:
        """The region epoch a commit is made under; None when the region has no live leader as
        last seen."""
        view = self.shard_leases.region_view
        return view.epoch if view is not None and view.live else None

    def stamped(self, status: dict[str, Any]) -> dict[str, Any] | None:
        """``status`` carrying the live region epoch; None when there is none (not committed)."""
        epoch = self.live_epoch()
        if epoch is None:
            return None
        return {**status, "ownership": with_region_epoch(status.get("ownership"), self.region, epoch)}
