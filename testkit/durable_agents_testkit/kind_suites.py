"""The table of tests ``make test-kind`` leaves out, generated from their ``local_plane`` marks.

``python -m durable_agents_testkit.kind_suites`` prints the page ``docs/operate/kind-suites.md``;
``--write`` writes it there. The suites are collected by pytest itself (``--collect-only``, no
cluster started), so a test that needs the local control plane cannot be missing from the page:
the top-level ``conftest.py`` refuses one that asks for the plane without the mark, and
``tests/unit/test_kind_suites.py`` fails when the committed page differs from this output.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from durable_agents_testkit import local_plane

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "operate" / "kind-suites.md"
KIND_SUITES = ("tests/integration", "e2e")  # what make test-kind runs: -m 'integration or e2e'

HEADER = """\
# The suites on another cluster (kind)

`make test-kind` runs the integration and e2e suites against the cluster that
`DURABLE_AGENTS_TEST_KUBECONFIG` names (for example kind on a laptop with Docker:
`make kind-up test-kind`). The tests below need the local control plane the test kit starts: each
carries `@pytest.mark.local_plane(...)` naming what it needs of it
(`testkit/durable_agents_testkit/local_plane.py`). `make test-kind` deselects them, and on any
other cluster they are skipped naming their needs, so `make test` proves more than
`make test-kind`.

<!-- Generated from the local_plane marks by `python -m durable_agents_testkit.kind_suites --write`;
tests/unit/test_kind_suites.py fails when this page differs. -->

| Test file | Tests | Needs |
|---|---|---|
"""
LEGEND = """
| Need | What the test uses of the local plane | Why kind cannot give it |
|---|---|---|
"""


@dataclass(frozen=True)
class Collected:
    file: str  # relative to the repository
    function: str  # the test function, parametrized cases folded into one
    needs: tuple[str, ...]  # empty: runs on any cluster


class _Collector:
    def __init__(self) -> None:
        self.items: list[Collected] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            needs = [n for mark in item.iter_markers(local_plane.MARK) for n in mark.args]
            file = Path(str(item.fspath)).resolve().relative_to(REPO).as_posix()
            function = getattr(item, "originalname", item.name)
            checked = local_plane.checked(needs, item.nodeid) if needs else ()
            self.items.append(Collected(file, function, checked))


def collect() -> list[Collected]:
    """Every test of the kind suites with its needs, as pytest collects them (no cluster)."""
    collector = _Collector()
    args = ["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO)]
    args += ["-c", str(REPO / "pyproject.toml"), *(str(REPO / s) for s in KIND_SUITES)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = pytest.main(args, plugins=[collector])
    if code != 0:
        raise RuntimeError(f"collecting the kind suites failed ({code}):\n{out.getvalue()[-3000:]}")
    return collector.items


def rows(items: list[Collected]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(file, its tests, needs) per file with marked tests: "all" when every test of the file is
    marked, else the marked functions (parametrized cases folded); needs are the union."""
    by_file: dict[str, list[Collected]] = defaultdict(list)
    for item in items:
        by_file[item.file].append(item)
    out = []
    for file, tests in sorted(by_file.items()):
        marked = [t for t in tests if t.needs]
        if not marked:
            continue
        functions = list(dict.fromkeys(t.function for t in marked))
        which = "all" if len(marked) == len(tests) else ", ".join(f"`{fn}`" for fn in functions)
        seen = {n for t in marked for n in t.needs}
        out.append((file, which, tuple(n for n in local_plane.NEEDS if n in seen)))
    return out


def page(items: list[Collected]) -> str:
    files = [f"| `{file}` | {which} | {', '.join(needs)} |" for file, which, needs in rows(items)]
    legend = [
        f"| {name} | {need.what} | {need.why_not_on_kind} |" for name, need in local_plane.NEEDS.items()
    ]
    return HEADER + "\n".join(files) + "\n" + LEGEND + "\n".join(legend) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true", help=f"write {PAGE.relative_to(REPO)}")
    args = parser.parse_args(argv)
    text = page(collect())
    if args.write:
        PAGE.parent.mkdir(parents=True, exist_ok=True)
        PAGE.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
