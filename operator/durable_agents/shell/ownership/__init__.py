"""The ownership room.

Which process may advance which run: the one Lease primitive every Lease here is kept with, and
the per-run Leases of an earlier release (leases), a region's shard Leases (shards), region leader
election (regions) and the right to advance a run under an epoch (rights).
"""
