"""The manager (controller-runtime's Manager): the process's shared intake and caches, and the list
of its long-running parts, each started and stopped the same way.

It owns what every controller shares: the Kubernetes client, the one keyring (the configuration's),
the one AgentPolicy cache, and the one AgentRun list-and-watch every consumer subscribes to (the
run worker, the dispatcher, retention, the stuck check, the census). Each controller module
(one per kind) registers a ``build`` step; at kopf start-up the manager runs them in registration
order (they make their parts, subscribe them and add them to :attr:`Manager.runnables`), adds the
AgentRun reflector last, once every subscriber is there, and starts the list; clean-up stops it
in reverse order. Handlers receive the manager explicitly, never import it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import kopf
from prometheus_client import start_http_server

from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground.faults import install_faults
from durable_agents.shell.ground.kube import Kube, load_api_client
from durable_agents.shell.ground.lifecycle import Runnables
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.intake.reflector import RunReflector
from durable_agents.shell.ledger.actions import FirstClaims
from durable_agents.shell.ledger.dispatch_config import DispatcherConfig
from durable_agents.shell.observability.commit_metrics import initialise as initialise_metrics
from durable_agents.shell.observability.run_traces import configure as configure_run_traces
from durable_agents_controllers.config import OperatorConfig

if TYPE_CHECKING:
    from durable_agents.shell.ledger.dispatcher import Dispatcher
    from durable_agents.shell.runs.stuck import StuckCheck
    from durable_agents.shell.runs.worker import RunWorker

log = logging.getLogger(__name__)

Build = Callable[["Manager"], None]


class Manager:
    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.keyring: Keyring = config.keyring  # the process's one keyring: stamps, seals, verifies
        self._kube: Kube | None = None
        self._policies: PolicyCache | None = None
        self._runs: RunReflector | None = None  # the AgentRun intake (made at start-up)
        self.runnables = Runnables()  # started in order, stopped in reverse order
        # Each controller's parts, made at start-up in registration order (after the start hooks).
        self.builds: list[Build] = []
        # Set by the controllers' builds: the parts other handlers hand events to.
        self._worker: RunWorker | None = None
        self.dispatcher: Dispatcher | None = None  # None: this process sends nothing (DISPATCHER=off)
        self.stuck: StuckCheck | None = None  # the Stuck condition of the runs this replica owns
        self.dispatch = self._dispatching()  # the dispatcher's configuration, its first claims
        self._metrics_serving = False
        # Run at start-up, in order, before any part is made (the admission webhook's set-up).
        self.start_hooks: list[Callable[[kopf.OperatorSettings], Awaitable[None]]] = []
        self.webhook_serving = asyncio.Event()  # set once the admission webhook accepts connections
        self.started = asyncio.Event()  # set once every part is running

    def not_ready(self) -> list[str]:
        """What this process still waits for before it may receive work (the readiness probe)."""
        waiting = []
        if not self.started.is_set():
            waiting.append("starting")
        if self.config.webhook_port is not None and not self.webhook_serving.is_set():
            waiting.append("the admission webhook is not serving yet")
        if self._runs is not None and not self._runs.synced.is_set():
            waiting.append("the AgentRun cache has not synced")
        return waiting

    # --- what the manager shares ----------------------------------------------------------

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = Kube(load_api_client())
        return self._kube

    @property
    def policies(self) -> PolicyCache:
        """The process's one AgentPolicy cache (fed by the AgentPolicy watch)."""
        if self._policies is None:
            self._policies = PolicyCache(self.kube, self.keyring)
        return self._policies

    @property
    def runs(self) -> RunReflector:
        """The process's one AgentRun list-and-watch: subscribe to it in a build step."""
        if self._runs is None:
            raise RuntimeError("the AgentRun reflector is made at start-up (kopf startup has not run)")
        return self._runs

    @property
    def worker(self) -> RunWorker:
        if self._worker is None:
            raise RuntimeError("the run worker is not started (kopf startup has not run)")
        return self._worker

    @worker.setter
    def worker(self, worker: RunWorker) -> None:
        self._worker = worker

    def _dispatching(self) -> DispatcherConfig:
        """The dispatcher's configuration; with the dispatcher in this process and first claims on,
        the first claims the worker creates intents under (one object, shared by both)."""
        config = self.config
        dispatching = DispatcherConfig(
            identity=config.identity,
            timeout=config.dispatch_timeout,
            keyring=self.keyring,
            all_events=config.all_events,
            region=config.region,
        )
        if config.dispatcher and config.first_claim:  # intents created under our dispatcher's first claim
            dispatching = replace(
                dispatching, first_claims=FirstClaims(config.identity, dispatching.claim_ttl)
            )
        return dispatching

    # --- lifecycle ------------------------------------------------------------------------

    def register(self, registry: kopf.OperatorRegistry) -> None:
        kopf.on.startup(registry=registry)(self.start)
        kopf.on.cleanup(registry=registry)(self.stop)

    def _settle(self, settings: kopf.OperatorSettings) -> None:
        config = self.config
        # kopf is the event source and scheduler, not the commit path: no kopf posting, and no
        # change-detecting handlers, so kopf writes no annotations or finalizers on our records.
        settings.posting.enabled = False
        settings.scanning.disabled = True
        settings.watching.server_timeout = config.watch_timeout
        # List in pages: a cold start with 10,000 runs never holds them all at once (memory peak).
        settings.watching.chunk_size = config.list_chunk
        # kopf keeps a task per object until it has been idle this long, and with it the last
        # body: our handlers only enqueue, so a short idle time keeps a cold start's peak low.
        settings.queueing.idle_timeout = 1.0
        # kopf retries a failed start-up (say, the API server away for a moment): what is bound
        # once must not be bound again, or every retry fails on its port and the Pod never readies.
        if config.metrics_port is not None and not self._metrics_serving:
            start_http_server(config.metrics_port)
            self._metrics_serving = True
        initialise_metrics()  # labelled series with known label values exist, at 0, from the start
        # Traces: off unless OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT say otherwise.
        configure_run_traces(config.identity, config.shards)
        install_faults(config.faults)

    async def start(self, settings: kopf.OperatorSettings, **_: object) -> None:
        config = self.config
        self._settle(settings)
        await self.runnables.stop()  # a retried start-up starts afresh
        for hook in self.start_hooks:  # they may add parts too (the webhook's certificate keeper)
            await hook(settings)
        self._runs = RunReflector(
            self.kube,
            namespace=config.namespace,
            page_size=config.list_chunk,
            watch_timeout=config.watch_timeout,
        )
        for build in self.builds:
            build(self)
        self.runnables.add(self._runs)  # last: every consumer has subscribed to the first list
        self.runnables.start()
        self.started.set()
        log.info("durable-agents worker %s started (lease %ss)", config.identity, config.lease_duration)

    async def stop(self, **_: object) -> None:
        await self.runnables.stop()
        self._runs = None
        self._worker = None
        self.dispatcher = None
        self.stuck = None
        if self._kube is not None:
            self._kube.close()
            self._kube = None
