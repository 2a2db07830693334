"""The sealing keyring read from a mounted Secret directory (the shell's only sealing I/O)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from durable_agents.core.sealing import KeyringError
from durable_agents.shell.keys.keyring import load_keyring

pytestmark = pytest.mark.unit

RAW = bytes(range(32))


def test_raw_and_base64_key_files_load_and_secret_volume_internals_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "k2030").write_bytes(RAW)
    (tmp_path / "k2025").write_text(base64.b64encode(RAW[::-1]).decode() + "\n")
    (tmp_path / "..data").mkdir()  # what kubelet puts beside the key files of a Secret volume
    (tmp_path / "..2030_01_01").write_text("not a key")
    keyring = load_keyring(tmp_path, "k2030")
    assert keyring is not None
    assert dict(keyring.keys) == {"k2030": RAW, "k2025": RAW[::-1]}
    assert keyring.active_key_id == "k2030"


@pytest.mark.parametrize(
    ("files", "active", "message"),
    [
        ({"k1": RAW}, "k2", "active key ID 'k2' is not in the keyring"),
        ({"k1": b"too short"}, "k1", "neither 32 raw bytes nor base64"),
        ({"k1": base64.b64encode(b"sixteen bytes!!!")}, "k1", "must be 32 bytes, got 16"),
    ],
    ids=["active-key-missing", "garbage", "wrong-length"],
)
def test_a_malformed_keyring_is_refused_with_the_reason(
    tmp_path: Path, files: dict[str, bytes], active: str, message: str
) -> None:
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    with pytest.raises(KeyringError, match=message):
        load_keyring(tmp_path, active)


def test_a_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyringError, match="not a directory"):
        load_keyring(tmp_path / "absent", "k1")
