"""The ownership room.

Which process may advance which run: Lease objects (leases), a region's shard Leases (shards),
region leader election (regions) and the right to advance a run under an epoch (rights).
"""
