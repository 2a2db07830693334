"""The sealing keyring, read once at start-up from a mounted Secret.

``DURABLE_AGENTS_SEALING_KEYS_DIR`` names a directory with one file per key ID (a Secret mounted
as a volume: each file holds the 32 raw key bytes, or their base64); ``DURABLE_AGENTS_SEALING_ACTIVE_KEY``
names the key that seals. Without a directory the operator has no keyring, and a run whose
checkpoint carries sealed values is quarantined (``Undecryptable``): it cannot be verified here.
A malformed keyring stops the operator at start-up with the reason, never mid-run.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from pathlib import Path

from durable_agents.core.sealing import KEY_BYTES, Keyring, KeyringError

KEYS_DIR_ENV = "DURABLE_AGENTS_SEALING_KEYS_DIR"
ACTIVE_KEY_ENV = "DURABLE_AGENTS_SEALING_ACTIVE_KEY"


def _key_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if len(raw) == KEY_BYTES:
        return raw
    try:
        return base64.b64decode(raw.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyringError(f"{path}: neither {KEY_BYTES} raw bytes nor base64") from exc


def load_keyring(env: Mapping[str, str]) -> Keyring | None:
    """The keyring the environment names, or None when none is configured."""
    directory = env.get(KEYS_DIR_ENV)
    if not directory:
        return None
    active = env.get(ACTIVE_KEY_ENV)
    if not active:
        raise KeyringError(f"{KEYS_DIR_ENV} is set, so {ACTIVE_KEY_ENV} must name the key that seals")
    root = Path(directory)
    if not root.is_dir():
        raise KeyringError(f"{KEYS_DIR_ENV}={directory}: not a directory")
    # A mounted Secret also holds "..data" and timestamped directories: key files only.
    keys = {
        p.name: _key_bytes(p) for p in sorted(root.iterdir()) if not p.name.startswith(".") and p.is_file()
    }
    return Keyring(keys=keys, active_key_id=active)
