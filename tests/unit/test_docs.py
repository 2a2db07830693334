"""The documentation site builds with ``mkdocs build --strict``: every page in the nav, every link
and anchor found (mkdocs.yml's ``validation``), the README's sections that docs/index.md takes found.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_the_docs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            "mkdocs.yml",
            "--site-dir",
            str(site),
        ],
        cwd=REPO,  # the snippets' base path (README.md, config/samples/) is the repository
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stdout}\n{build.stderr}"
    assert (site / "index.html").is_file()
    assert (site / "reference" / "crds" / "index.html").is_file()


def test_a_page_left_out_of_the_nav_fails_the_build(tmp_path: Path) -> None:
    """The strictness is the config's, not the test's: a copy of docs/ with one page more fails."""
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-rL", str(REPO / "docs"), str(docs)], check=True)
    (docs / "orphan.md").write_text("# Not in the nav\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text((REPO / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}"))
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode != 0, "a page missing from the nav was accepted"
    assert "orphan.md" in build.stdout + build.stderr
