"""The manager: builds the operator's parts from its configuration at kopf start-up, stops them
at clean-up, and hands them to the handlers (which receive it explicitly, never import it)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import kopf
from prometheus_client import start_http_server

from durable_agents.shell.ground.faults import install_faults
from durable_agents.shell.ground.kube import Kube, load_api_client
from durable_agents.shell.intake.reflector import RunReflector
from durable_agents.shell.keys.resealer import ResealConfig, Resealer
from durable_agents.shell.ledger.actions import FirstClaims
from durable_agents.shell.ledger.dispatcher import Dispatcher, DispatcherConfig
from durable_agents.shell.observability.census import RunCensus
from durable_agents.shell.observability.commit_metrics import initialise as initialise_metrics
from durable_agents.shell.observability.run_traces import configure as configure_run_traces
from durable_agents.shell.runs.failover import Failovers
from durable_agents.shell.runs.stuck import StuckCheck, StuckConfig
from durable_agents.shell.runs.worker import RunWorker, WorkerConfig
from durable_agents_controllers.config import OperatorConfig

log = logging.getLogger(__name__)


class Manager:
    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self._kube: Kube | None = None
        self._worker: RunWorker | None = None
        self._dispatcher: Dispatcher | None = None
        self._reflector: RunReflector | None = None
        self._resealer: Resealer | None = None
        self._failovers: Failovers | None = None
        self.stuck: StuckCheck | None = None  # the Stuck condition of the runs this replica owns
        self._census: RunCensus | None = None  # the gauges over this replica's waiting runs
        self._metrics_serving = False
        # Run at start-up, in order, before the worker starts (the admission webhook's set-up).
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
        if self._reflector is not None and not self._reflector.synced.is_set():
            waiting.append("the AgentRun cache has not synced")
        return waiting

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = Kube(load_api_client())
        return self._kube

    @property
    def worker(self) -> RunWorker:
        if self._worker is None:
            raise RuntimeError("the run worker is not started (kopf startup has not run)")
        return self._worker

    def _observe_run(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A run's watch event: for the worker, and for the dispatcher (a person's reconciliation)."""
        assert self._worker is not None
        self._worker.observe(event_type, body)
        if self._census is not None:
            self._census.observe(event_type, body)
        if self._dispatcher is not None:
            self._dispatcher.observe_run(event_type, body)
        if self.stuck is not None:
            self.stuck.observe_run(event_type, body)

    @property
    def dispatcher(self) -> Dispatcher | None:
        """The dispatcher, or None when this process runs without one (DISPATCHER=off)."""
        return self._dispatcher

    def register(self, registry: kopf.OperatorRegistry) -> None:
        kopf.on.startup(registry=registry)(self.start)
        kopf.on.cleanup(registry=registry)(self.stop)

    async def start(self, settings: kopf.OperatorSettings, **_: object) -> None:
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
        for hook in self.start_hooks:
            await hook(settings)
        dispatching = DispatcherConfig(
            identity=config.identity,
            timeout=config.dispatch_timeout,
            keyring=config.keyring,
            all_events=config.all_events,
            region=config.region,
        )
        if config.dispatcher and config.first_claim:  # intents created under our dispatcher's first claim
            dispatching = replace(
                dispatching, first_claims=FirstClaims(config.identity, dispatching.claim_ttl)
            )
        self._worker = RunWorker(
            self.kube,
            WorkerConfig(
                identity=config.identity,
                lease_duration=config.lease_duration,
                concurrency=config.workers,
                operator_version=config.operator_version,
                all_events=config.all_events,
                max_transitions_per_unit=config.transitions_per_write,
                region=config.region,
                lease_namespace=config.lease_namespace,
                shards=config.shards,
                keyring=config.keyring,
                first_claims=dispatching.first_claims,
            ),
        )
        self._worker.start()
        shards = self._worker.shard_leases
        self._census = RunCensus(
            lambda namespace, name: shards.hold_for(namespace, name) is not None,
            config.region,
            config.keyring,
        )
        self._census.start()
        if config.workers > 0:  # before the reflector: it judges the runs the first list delivers
            stuck = StuckConfig(interval=config.stuck_check_seconds, threshold=config.stuck_after)
            self.stuck = StuckCheck(self.kube, self._worker, stuck)
            self.stuck.start()
        self._reflector = RunReflector(
            self.kube,
            self._observe_run,
            namespace=config.namespace,
            page_size=config.list_chunk,
            watch_timeout=config.watch_timeout,
        )
        self._reflector.start()
        # Dispatchers may run as a separate deployment: "off" leaves intents to another process.
        if config.dispatcher:
            self._dispatcher = Dispatcher(self.kube, dispatching)
            self._dispatcher.start()
        self._worker.controls.dispatcher = lambda: self._dispatcher  # reconcile RUN: ask now
        # Explicit region failovers to this region: carried out by the region's leader only.
        if config.workers > 0:
            worker = self._worker
            self._failovers = Failovers(
                self.kube,
                worker.region,
                config.keyring,
                settings_for=worker.settings_for,
                region_of=worker.region_of,
                dispatcher=lambda: self._dispatcher,
                adopted=worker.enqueue,
            )
            self._failovers.start()
        # Key rotation: runs still on an older key are re-sealed under the active one, gently.
        self._resealer = Resealer(
            self.kube,
            config.keyring,
            ResealConfig(
                interval=config.reseal_interval,
                writes_per_second=config.reseal_writes_per_second,
                namespace=config.namespace,
                page_size=config.list_chunk,
            ),
        )
        self._resealer.start()
        self.started.set()
        log.info("durable-agents worker %s started (lease %ss)", config.identity, config.lease_duration)

    async def stop(self, **_: object) -> None:
        if self.stuck is not None:
            await self.stuck.stop()
            self.stuck = None
        if self._failovers is not None:
            await self._failovers.stop()
            self._failovers = None
        if self._resealer is not None:
            await self._resealer.stop()
            self._resealer = None
        if self._reflector is not None:
            await self._reflector.stop()
            self._reflector = None
        if self._dispatcher is not None:
            await self._dispatcher.stop()
            self._dispatcher = None
        if self._census is not None:
            await self._census.stop()
            self._census = None
        if self._worker is not None:
            await self._worker.stop()
            self._worker = None
        if self._kube is not None:
            self._kube.close()
            self._kube = None
