"""The retention controller (:mod:`durable_agents.shell.runs.retention`): a subscriber of the
manager's AgentRun reflector, started and stopped with the manager's other parts. A process
without run workers (``WORKERS=0``: a webhook or dispatcher only) runs none; several operator
processes each run one, and their writes are idempotent (each carries the read resourceVersion, a
record is created once by name).
"""

from __future__ import annotations

import kopf

from durable_agents.shell.runs.retention import RetentionConfig, RetentionController
from durable_agents_controllers.manager import Manager


def build(manager: Manager) -> None:
    config = manager.config
    if config.workers == 0:
        return
    retention = RetentionController(
        manager.kube, manager.keyring, config.identity, RetentionConfig(), manager.policies
    )
    manager.runs.subscribe(retention.observe)
    manager.runnables.add(retention)


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    del registry  # no kopf handler: its runs come from the manager's reflector
    manager.builds.append(build)
