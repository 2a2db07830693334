"""The mutating webhook's part in reveal (:mod:`durable_agents.shell.runs.reveal`): one call from
``stamp_identity``, on every AgentRun create or update."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from durable_agents.core import request_stamps
from durable_agents.shell.runs.reveal import RevealRefused, reveal_changes
from durable_agents_controllers.manager import Manager


async def reveal_hook(
    manager: Manager,
    body: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    userinfo: Mapping[str, Any],
    dryrun: bool,
    patch: kopf.Patch,
) -> None:
    """Answer a reveal request (a dry run by an approver) in ``patch``, or refuse it."""
    new = dict(body)
    # The run's policy (named, or its namespace's or the cluster's default): its approver rule.
    governing = manager.policies.governing_key(dict(old)) if old is not None else None
    policy = manager.policies.get(governing) if governing is not None else None
    try:
        changes = await reveal_changes(
            manager.kube,
            new,
            dict(old) if old is not None else None,
            request_stamps.identity_of(dict(userinfo)),
            policy,
            manager.keyring,
            dryrun,
        )
    except RevealRefused as err:
        raise kopf.AdmissionError(str(err), code=err.code) from err
    for key, value in changes.items():
        patch.metadata.setdefault("annotations", {})[key] = value
