"""The chart's files that follow the code: its webhook configurations are generated from the
operator's (``make crds``) and must not drift, or the operator would rewrite the release's objects
on every start; its appVersion is the version the image is tagged with."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_agents.shell.admission import manifests as webhook_manifests

pytestmark = pytest.mark.unit
FILES = Path(__file__).resolve().parents[2] / "charts/durable-agents/files"


@pytest.mark.parametrize("name", sorted(webhook_manifests.FILES))
def test_the_chart_files_match_the_operator(name: str) -> None:
    assert (FILES / name).read_text() == webhook_manifests.generate()[name], (
        f"{name} drifted: run `make crds`"
    )


def test_the_chart_deploys_the_version_it_is_shipped_with() -> None:
    """The chart's default image tag (its appVersion) is the version ``make image`` tags."""
    import yaml

    from durable_agents import __version__

    chart = yaml.safe_load((FILES.parent / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
