"""bench/scale.py: the parking operator's account of its ownership, from its metrics and log (a
lapse counted from the lines the region elector and the shard Leases write when one happens)."""

from __future__ import annotations

from bench.scale import ownership_account

METRICS = """\
# TYPE durable_agents_ownership_changes_total counter
durable_agents_ownership_changes_total{kind="region"} 3.0
durable_agents_ownership_changes_total{kind="shard"} 48.0
durable_agents_shard_ownership_changes_total{reason="acquired"} 32.0
durable_agents_shard_ownership_changes_total{reason="lost"} 16.0
durable_agents_events_dropped_total 250.0
durable_agents_gc_pause_seconds_bucket{generation="0",le="1.0"} 900.0
durable_agents_gc_pause_seconds_count{generation="0"} 900.0
durable_agents_gc_pause_seconds_bucket{generation="2",le="1.0"} 10.0
durable_agents_gc_pause_seconds_count{generation="2"} 12.0
durable_agents_event_loop_stall_seconds_count 1.0
durable_agents_own_writes_skipped_total{queue="run-worker"} 29990.0
durable_agents_own_writes_skipped_total{queue="dispatcher"} 5.0
process_cpu_seconds_total 812.5
"""
LOG = """\
region default: parking no longer owns it (epoch 0): it was not renewed in time
region default: dropped 16 holds: its liveness lapsed before a write of it landed
a garbage collection (generation 2) held this process for 1.2 s: nothing else ran meanwhile
a garbage collection (generation 2) held this process for 3.4 s: nothing else ran meanwhile
bench-1/w000001 input_requested: task=... running -> waiting_input
"""


def test_a_lapse_is_counted_from_the_metrics_and_the_log() -> None:
    account = ownership_account(LOG, METRICS)
    assert account == {
        "region_changes": 3.0,
        "shard_changes": 48.0,
        "shards_lost": 16.0,
        "lapses_logged": 2,
        "events_dropped": 250.0,
        "full_collections": 12.0,
        "gc_pauses_over_1s": 2.0,
        "longest_gc_pause_logged": 3.4,
        "loop_stalls": 1.0,
        "cpu_seconds": 812.5,
        "own_writes_skipped": 29990.0,
    }


def test_an_operator_that_held_throughout_has_only_its_start_to_say() -> None:
    held = 'durable_agents_ownership_changes_total{kind="region"} 1.0\n'
    account = ownership_account("region default: parking owns it (epoch 0)\n", held)
    assert account["region_changes"] == 1.0
    assert account["lapses_logged"] == 0
    assert account["shards_lost"] == 0.0  # not exported until counted: read as none
    assert account["events_dropped"] == 0.0
    assert account["gc_pauses_over_1s"] == 0.0
    assert account["longest_gc_pause_logged"] == 0.0
    assert account["loop_stalls"] == 0.0
    assert account["own_writes_skipped"] == 0.0  # an operator from before the skip
