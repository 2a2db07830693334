"""The sealing keys every operator process of a test session shares (as a mounted Secret would).

One directory per test process, made on first use: every operator a test starts gets it unless
the test passes its own (rotation and quarantine tests do). Operators of the same session verify
each other's stamps and unseal each other's values, as replicas sharing one Secret do.
"""

from __future__ import annotations

import os
import tempfile
import threading
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from durable_agents.api.v1alpha1 import Identity
from durable_agents.core.request_stamps import stamps
from durable_agents.core.retention import FINALIZER
from durable_agents.core.sealed_values import DATA_KEY_ANNOTATION, open_data_key, unseal_value
from durable_agents.core.sealing import Keyring, generate_key
from durable_agents.core.sealing_admission import sealing_changes
from durable_agents.shell.keys.keyring import load_keyring

ACTIVE_KEY_ID = "test-key-1"


_made = threading.Lock()


def session_keys_dir() -> Path:
    # Under a lock: the chaos lab's first calls come from several threads at once, and two
    # directories would mean runs stamped with one key and operators holding another.
    with _made:
        return _session_keys_dir()


@cache
def _session_keys_dir() -> Path:
    directory = Path(tempfile.mkdtemp(prefix=f"durable-agents-keys-{os.getpid()}-"))
    (directory / ACTIVE_KEY_ID).write_bytes(generate_key(entropy=os.urandom))
    return directory


def keyring_env() -> dict[str, str]:
    """The variables that hand an operator process the session's keys."""
    return {
        "DURABLE_AGENTS_SEALING_KEYS_DIR": str(session_keys_dir()),
        "DURABLE_AGENTS_SEALING_ACTIVE_KEY": ACTIVE_KEY_ID,
    }


def session_keyring() -> Keyring:
    return load_keyring(session_keys_dir(), ACTIVE_KEY_ID)


# The test kit writes runs and requests as an administrator would through the admission webhook:
# suites that are not about admission run operators without a webhook (one per test would have to
# stay up for every write), so the test kit stamps its own writes with the session's keys, exactly
# as the webhook does (the same function). Tests of forged or unstamped input write raw instead.
TEST_KIT_USER = Identity(username="durable-agents-test-kit")


def admitted(
    operation: str, new: dict[str, Any], old: dict[str, Any] | None, user: Identity = TEST_KIT_USER
) -> dict[str, Any]:
    """The spec fields the admission webhook would stamp into ``new`` (a merge into its spec)."""
    return stamps(operation, new, old, user, datetime.now(UTC), session_keyring())


def sealed(operation: str, body: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    """``body`` with its sensitive values sealed and its data key, as the webhook seals them."""
    changes = sealing_changes(operation, body, old, session_keyring(), entropy=os.urandom)
    meta = body.get("metadata") or {}
    annotations = {**(meta.get("annotations") or {}), **changes.annotations}
    finalizers = list(meta.get("finalizers") or [])
    if operation == "CREATE" and FINALIZER not in finalizers:
        finalizers.append(FINALIZER)  # as the webhook puts it on
    return {
        **body,
        "metadata": {
            **meta,
            "annotations": {k: v for k, v in annotations.items() if v is not None},
            **({"finalizers": finalizers} if finalizers else {}),
        },
        "spec": {**(body.get("spec") or {}), **changes.spec},
    }


def unsealed(run: dict[str, Any], value: Any, label: str) -> Any:
    """A value the operator sealed for ``run`` (for a field label), opened with the session's keys:
    what a test checks the operator stored."""
    meta = run["metadata"]
    wrapped = (meta.get("annotations") or {}).get(DATA_KEY_ANNOTATION)
    data_key = open_data_key(session_keyring(), wrapped, meta["namespace"], meta["name"])
    return unseal_value(data_key, value, label)
