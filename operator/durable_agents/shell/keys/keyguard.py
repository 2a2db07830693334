"""Retiring a key that runs still use is refused (the validating admission webhook, on Secrets).

A keyring Secret carries the label ``durable-agents.io/keyring: "true"`` (the chart's does; a
Secret of your own given as ``sealing.secretName`` needs it too). An UPDATE that removes a key ID
from it, or changes a key's bytes, and a DELETE of it, take keys away from the operator at its
next start. That is refused while any AgentRun still uses one of those keys
(:func:`durable_agents.core.key_use.keys_in_use`: its data key, checkpoint, or a stamp the operator
will still verify): the message names up to :data:`NAMED_RUNS` of them and how many there are.
Taking away the operator's active key is always refused: it seals and stamps everything new.

Removing the label is taking every key away (the Secret would no longer be guarded). The second
line, when this webhook is off: a run whose key is gone is quarantined by the engine
(``Undecryptable`` or ``IntegrityFailed``) and never acted on; put the key back and retry it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from durable_agents.core.key_use import keys_in_use
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import stamp_key_id
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.keys.resealer import iter_runs
from durable_agents.shell.ledger.actions import PLURAL as ACTION_RECORDS

KEYRING_LABEL: Final = "durable-agents.io/keyring"
KEYGUARD_PATH: Final = "guard-keyring"
NAMED_RUNS: Final = 10


def _labelled(secret: Mapping[str, Any] | None) -> bool:
    labels = ((secret or {}).get("metadata") or {}).get("labels") or {}
    return isinstance(labels, Mapping) and labels.get(KEYRING_LABEL) == "true"


def _keys(secret: Mapping[str, Any] | None) -> dict[str, Any]:
    """Key ID -> value (``data``, and ``stringData`` if a request still carries it)."""
    out: dict[str, Any] = {}
    for part in ("data", "stringData"):
        values = (secret or {}).get(part)
        if isinstance(values, Mapping):
            out.update(values)
    return out


def removed_keys(new: Mapping[str, Any] | None, old: Mapping[str, Any] | None, operation: str) -> set[str]:
    """The key IDs this request takes away: gone, changed, or no longer guarded."""
    before = _keys(old)
    if operation == "DELETE" or not _labelled(new):
        return set(before)
    after = _keys(new)
    return {key_id for key_id, value in before.items() if after.get(key_id) != value}


async def check_keyring_secret(
    kube: Kube,
    new: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None,
    operation: str,
    keyring: Keyring,
    namespace: str | None,
    page_size: int = 200,
) -> str | None:
    """Why this change of a keyring Secret must be refused, or None."""
    if operation not in ("UPDATE", "DELETE") or not _labelled(old):
        return None
    removed = removed_keys(new, old, operation)
    if not removed:
        return None
    reasons = []
    if keyring.active_key_id in removed:
        reasons.append(
            f"key {keyring.active_key_id!r} is the operator's active key (it seals and stamps everything "
            "new): make another key active first (DURABLE_AGENTS_SEALING_ACTIVE_KEY), let the rotation "
            "pass re-seal the runs, then retire it."
        )
    users: list[str] = []
    async for run in iter_runs(kube, namespace, page_size):
        meta = run.get("metadata") or {}
        needs = [
            f"{key_id}: {', '.join(uses)}"
            for key_id, uses in sorted(keys_in_use(run).items())
            if key_id in removed
        ]
        if needs:
            users.append(f"{meta.get('namespace')}/{meta.get('name')} ({'; '.join(needs)})")
    stamped = 0  # ActionRecords whose outcome stamp the operator will verify again
    async for record in iter_runs(kube, namespace, page_size, ACTION_RECORDS):
        stamped += stamp_key_id((record.get("status") or {}).get("stamp")) in removed
    if stamped:
        reasons.append(
            f"{stamped} ActionRecord(s) carry outcome stamps made with key(s) "
            f"{', '.join(repr(k) for k in sorted(removed))}: keep the key until the rotation pass has "
            "re-stamped them under the active key (or their runs are deleted)."
        )
    if users:
        named = ", ".join(users[:NAMED_RUNS])
        more = f", and {len(users) - NAMED_RUNS} more" if len(users) > NAMED_RUNS else ""
        reasons.append(
            f"{len(users)} AgentRun(s) still use key(s) {', '.join(repr(k) for k in sorted(removed))}: "
            f"{named}{more}. Keep the key until the rotation pass has re-sealed them under the active key "
            "(or the runs are deleted)."
        )
    return " ".join(reasons) or None
