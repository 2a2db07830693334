"""``/healthz`` and ``/readyz`` on ``HEALTH_PORT`` (off unless configured; the chart turns it on).

``/healthz`` is answered on the operator's event loop, so a loop that is stuck fails the liveness
probe. ``/readyz`` answers 200 only once the admission webhook accepts connections and the AgentRun
cache has synced: a Service sends the API server's admission reviews only to replicas that can
answer them, and a rolling upgrade waits for the new replica before stopping an old one.
"""

from __future__ import annotations

import logging

import aiohttp.web
import kopf

from durable_agents.shell.ground.lifecycle import Background, forever
from durable_agents_controllers.manager import Manager

log = logging.getLogger(__name__)


def app_for(manager: Manager) -> aiohttp.web.Application:
    async def healthz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text="ok\n")

    async def readyz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        waiting = manager.not_ready()
        if waiting:
            return aiohttp.web.Response(status=503, text="not ready: " + "; ".join(waiting) + "\n")
        return aiohttp.web.Response(text="ready\n")

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.get("/healthz", healthz), aiohttp.web.get("/readyz", readyz)])
    return app


class HealthServer(Background):
    """The probes' HTTP server, one of the manager's parts."""

    def __init__(self, manager: Manager, port: int) -> None:
        self.manager, self.port = manager, port

    async def run(self) -> None:
        runner = aiohttp.web.AppRunner(app_for(self.manager), handle_signals=False, access_log=None)
        await runner.setup()
        try:
            # Every interface: the kubelet probes the Pod's IP.
            await aiohttp.web.TCPSite(runner, None, self.port).start()
            log.info("health endpoints on port %s (/healthz, /readyz)", self.port)
            await forever()
        finally:
            await runner.cleanup()


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    del registry  # served by one of the manager's parts
    port = manager.config.health_port
    if port is not None:
        manager.builds.append(lambda manager: manager.runnables.add(HealthServer(manager, port)))
