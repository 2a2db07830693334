"""RegionFailover: the requests addressed to this region, carried out by its leader
(:mod:`durable_agents.shell.runs.failover`, with its own RegionFailover list-and-watch). Their
admission (stamps, authority) is the webhook's (``webhook``). Only a process with run workers
carries failovers out: it adopts runs for its worker.
"""

from __future__ import annotations

import kopf

from durable_agents.shell.runs.failover import Failovers
from durable_agents_controllers.manager import Manager


def build(manager: Manager) -> None:
    if manager.config.workers == 0:
        return
    worker = manager.worker
    failovers = Failovers(
        manager.kube,
        worker.region,
        manager.keyring,
        settings_for=worker.settings_for,
        region_of=worker.region_of,
        dispatcher=lambda: manager.dispatcher,
        adopted=worker.enqueue,
    )
    manager.runnables.add(failovers)


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    del registry  # its watch is its own reflector's (a kind kopf does not need to see)
    manager.builds.append(build)
