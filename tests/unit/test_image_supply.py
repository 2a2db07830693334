"""hack/image_supply.py, which makes the image reproducible and hash-pinned (``make image``): the
requirements it writes pin every wheel but pip's by its sha256; the layer rewrite sets every time
to the commit's (earlier ones too: a layer the build cache kept from an older build has them) and
keeps every entry's order, content, mode, links and extended attributes, and gives the same bytes
twice; the config keeps a base's earlier history times."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
EPOCH = 1_700_000_000  # the commit's time
LATER, EARLIER = EPOCH + 3600, EPOCH - 86400


@pytest.fixture(scope="module")
def supply() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_supply", REPO / "hack/image_supply.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["image_supply"] = module
    spec.loader.exec_module(module)
    return module


def test_requirements_pin_every_wheel_but_pip_by_its_sha256(supply: ModuleType, tmp_path: Path) -> None:
    wheels = {
        "durable_agents-0.2.0-py3-none-any.whl": b"ours",
        "PyYAML-6.0.4-cp311-cp311-manylinux_2_17_x86_64.whl": b"yaml",
        "pip-25.3-py3-none-any.whl": b"the installer",
    }
    for name, content in wheels.items():
        (tmp_path / name).write_bytes(content)
    text = supply.requirements(tmp_path)
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    assert f"durable-agents==0.2.0 \\\n    --hash=sha256:{sha(b'ours')}\n" in text
    assert f"pyyaml==6.0.4 \\\n    --hash=sha256:{sha(b'yaml')}\n" in text
    assert "pip==" not in text


def _layer(entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as out:
        for info, content in entries:
            out.addfile(info, io.BytesIO(content) if content is not None else None)
    return buffer.getvalue()


def _entry(name: str, kind: bytes, mtime: float, content: bytes | None = None, **extra: object) -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.mtime, info.mode = kind, mtime, 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.size = len(content) if content is not None else 0
    for key, value in extra.items():
        setattr(info, key, value)
    return info, content


def test_a_layer_gets_the_commits_time_and_nothing_else_changes(supply: ModuleType, tmp_path: Path) -> None:
    layer = _layer(
        [
            _entry("opt", tarfile.DIRTYPE, LATER),  # the directory a COPY wrote into
            _entry(
                "opt/durable-agents/sbom.cdx.json",
                tarfile.REGTYPE,
                LATER + 0.25,
                b'{"bomFormat": "CycloneDX"}',
            ),
            _entry(
                "opt/durable-agents/bin/python3",
                tarfile.REGTYPE,
                EARLIER,
                b"\x7fELF",
                pax_headers={"SCHILY.xattr.security.capability": "cap", "atime": str(LATER)},
            ),
            _entry("opt/durable-agents/bin/python", tarfile.SYMTYPE, LATER, linkname="python3"),
            _entry(
                "opt/durable-agents/bin/py", tarfile.LNKTYPE, LATER, linkname="opt/durable-agents/bin/python3"
            ),
            _entry("etc/.wh.motd", tarfile.REGTYPE, LATER, b""),  # a deletion (whiteout)
        ]
    )
    sbom = tmp_path / "sbom.json"
    outputs = []
    for _ in range(2):
        out = io.BytesIO()
        found = supply.stamp_layer(io.BytesIO(layer), out, EPOCH, {"opt/durable-agents/sbom.cdx.json": sbom})
        outputs.append(out.getvalue())
    assert outputs[0] == outputs[1], "the same layer rewritten twice gives other bytes"
    assert found == {"opt/durable-agents/sbom.cdx.json"}
    assert sbom.read_bytes() == b'{"bomFormat": "CycloneDX"}'

    with (
        tarfile.open(fileobj=io.BytesIO(layer)) as before,
        tarfile.open(fileobj=io.BytesIO(outputs[0])) as after,
    ):
        old, new = before.getmembers(), after.getmembers()
        assert [m.name for m in new] == [m.name for m in old]
        for a, b in zip(old, new, strict=True):
            assert b.mtime == EPOCH, b.name
            assert (b.type, b.mode, b.uid, b.gid, b.linkname, b.size) == (
                a.type,
                a.mode,
                a.uid,
                a.gid,
                a.linkname,
                a.size,
            ), b.name
            if a.isfile():
                assert after.extractfile(b).read() == before.extractfile(a).read()  # type: ignore[union-attr]
        python3 = after.getmember("opt/durable-agents/bin/python3")
        assert python3.pax_headers.get("SCHILY.xattr.security.capability") == "cap"
        assert "atime" not in python3.pax_headers


def test_the_config_is_made_at_the_commits_time(supply: ModuleType) -> None:
    config = {
        "created": "2026-12-03T13:00:01.123456789Z",
        "history": [
            {"created": "2020-01-01T00:00:00Z", "created_by": "a public base's step"},
            {"created": "2030-01-01T00:00:00.5Z", "comment": "Imported from -"},  # a base imported later
            {"created": "2026-12-03T13:00:01.1Z", "created_by": "RUN ..."},
            {"created": "2023-11-14T00:00:00Z", "created_by": "COPY ... (cached from an earlier build)"},
        ],
    }
    stamped = supply.stamp_config(config, EPOCH, 2)
    at = "2023-11-14T22:13:20Z"
    assert stamped["created"] == at
    assert [h["created"] for h in stamped["history"]] == ["2020-01-01T00:00:00Z", at, at, at]
    assert stamped["history"][2]["created_by"] == "RUN ..."
