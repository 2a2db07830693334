"""The one RunWorker of this operator process, created at kopf startup and stopped at cleanup."""

from __future__ import annotations

import asyncio
import logging
import os

import kopf
from prometheus_client import start_http_server

from durable_agents.shell.admission import install_webhooks
from durable_agents.shell.dispatcher import Dispatcher, DispatcherConfig
from durable_agents.shell.kube import Kube, load_api_client
from durable_agents.shell.reflector import RunReflector
from durable_agents.shell.worker import RunWorker, WorkerConfig

log = logging.getLogger(__name__)
_worker: RunWorker | None = None
_dispatcher: Dispatcher | None = None
_reflector: RunReflector | None = None
_background: set[asyncio.Task[None]] = set()


def worker() -> RunWorker:
    if _worker is None:
        raise RuntimeError("the run worker is not started (kopf startup has not run)")
    return _worker


def dispatcher() -> Dispatcher | None:
    """The dispatcher, or None when this process runs without one (DURABLE_AGENTS_DISPATCHER=off)."""
    return _dispatcher


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, **_: object) -> None:
    global _worker, _dispatcher, _reflector
    # kopf is the event source and scheduler, not the commit path: no kopf posting, and no
    # change-detecting handlers, so kopf writes no annotations or finalizers on our records.
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.watching.server_timeout = int(os.environ.get("DURABLE_AGENTS_WATCH_TIMEOUT", "300"))
    # List in pages: a cold start with 10,000 runs never holds them all at once (memory peak).
    chunk = int(os.environ.get("DURABLE_AGENTS_LIST_CHUNK", "200"))
    settings.watching.chunk_size = chunk
    # kopf keeps a task per object until it has been idle this long, and with it the last body:
    # our handlers only enqueue, so a short idle time keeps a cold start's memory peak low.
    settings.queueing.idle_timeout = 1.0
    port = os.environ.get("DURABLE_AGENTS_METRICS_PORT")
    if port:
        start_http_server(int(port))
    config = WorkerConfig.from_env()
    kube = Kube(load_api_client())
    from durable_agents_controllers import webhook

    configurations = webhook.configure(settings, kube, os.environ.get("DURABLE_AGENTS_NAMESPACE"))
    if configurations is not None:
        # Installed before the server listens: until then every AgentRun write fails closed.
        await install_webhooks(kube, *configurations)
        _background.add(asyncio.create_task(webhook.announce_when_serving(settings)))
    _worker = RunWorker(kube, config)
    _worker.start()
    _reflector = RunReflector(
        kube,
        _worker.observe,
        namespace=os.environ.get("DURABLE_AGENTS_NAMESPACE"),
        page_size=chunk,
        watch_timeout=settings.watching.server_timeout,
    )
    _reflector.start()
    # Dispatchers may run as a separate deployment: "off" leaves intents to another process.
    if os.environ.get("DURABLE_AGENTS_DISPATCHER", "on") != "off":
        timeout = float(os.environ.get("DURABLE_AGENTS_DISPATCH_TIMEOUT", "5"))
        _dispatcher = Dispatcher(kube, DispatcherConfig(identity=config.identity, timeout=timeout))
        _dispatcher.start()
    log.info("durable-agents worker %s started (lease %ss)", config.identity, config.lease_duration)


@kopf.on.cleanup()
async def stop(**_: object) -> None:
    global _worker, _dispatcher, _reflector
    if _reflector is not None:
        await _reflector.stop()
        _reflector = None
    if _dispatcher is not None:
        await _dispatcher.stop()
        _dispatcher = None
    if _worker is not None:
        await _worker.stop()
        _worker.kube.close()
        _worker = None
