"""docs/operate/kind-suites.md, the tests ``make test-kind`` leaves out, is generated from the
``local_plane`` marks (durable_agents_testkit/kind_suites.py) and must not drift from them; make
test-kind deselects exactly that mark."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from durable_agents_testkit import kind_suites, local_plane
from durable_agents_testkit.kind_suites import Collected

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def test_the_committed_page_lists_every_marked_test() -> None:
    # A process of its own: the suites are collected by pytest, which must not run inside this one.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("testkit", "operator", "controllers")),
    }
    done = subprocess.run(
        [sys.executable, "-m", "durable_agents_testkit.kind_suites"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert kind_suites.PAGE.read_text() == done.stdout, (
        "docs/operate/kind-suites.md differs from the local_plane marks:"
        " run `.venv/bin/python -m durable_agents_testkit.kind_suites --write`"
    )


def test_a_file_is_named_whole_or_by_its_marked_functions_with_the_union_of_their_needs() -> None:
    items = [
        Collected("e2e/test_a.py", "test_one", ("users",)),
        Collected("e2e/test_a.py", "test_two", ("audit", "webhook")),
        Collected("e2e/test_b.py", "test_cases", ("etcd",)),
        Collected("e2e/test_b.py", "test_cases", ("etcd",)),  # a second parametrized case
        Collected("e2e/test_b.py", "test_elsewhere", ()),
        Collected("e2e/test_c.py", "test_anywhere", ()),
    ]
    assert kind_suites.rows(items) == [
        ("e2e/test_a.py", "all", ("users", "webhook", "audit")),
        ("e2e/test_b.py", "`test_cases`", ("etcd",)),
    ]
    page = kind_suites.page(items)
    assert "| `e2e/test_a.py` | all | users, webhook, audit |" in page
    assert "test_c.py" not in page
    for name, need in local_plane.NEEDS.items():
        assert f"| {name} | {need.what} | {need.why_not_on_kind} |" in page


def test_a_mark_must_name_known_needs() -> None:
    assert local_plane.checked(["audit", "users"], "t") == ("users", "audit")
    with pytest.raises(ValueError, match=r"t: @pytest.mark.local_plane\(...\) must name what"):
        local_plane.checked([], "t")
    with pytest.raises(ValueError, match="'sudo'"):
        local_plane.checked(["users", "sudo"], "t")


def test_make_test_kind_deselects_the_marked_tests() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^test-kind:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe is not None, "no test-kind target in the Makefile"
    assert f"-m '(integration or e2e) and not {local_plane.MARK}'" in recipe.group(1)
