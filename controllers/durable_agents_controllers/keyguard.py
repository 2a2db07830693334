"""The keyring: its re-sealing on key rotation, and the validating webhook on keyring Secrets.

The resealer (:mod:`durable_agents.shell.keys.resealer`) runs in every process, with the manager's
one keyring: runs still on an older key are re-sealed under the active one, gently.

The webhook: a key still in use is never retired (the rule: :mod:`durable_agents.shell.keys.keyguard`;
its webhook entry: ``registration.webhook_configurations``). Served only with the admission
webhook (``DURABLE_AGENTS_WEBHOOK_PORT``): by the same webhook process, on its own path, for
Secrets labelled ``durable-agents.io/keyring: "true"`` only.
"""

from __future__ import annotations

from typing import Any

import kopf

from durable_agents.shell.keys.keyguard import KEYGUARD_PATH, check_keyring_secret
from durable_agents.shell.keys.resealer import ResealConfig, Resealer
from durable_agents_controllers.manager import Manager


def build(manager: Manager) -> None:
    config = manager.config
    reseal = ResealConfig(
        interval=config.reseal_interval,
        writes_per_second=config.reseal_writes_per_second,
        namespace=config.namespace,
        page_size=config.list_chunk,
    )
    manager.runnables.add(Resealer(manager.kube, manager.keyring, reseal))


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    del registry
    manager.builds.append(build)


def register_admission(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    """The keyring Secrets' webhook, on the webhook process's registry."""

    async def guard_keyring(body: kopf.Body, **kwargs: Any) -> None:
        # On DELETE the body is the old object (kopf); old and new say what changes.
        config, old, new = manager.config, kwargs.get("old"), kwargs.get("new")
        reason = await check_keyring_secret(
            manager.kube,
            dict(new) if new is not None else None,
            dict(old) if old is not None else None,
            str(kwargs.get("operation")),
            manager.keyring,
            config.namespace,
            config.list_chunk,
        )
        if reason is not None:
            raise kopf.AdmissionError(reason, code=403)

    kopf.on.validate("v1", "secrets", id=KEYGUARD_PATH, operations=["UPDATE", "DELETE"], registry=registry)(
        guard_keyring
    )
