"""The chart's webhook configurations are generated from the operator's (``make crds``): they
must not drift, or the operator would rewrite the release's objects on every start."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_agents.shell import webhook_manifests

pytestmark = pytest.mark.unit
FILES = Path(__file__).resolve().parents[2] / "charts/durable-agents/files"


@pytest.mark.parametrize("name", sorted(webhook_manifests.FILES))
def test_the_chart_files_match_the_operator(name: str) -> None:
    assert (FILES / name).read_text() == webhook_manifests.generate()[name], (
        f"{name} drifted: run `make crds`"
    )
