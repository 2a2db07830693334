"""The sealing keys every operator process of a test session shares (as a mounted Secret would).

One directory per test process, made on first use: every operator a test starts gets it unless
the test passes its own (rotation and quarantine tests do). Operators of the same session verify
each other's stamps and unseal each other's values, as replicas sharing one Secret do.
"""

from __future__ import annotations

import os
import tempfile
from functools import cache
from pathlib import Path

from durable_agents.core.sealing import generate_key

ACTIVE_KEY_ID = "test-key-1"


@cache
def session_keys_dir() -> Path:
    directory = Path(tempfile.mkdtemp(prefix=f"durable-agents-keys-{os.getpid()}-"))
    (directory / ACTIVE_KEY_ID).write_bytes(generate_key())
    return directory


def keyring_env() -> dict[str, str]:
    """The variables that hand an operator process the session's keys."""
    return {
        "DURABLE_AGENTS_SEALING_KEYS_DIR": str(session_keys_dir()),
        "DURABLE_AGENTS_SEALING_ACTIVE_KEY": ACTIVE_KEY_ID,
    }
