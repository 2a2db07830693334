"""The retention controller (:mod:`durable_agents.shell.runs.retention`): started with the operator's
run workers, stopped at clean-up. A process without run workers (``WORKERS=0``: a webhook or
dispatcher only) runs none; several operator processes each run one, and their writes are
idempotent (each carries the read resourceVersion, a record is created once by name).
"""

from __future__ import annotations

from typing import Any

import kopf

from durable_agents.shell.runs.retention import RetentionConfig, RetentionController
from durable_agents_controllers.manager import Manager


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    controller: list[RetentionController] = []

    @kopf.on.startup(registry=registry)
    async def start_retention(**_: Any) -> None:
        config = manager.config
        if config.workers == 0:
            return
        retention = RetentionController(
            manager.kube,
            config.keyring,
            config.identity,
            RetentionConfig(
                namespace=config.namespace, page_size=config.list_chunk, watch_timeout=config.watch_timeout
            ),
        )
        retention.start()
        controller.append(retention)

    @kopf.on.cleanup(registry=registry)
    async def stop_retention(**_: Any) -> None:
        while controller:
            await controller.pop().stop()
