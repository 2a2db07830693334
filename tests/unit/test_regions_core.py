"""Region ownership, the pure part: region names, the Lease name, and which owner fences which."""

from __future__ import annotations

import re

import pytest

from durable_agents.api.v1alpha1 import AgentRunSpec
from durable_agents.core.regions import (
    MAX_REGION_LENGTH,
    InvalidRegion,
    RegionOwnership,
    region_lease_name,
    region_problem,
    validate_region,
)


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
