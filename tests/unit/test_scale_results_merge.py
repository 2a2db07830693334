"""bench/scale.py --merge: a part not measured now is kept from the earlier results, marked with
when and where it was measured; a part measured now replaces the earlier one."""

from __future__ import annotations

from bench.scale import merged

EARLIER = {
    "date": "2026-12-04T22:42:47+00:00",
    "commit": "bc86787",
    "parked": {"runs": 20000, "cold_start_seconds": 11.7},
    "finished": {"runs": 1000, "etcd_bytes_per_finished_run": 7551},
}


def test_the_part_not_measured_is_kept_with_its_date_and_commit() -> None:
    now = {"date": "2026-12-05T09:00:00+00:00", "commit": "abc1234", "parked": {"runs": 100000}}
    out = merged(now, EARLIER)
    assert out["parked"] == {"runs": 100000}, "the part measured now replaces the earlier one"
    assert out["finished"]["etcd_bytes_per_finished_run"] == 7551
    assert out["finished"]["measured_in"] == {"date": EARLIER["date"], "commit": "bc86787"}
    assert out["commit"] == "abc1234"
    assert "measured_in" not in out["parked"]


def test_a_part_merged_twice_keeps_where_it_was_first_measured() -> None:
    once = merged({"date": "d2", "commit": "c2", "parked": {"runs": 1}}, EARLIER)
    twice = merged({"date": "d3", "commit": "c3", "parked": {"runs": 2}}, once)
    assert twice["finished"]["measured_in"] == {"date": EARLIER["date"], "commit": "bc86787"}


def test_nothing_earlier_adds_nothing() -> None:
    now = {"date": "d", "parked": {"runs": 1}}
    assert merged(now, {}) == now
