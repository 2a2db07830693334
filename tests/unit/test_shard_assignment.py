"""Shards of a region: a run's shard is stable everywhere, and rendezvous hashing moves only the
shards a joining or leaving member must take or give up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from durable_agents.shell.ownership.shards import assignment, desired_owner, member_lease_name, shard_of

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
MEMBERS = [f"replica-{i}" for i in range(6)]


def test_a_runs_shard_is_pinned_and_independent_of_the_hash_seed() -> None:
    assert shard_of("default", "run-1", 8) == 5
    code = (
        "from durable_agents.shell.ownership.shards import shard_of; "
        "print(shard_of('team-a', 'review-42', 16))"
    )
    for seed in ("0", "1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO / "operator")},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == str(shard_of("team-a", "review-42", 16))


def test_runs_spread_over_all_shards() -> None:
    counts = [0] * 8
    for i in range(4000):
        counts[shard_of("ns", f"run-{i}", 8)] += 1
    assert min(counts) > 400, counts


def test_assignment_ignores_the_order_of_members() -> None:
    assert assignment(16, MEMBERS) == assignment(16, list(reversed(MEMBERS)))
    assert assignment(8, []) == {}
    assert desired_owner(3, []) is None


@pytest.mark.parametrize("members", [MEMBERS[:1], MEMBERS[:2], MEMBERS[:3], MEMBERS])
def test_a_joining_member_takes_only_shards_from_others_and_a_leaving_one_gives_only_its_own(
    members: list[str],
) -> None:
    shards = 64
    before = assignment(shards, members)
    after = assignment(shards, [*members, "newcomer"])
    moved = {i for i in range(shards) if before[i] != after[i]}
    assert moved == {i for i, owner in after.items() if owner == "newcomer"}
    # About shards / members moved: well inside twice the fair share on 64 shards.
    assert 0 < len(moved) < 2 * shards / (len(members) + 1)
    # Leaving is the same in reverse: only the leaver's shards move.
    assert assignment(shards, members) == before


def test_member_lease_names_are_short_and_stable() -> None:
    name = member_lease_name("eu-west", "x" * 300)
    assert name == member_lease_name("eu-west", "x" * 300)
    assert name.startswith("durable-agents-member-eu-west-")
    assert len(name) < 64
