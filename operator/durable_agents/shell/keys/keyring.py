"""The sealing keyring, read once at start-up from a mounted Secret.

The directory holds one file per key ID (a Secret mounted as a volume: each file holds the 32 raw
key bytes, or their base64); one key ID is the active one, which seals new values. Without a
keyring, a run whose checkpoint carries sealed values is quarantined (``Undecryptable``): it cannot
be verified here. A malformed keyring stops the operator at start-up with the reason, never mid-run.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from durable_agents.core.sealing import KEY_BYTES, Keyring, KeyringError


def _key_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if len(raw) == KEY_BYTES:
        return raw
    try:
        return base64.b64decode(raw.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyringError(f"{path}: neither {KEY_BYTES} raw bytes nor base64") from exc


def load_keyring(directory: Path, active_key_id: str) -> Keyring:
    """The keyring in ``directory`` (one file per key ID), sealing with ``active_key_id``."""
    if not directory.is_dir():
        raise KeyringError(f"{directory}: not a directory")
    # A mounted Secret also holds "..data" and timestamped directories: key files only.
    keys = {
        p.name: _key_bytes(p)
        for p in sorted(directory.iterdir())
        if not p.name.startswith(".") and p.is_file()
    }
    return Keyring(keys=keys, active_key_id=active_key_id)
