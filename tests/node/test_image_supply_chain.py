"""What a security team verifies in the operator's image (``make image``; docs/security/supply-chain.md):
its SBOM lists exactly what is installed, every wheel was installed by its sha256, the OCI labels
name the commit it was built from. ``make image`` runs here (quick when the node suite built the
image already: its caches hold), and what it left in build/ is read at once (the node suite's
upgrade build rewrites build/ with another version); no cluster is needed. That two builds of one
commit give the same image is ``make image-reproducible`` (minutes: not part of ``make test``)."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durable_agents import __version__

REPO = Path(__file__).resolve().parents[2]
DOCKER = "/usr/bin/docker"  # Debian's client, matching the daemon hack/image.sh starts
SBOM = "/opt/durable-agents/sbom.cdx.json"
REQUIREMENTS = "/opt/durable-agents/requirements.txt"

# Run by the image's own interpreter: what is installed in its virtualenv (what `pip list` shows,
# from the same metadata; pip itself is not in the image), and the two files, read as shipped.
IN_IMAGE = f"""
import importlib.metadata, importlib.util, json, sys
print(json.dumps({{
    "installed": sorted([d.metadata["Name"], d.version] for d in importlib.metadata.distributions()),
    "prefix": sys.prefix,
    "tool_importable": [m for m in ("cyclonedx", "cyclonedx_py", "pip") if importlib.util.find_spec(m)],
    "sbom": open("{SBOM}").read(),
    "requirements": open("{REQUIREMENTS}").read(),
}}))
"""


def _docker(*argv: str) -> str:
    done = subprocess.run([DOCKER, *argv], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"docker {' '.join(argv[:3])}: {done.stderr}"
    return done.stdout


def _git(*argv: str) -> str:
    done = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Built:
    image_id: str  # as hack/image.sh printed it (a tag may be moved by another build)
    sbom: str  # build/sbom.cdx.json
    wheels: dict[str, str]  # build/wheels: sha256 -> file name


@pytest.fixture(scope="module")
def built() -> Built:
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("make image needs root here (it starts and drives the Docker engine)")
    done = subprocess.run(
        ["bash", str(REPO / "hack/image.sh")], capture_output=True, text=True, timeout=3600, check=False
    )
    assert done.returncode == 0, f"hack/image.sh failed:\n{done.stdout}\n{done.stderr}"
    found = re.search(r"^image ID: (sha256:[0-9a-f]{64}) ", done.stderr, flags=re.M)
    assert found, f"hack/image.sh printed no image ID:\n{done.stderr}"
    wheels = {
        hashlib.sha256(w.read_bytes()).hexdigest(): w.name for w in (REPO / "build/wheels").glob("*.whl")
    }
    return Built(found.group(1), (REPO / "build/sbom.cdx.json").read_text(), wheels)


@pytest.fixture(scope="module")
def image_id(built: Built) -> str:
    return built.image_id


@pytest.fixture(scope="module")
def shipped(image_id: str) -> dict[str, Any]:
    out = _docker(
        "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL",
        "--entrypoint", "/opt/durable-agents/bin/python", image_id, "-c", IN_IMAGE,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out)
    return result


def test_the_sbom_lists_what_is_installed_at_its_versions(shipped: dict[str, Any]) -> None:
    sbom = json.loads(shipped["sbom"])
    assert sbom["bomFormat"] == "CycloneDX", sbom.get("bomFormat")
    root = sbom["metadata"]["component"]
    assert (root["name"], root["version"], root["type"]) == ("durable-agents", __version__, "application")
    installed = {_canonical(name): version for name, version in shipped["installed"]}
    assert installed.pop("durable-agents") == __version__
    listed = {_canonical(c["name"]): c["version"] for c in sbom["components"]}
    assert listed == installed, (
        f"in the SBOM, not installed: {sorted(set(listed.items()) - set(installed.items()))}; "
        f"installed, not in the SBOM: {sorted(set(installed.items()) - set(listed.items()))}"
    )
    # The runtime dependencies pyproject.toml pins are there, each with a package URL a scanner
    # matches against advisories.
    for dependency in ("kopf", "kubernetes", "pydantic", "cryptography", "aiohttp", "anthropic", "mcp"):
        assert dependency in listed, dependency
    purls = {c["purl"] for c in sbom["components"]}
    assert f"pkg:pypi/kopf@{listed['kopf']}" in purls
    # The tool that made it is named in it, and is not in the image.
    assert "cyclonedx-py" in [t["name"] for t in sbom["metadata"]["tools"]["components"]]
    assert shipped["tool_importable"] == [], shipped["tool_importable"]
    assert not [name for name in installed if name.startswith("cyclonedx")]


def test_the_sbom_beside_the_build_is_the_one_in_the_image(built: Built, shipped: dict[str, Any]) -> None:
    assert built.sbom == shipped["sbom"]


def test_every_installed_wheel_is_pinned_by_its_hash(built: Built, shipped: dict[str, Any]) -> None:
    pinned = dict(re.findall(r"^(\S+)==(\S+) \\$", shipped["requirements"], flags=re.M))
    hashes = re.findall(r"^\s+--hash=sha256:([0-9a-f]{64})$", shipped["requirements"], flags=re.M)
    assert pinned, shipped["requirements"]
    assert len(hashes) == len(pinned), shipped["requirements"]
    installed = {_canonical(name): version for name, version in shipped["installed"]}
    assert {_canonical(n): v for n, v in pinned.items()} == installed
    # The hashes are the wheels' that make image built (the project's own among them).
    wheels = built.wheels
    assert set(hashes) <= set(wheels), sorted(set(hashes) - set(wheels))
    assert any(wheels[h].startswith(f"durable_agents-{__version__}-") for h in hashes)
    # And the build could not have installed anything else: the Dockerfile says so.
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "--require-hashes --no-compile --no-warn-script-location -r /wheels/requirements.txt" in dockerfile


def test_the_labels_name_the_commit_version_and_time(image_id: str) -> None:
    inspected = json.loads(_docker("image", "inspect", image_id))[0]
    labels = inspected["Config"]["Labels"]
    commit_time = datetime.datetime.fromtimestamp(int(_git("log", "-1", "--format=%ct")), datetime.UTC)
    created = commit_time.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.revision"].removesuffix("-dirty") == _git("rev-parse", "HEAD")
    assert labels["org.opencontainers.image.created"] == created
    # The image's own creation time is the commit's too (not the build's: reproducible).
    assert inspected["Created"] == created
    origin = re.sub(r"^([a-z+]+://)[^/@]*@", r"\1", _git("remote", "get-url", "origin"))
    assert labels["org.opencontainers.image.source"] == (origin or "unknown")
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
