"""``python -m durable_agents_controllers``: run the operator (kopf, standalone, all namespaces).

Environment: KUBECONFIG (outside a Pod), DURABLE_AGENTS_NAMESPACE (watch one namespace instead of
all), DURABLE_AGENTS_LEASE_DURATION, DURABLE_AGENTS_WORKERS, DURABLE_AGENTS_METRICS_PORT,
DURABLE_AGENTS_IDENTITY, DURABLE_AGENTS_DISPATCH_TIMEOUT.
"""

from __future__ import annotations

import logging
import os

import kopf

from durable_agents_controllers import actionrecord, agentpolicy, agentrun, runtime, webhook


def main() -> None:
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
