"""``/healthz`` and ``/readyz`` on ``HEALTH_PORT`` (off unless configured; the chart turns it on).

``/healthz`` is answered on the operator's event loop, so a loop that is stuck fails the liveness
probe. ``/readyz`` answers 200 only once the admission webhook accepts connections and the AgentRun
cache has synced: a Service sends the API server's admission reviews only to replicas that can
answer them, and a rolling upgrade waits for the new replica before stopping an old one.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp.web
import kopf

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


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    port = manager.config.health_port
    if port is None:
        return
    runners: list[aiohttp.web.AppRunner] = []

    @kopf.on.startup(registry=registry)
    async def serve_health(**_: Any) -> None:
        runner = aiohttp.web.AppRunner(app_for(manager), handle_signals=False, access_log=None)
        await runner.setup()
        await aiohttp.web.TCPSite(
            runner, None, port
        ).start()  # every interface: the kubelet probes the Pod's IP
        runners.append(runner)
        log.info("health endpoints on port %s (/healthz, /readyz)", port)

    @kopf.on.cleanup(registry=registry)
    async def stop_health(**_: Any) -> None:
        for runner in runners:
            await runner.cleanup()
