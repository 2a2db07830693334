"""An earlier release of the operator, materialized from git, for upgrade and downgrade tests.

``git archive`` writes the release's ``operator`` and ``controllers`` source roots into a directory;
an operator process started with :meth:`Release.env` (``PYTHONPATH`` naming those roots) imports
that release instead of the working tree: ``PYTHONPATH`` entries come before site-packages on
``sys.path``, and the venv's editable-install finder only answers after ``PathFinder`` did not.
:meth:`Release.probe` shows what such a process really imports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE_ROOTS = ("operator", "controllers")

_PROBE = """
import json, durable_agents, durable_agents_controllers
from durable_agents.core import checkpoint
print(json.dumps({
    "durable_agents": durable_agents.__file__,
    "durable_agents_controllers": durable_agents_controllers.__file__,
    "version": getattr(durable_agents, "__version__", None),
    "schemaVersion": checkpoint.CURRENT_SCHEMA_VERSION,
}))
"""


class ReleaseUnavailable(Exception):
    """The release cannot be materialized from this clone (typically: a shallow clone)."""


@dataclass(frozen=True)
class Release:
    sha: str
    root: Path

    @property
    def pythonpath(self) -> str:
        return os.pathsep.join(str(self.root / part) for part in SOURCE_ROOTS)

    def env(self) -> dict[str, str]:
        """Environment for an operator process that must run this release."""
        return {"PYTHONPATH": self.pythonpath}

    def probe(self) -> dict[str, Any]:
        """What a process started with :meth:`env` imports: module files, version, schema version."""
        out = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"importing release {self.sha[:12]} failed:\n{out.stderr}")
        found: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return found


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60, check=False
    )


def materialize_release(repo: Path, sha: str, dest: Path, parts: tuple[str, ...] = SOURCE_ROOTS) -> Release:
    """Write ``parts`` of commit ``sha`` of ``repo`` (its source roots, by default) into ``dest``;
    ReleaseUnavailable if the commit is not in the clone or lacks one of them."""
    if shutil.which("git") is None:
        raise ReleaseUnavailable(f"git is not installed: cannot materialize release {sha}")
    if _git(repo, "cat-file", "-e", f"{sha}^{{commit}}").returncode != 0:
        shallow = _git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        raise ReleaseUnavailable(
            f"commit {sha} (the previous release) is not in the clone at {repo}"
            + (" (it is a shallow clone)" if shallow else "")
            + ": this test needs a full clone (git fetch --unshallow, or actions/checkout with "
            "fetch-depth: 0)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(
        ["git", "-C", str(repo), "archive", "--format=tar", sha, *parts],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert archive.stdout is not None
    untar = subprocess.run(
        ["tar", "-x", "-C", str(dest)], stdin=archive.stdout, capture_output=True, timeout=120, check=False
    )
    archive.stdout.close()
    archive_err = archive.stderr.read().decode() if archive.stderr else ""
    if archive.wait(timeout=60) != 0 or untar.returncode != 0:
        raise ReleaseUnavailable(
            f"git archive {sha} failed: {archive_err.strip()} {untar.stderr.decode().strip()}".strip()
        )
    if archive.stderr:
        archive.stderr.close()
    missing = [part for part in parts if not (dest / part).is_dir()]
    if missing:
        raise ReleaseUnavailable(f"release {sha} has no {', '.join(missing)} directory")
    return Release(sha, dest)


__all__ = ["Release", "ReleaseUnavailable", "materialize_release"]
