"""``python -m durable_agents_controllers``: run the operator (kopf, standalone, all namespaces).

Environment: KUBECONFIG (outside a Pod), DURABLE_AGENTS_NAMESPACE (watch one namespace instead of
all), DURABLE_AGENTS_LEASE_DURATION, DURABLE_AGENTS_WORKERS, DURABLE_AGENTS_METRICS_PORT,
DURABLE_AGENTS_IDENTITY, DURABLE_AGENTS_DISPATCH_TIMEOUT.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tracemalloc
from types import FrameType

import kopf

from durable_agents_controllers import actionrecord, agentpolicy, agentrun, runtime, webhook


def _memory_report(_signum: int, _frame: FrameType | None) -> None:
    """SIGUSR1 with DURABLE_AGENTS_TRACEMALLOC=1: log where the live memory was allocated."""
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


def main() -> None:
    if os.environ.get("DURABLE_AGENTS_TRACEMALLOC") == "1":
        tracemalloc.start(6)
    signal.signal(signal.SIGUSR1, _memory_report)
    logging.basicConfig(
        level=os.environ.get("DURABLE_AGENTS_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # kopf logs every handler call at INFO; our own log says what matters per run.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    namespace = os.environ.get("DURABLE_AGENTS_NAMESPACE")
    kopf.run(
        standalone=True,
        clusterwide=namespace is None,
        namespaces=[namespace] if namespace else (),
    )


__all__ = ["actionrecord", "agentpolicy", "agentrun", "main", "runtime", "webhook"]

if __name__ == "__main__":
    main()
