"""``durable-agents-operator`` (``python -m durable_agents_controllers``): run the operator.

The configuration is read once, here (see :mod:`durable_agents_controllers.config` and the
table of docs/operate/configuration.md); a malformed or unknown ``DURABLE_AGENTS_*`` variable
stops start-up with exit code 2 and a message naming it. Each controller module registers its
handlers on one registry and receives the manager explicitly.
"""

from __future__ import annotations

import logging
import signal
import sys
import tracemalloc
from types import FrameType

import kopf

from durable_agents.shell.observability.json_logs import configure_logging
from durable_agents_controllers import (
    actionrecord,
    agentpolicy,
    agentrun,
    agentschedule,
    health,
    keyguard,
    regionfailover,
    retention,
    webhook,
)
from durable_agents_controllers.config import ConfigError, OperatorConfig
from durable_agents_controllers.manager import Manager


def _memory_report(_signum: int, _frame: FrameType | None) -> None:
    """SIGUSR1: log allocator statistics (and, with TRACEMALLOC=1, where live memory came from)."""
    sys._debugmallocstats()  # pymalloc arenas: live vs. free-but-kept
    if tracemalloc.is_tracing():
        snapshot = tracemalloc.take_snapshot()
        stats = snapshot.statistics("traceback")
        total = sum(stat.size for stat in stats)
        logging.getLogger("durable_agents.memory").warning("traced live memory: %.1f MiB", total / 2**20)
        for stat in stats[:15]:
            logging.getLogger("durable_agents.memory").warning(
                "%.1f KiB in %d blocks:\n%s",
                stat.size / 1024,
                stat.count,
                "\n".join(stat.traceback.format()[-12:]),
            )


def registry_for(manager: Manager) -> kopf.OperatorRegistry:
    """Every handler of the operator, on one registry, each given the manager. The order is the
    order the manager makes and starts their parts in (and stops them in reverse): the run worker
    first, the dispatcher, failovers, the resealer, retention, the probes."""
    registry = kopf.OperatorRegistry()
    # The same credentials as the kubernetes client the shell uses (in-cluster or KUBECONFIG).
    kopf.on.login(registry=registry)(kopf.login_via_client)
    manager.register(registry)
    controllers = (
        agentrun,
        actionrecord,
        agentpolicy,
        regionfailover,
        agentschedule,
        webhook,
        keyguard,
        retention,
        health,
    )
    for controller in controllers:
        controller.register(registry, manager)
    return registry


def main() -> None:
    try:
        config = OperatorConfig.from_env()
    except ConfigError as err:
        print(f"durable-agents-operator: configuration: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if config.tracemalloc:
        tracemalloc.start(6)
    signal.signal(signal.SIGUSR1, _memory_report)
    configure_logging(config.log_level, config.log_format)  # DURABLE_AGENTS_LOG_FORMAT: text or json
    # kopf logs every handler call at INFO; our own log says what matters per run.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    manager = Manager(config)
    kopf.run(
        registry=registry_for(manager),
        standalone=True,
        clusterwide=config.namespace is None,
        namespaces=[config.namespace] if config.namespace else (),
    )


if __name__ == "__main__":
    main()
