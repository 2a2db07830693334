"""Region ownership, the pure part: region names, the Lease name, and which owner fences which."""

from __future__ import annotations

import re
from typing import Any

import pytest
from tests.unit.builders import KEYRING, T0, apply, commit_of, new_run, step

from durable_agents.api.v1alpha1 import AgentRunSpec
from durable_agents.core.regions import (
    MAX_REGION_LENGTH,
    InvalidRegion,
    RegionOwnership,
    owning_region,
    region_lease_name,
    region_problem,
    stamp_adoption,
    validate_region,
    with_region_epoch,
)
from durable_agents.core.sealing import Keyring


@pytest.mark.parametrize("name", ["default", "eu-west-1", "a", "0", "x" * MAX_REGION_LENGTH])
def test_a_dns_label_is_a_region(name: str) -> None:
    assert region_problem(name) is None
    assert validate_region(name) == name


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "it is empty"),
        ("x" * (MAX_REGION_LENGTH + 1), "it has 64 characters (at most 63)"),
        ("EU-West", "it is not a DNS label"),
        ("eu_west", "it is not a DNS label"),
        ("-eu", "it is not a DNS label"),
        ("eu-", "it is not a DNS label"),
        ("eu.west", "it is not a DNS label"),
        ("eu\n", "it is not a DNS label"),
    ],
)
def test_anything_else_is_refused_saying_why(name: str, why: str) -> None:
    assert why in (region_problem(name) or "")
    with pytest.raises(InvalidRegion, match=f"^region {re.escape(repr(name))}: {re.escape(why)}"):
        validate_region(name)


def test_the_api_accepts_exactly_the_same_names() -> None:
    """The CRD's pattern (spec.region) and the operator's check are one rule."""
    pattern = AgentRunSpec.model_json_schema(by_alias=True)["properties"]["region"]["anyOf"][0]["pattern"]
    for name in ("default", "eu-west-1", "EU", "a_b", "-a", "x" * 64):
        assert (re.search(pattern, name) is not None and len(name) <= 63) == (region_problem(name) is None)


def test_the_lease_name_is_a_valid_object_name() -> None:
    name = region_lease_name("x" * MAX_REGION_LENGTH)
    assert name.startswith("durable-agents-region-")
    assert len(name) <= 253
    with pytest.raises(InvalidRegion):
        region_lease_name("Bad")


def test_a_later_epoch_of_the_same_region_fences_an_earlier_one() -> None:
    current = RegionOwnership("eu", 3)
    assert current.fences(RegionOwnership("eu", 2))
    assert current.fences(RegionOwnership("eu", 0))
    assert not current.fences(RegionOwnership("eu", 3)), "the owner itself is not fenced"
    assert not current.fences(RegionOwnership("eu", 4)), "a newer owner is not fenced by an older one"
    assert RegionOwnership("eu", 4).fences(current)


def test_another_regions_ownership_is_never_fenced() -> None:
    assert not RegionOwnership("eu", 9).fences(RegionOwnership("us", 1))
    assert not RegionOwnership("us", 1).fences(RegionOwnership("eu", 9))


def test_an_ownership_is_well_formed() -> None:
    with pytest.raises(ValueError, match="never negative"):
        RegionOwnership("eu", -1)
    with pytest.raises(InvalidRegion):
        RegionOwnership("Not A Label", 1)


# --- which region owns a run --------------------------------------------------------------------


OTHER = Keyring(keys={"k9": bytes(range(1, 33))}, active_key_id="k9")


def adopted(
    region: str = "west", source: str = "east", failover: str = "fo-1", run_id: str = "r1"
) -> dict[str, Any]:
    return {
        "region": region,
        "regionEpoch": 4,
        "adoptedFrom": source,
        "failover": failover,
        "stamp": stamp_adoption(KEYRING, run_id, region, source, failover),
    }


def test_a_run_is_owned_by_its_home_region_until_a_stamped_adoption() -> None:
    assert owning_region("east", None, "r1", KEYRING) == "east"
    assert owning_region(None, None, "r1", KEYRING) == "default"
    # A commit's plain record (region and epoch) moves nothing: only an adoption does.
    assert owning_region("east", {"region": "west", "regionEpoch": 9}, "r1", KEYRING) == "east"
    assert owning_region("east", adopted(), "r1", KEYRING) == "west"


@pytest.mark.parametrize(
    ("ownership", "run_id", "keyring"),
    [
        ({**adopted(), "region": "north"}, "r1", KEYRING),  # the region rewritten after the stamp
        ({**adopted(), "failover": "fo-2"}, "r1", KEYRING),  # another failover's name
        ({**adopted(), "adoptedFrom": "south"}, "r1", KEYRING),
        (adopted(), "r2", KEYRING),  # the stamp of another run, copied
        (adopted(), "r1", OTHER),  # a stamp this operator's keys did not make
        (adopted(), "r1", None),
        ({**adopted(), "stamp": None}, "r1", KEYRING),
    ],
)
def test_an_adoption_whose_stamp_does_not_verify_leaves_the_run_home(
    ownership: dict[str, Any], run_id: str, keyring: Keyring | None
) -> None:
    assert owning_region("east", ownership, run_id, keyring) == "east"


def test_a_runs_region_epoch_only_grows() -> None:
    # A region Lease that starts again at 0 (a restore into a fresh cluster) strands no run.
    assert with_region_epoch({"region": "west", "regionEpoch": 5}, "west", 0)["regionEpoch"] == 5
    assert with_region_epoch({"region": "west", "regionEpoch": 5}, "west", 9)["regionEpoch"] == 9
    # Another region's epoch is not ours to keep.
    assert with_region_epoch({"region": "east", "regionEpoch": 5}, "west", 1)["regionEpoch"] == 1
    assert with_region_epoch(None, "west", 3) == {"region": "west", "regionEpoch": 3}


def test_a_commit_records_its_region_epoch_and_keeps_the_adoption() -> None:
    kept = with_region_epoch(adopted(), "west", 7)
    assert kept == {**adopted(), "regionEpoch": 7}
    assert owning_region("east", kept, "r1", KEYRING) == "west"
    # Committed by another region (a failover back): the old adoption is not carried over.
    assert with_region_epoch(adopted(), "east", 2) == {"region": "east", "regionEpoch": 2}


def test_the_engine_keeps_the_ownership_through_a_transition() -> None:
    run = new_run(steps=[{"name": "done", "complete": {"result": "ok"}}])
    run["status"] = {"ownership": adopted()}
    after = apply(run, commit_of(step(run, T0)))
    assert after["status"]["ownership"] == adopted()
