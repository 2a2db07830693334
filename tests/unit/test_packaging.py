"""What ships: the wheel holds the operator, the CRD types and the kubectl plugin, nothing else."""

from __future__ import annotations

import configparser
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[zipfile.ZipFile, str]:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (path,) = out.glob("durable_agents-*.whl")
    return zipfile.ZipFile(path), build.stdout + build.stderr


def test_the_wheel_ships_only_the_operator(wheel: tuple[zipfile.ZipFile, str]) -> None:
    archive, _ = wheel
    packages = {name.split("/")[0] for name in archive.namelist() if not name.endswith(".dist-info/")}
    packages = {p for p in packages if not p.endswith(".dist-info")}
    assert packages == {"durable_agents", "durable_agents_controllers"}
    names = archive.namelist()
    assert "durable_agents/kubectl/main.py" in names
    assert "durable_agents/api/v1alpha1/agentrun.py" in names
    # The console serves its pages from the package: templates and static files ship with it.
    for shipped in (
        "console/templates/run.html",
        "console/templates/inbox.html",
        "console/static/console.js",
    ):
        assert f"durable_agents/{shipped}" in names, f"{shipped} is not in the wheel"
    for kit in ("testkit", "testing", "localcluster", "refsystem", "demo", "chaos"):
        assert not [n for n in names if kit in n], f"{kit} ships in the wheel"


def test_only_what_users_run_is_a_console_script(wheel: tuple[zipfile.ZipFile, str]) -> None:
    archive, _ = wheel
    (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser()
    parser.read_string(archive.read(entry_points).decode())
    assert dict(parser["console_scripts"]) == {
        "durable-agents-operator": "durable_agents_controllers.__main__:main",
        "kubectl-agentrun": "durable_agents.kubectl.main:main",
    }


def test_the_build_prints_no_warning(wheel: tuple[zipfile.ZipFile, str]) -> None:
    _, output = wheel
    assert "warning" not in output.lower(), output
    assert "deprecat" not in output.lower(), output
