"""Every CRD field is described (``kubectl explain``), and the generated reference has not drifted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from durable_agents.api import crdgen, crdref

REPO = Path(__file__).resolve().parents[2]
CRD_FILES = sorted((REPO / "crds").glob("*.yaml"))


def undescribed(node: dict[str, Any], path: str) -> list[str]:
    """Paths of the schema's fields (at any depth, in arrays and maps too) without a description.

    Not the object's own ``metadata``: the API server refuses a CRD that says more of it than its
    type, and kubectl explain describes it from the built-in ObjectMeta."""
    missing: list[str] = []
    for name, child in (node.get("properties") or {}).items():
        here = f"{path}.{name}"
        if here.count(".") == 1 and name == "metadata":
            continue
        if not str(child.get("description") or "").strip():
            missing.append(here)
        missing += undescribed(child, here)
    if isinstance(node.get("items"), dict):
        missing += undescribed(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        missing += undescribed(node["additionalProperties"], f"{path}{{}}")
    return missing


def test_the_walk_finds_fields_at_every_depth() -> None:
    # A field deep in an array of a map's values, and one without any description at all.
    schema = {
        "description": "root",
        "properties": {
            "a": {
                "description": "a map",
                "additionalProperties": {
                    "properties": {
                        "b": {"description": "an array", "items": {"properties": {"c": {"type": "string"}}}}
                    }
                },
            },
            "d": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "metadata": {"type": "object"},
            "e": {"description": "nested metadata is a field like any", "properties": {"metadata": {}}},
        },
    }
    assert undescribed(schema, "K") == ["K.a{}.b[].c", "K.d", "K.e.metadata"]


@pytest.mark.parametrize("path", CRD_FILES, ids=lambda p: p.name)
def test_every_crd_field_has_a_description(path: Path) -> None:
    crd = yaml.safe_load(path.read_text())
    kind = crd["spec"]["names"]["kind"]
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        assert str(schema.get("description") or "").strip(), (
            f"{path.name}: the kind {kind} has no description"
        )
        missing = undescribed(schema, kind)
        assert missing == [], (
            f"{path.name}: {len(missing)} field(s) without a description (add a docstring under the "
            f"field in operator/durable_agents/api/v1alpha1/, then `make crds`): {missing}"
        )


def test_every_kind_has_short_names_and_the_category() -> None:
    for kind in crdgen.KINDS:
        names = kind.crd()["spec"]["names"]
        assert names["shortNames"], f"{kind.kind} has no short name"
        assert names["categories"] == ["durable-agents"], kind.kind


def test_committed_reference_matches_the_api_types() -> None:
    committed = (REPO / crdref.DEFAULT_PATH).read_text()
    assert committed == crdref.render(), f"{crdref.DEFAULT_PATH} drifted from the API types: run `make crds`"


def test_reference_has_a_table_per_object_and_its_links_land() -> None:
    page = crdref.render()
    headings = {crdref.slug(line.lstrip("#").strip()) for line in page.splitlines() if line.startswith("#")}
    for kind in crdgen.KINDS:
        assert f"## {kind.kind}" in page.splitlines()
        assert crdref.slug(kind.kind) in headings
    assert "### AgentPolicy spec.retry" in page.splitlines()
    assert "| `approvalRequiredTiers` |" in page  # a field, in its object's table
    links = [part.split(")")[0] for part in page.split("](#")[1:]]
    assert links, "no links between the tables"
    assert sorted(set(links) - headings) == [], "links to anchors that no heading makes"
    # Nothing links or points outside the page (the MkDocs site builds it with --strict).
    assert "](http" not in page
    assert "](." not in page


@pytest.mark.parametrize(
    ("text", "cell"),
    [
        ("a | b", "a \\| b"),
        ("<key ID>:<MAC>", "&lt;key ID&gt;:&lt;MAC&gt;"),
        ("`mcp:<server>/<tool>` and <x>", "`mcp:<server>/<tool>` and &lt;x&gt;"),
        ("two\n  lines", "two lines"),
    ],
)
def test_a_cell_renders_as_written(text: str, cell: str) -> None:
    assert crdref.cell(text) == cell
