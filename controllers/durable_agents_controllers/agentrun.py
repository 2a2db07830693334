"""AgentRun: the run worker and the parts that watch runs with it, wired to the manager's one
AgentRun list-and-watch (:class:`~durable_agents.shell.intake.reflector.RunReflector`).

AgentRun events do not come through kopf (the reflector's docstring says why): every consumer
subscribes to the manager's reflector here or in its own controller (the dispatcher: ``actionrecord``;
retention: ``retention``). This module makes, in order: the run worker (it takes every run event,
and its shards' runs are its work), the census (gauges over the waiting runs this replica owns),
and, with run workers in this process, the stuck check and the notifier (a policy's
``spec.notifications``). The admission webhook serves AgentRuns too
(``webhook``), from the manager's keyring and policy cache: it never touches the worker.
"""

from __future__ import annotations

import kopf

from durable_agents.shell.observability.census import RunCensus
from durable_agents.shell.observability.notifications import Notifier, NotifyConfig
from durable_agents.shell.runs.stuck import StuckCheck, StuckConfig
from durable_agents.shell.runs.worker import RunWorker, WorkerConfig
from durable_agents_controllers.manager import Manager


def worker_config(manager: Manager) -> WorkerConfig:
    config = manager.config
    return WorkerConfig(
        identity=config.identity,
        lease_duration=config.lease_duration,
        concurrency=config.workers,
        operator_version=config.operator_version,
        all_events=config.all_events,
        max_transitions_per_unit=config.transitions_per_write,
        region=config.region,
        lease_namespace=config.lease_namespace,
        shards=config.shards,
        keyring=manager.keyring,
        first_claims=manager.dispatch.first_claims,
    )


def build(manager: Manager) -> None:
    config, runs = manager.config, manager.runs
    worker = RunWorker(manager.kube, worker_config(manager), manager.policies)
    worker.controls.dispatcher = lambda: manager.dispatcher  # reconcile RUN: ask now
    manager.worker = worker
    runs.subscribe(worker.observe)
    manager.runnables.add(worker)
    shards = worker.shard_leases
    census = RunCensus(
        lambda namespace, name: shards.hold_for(namespace, name) is not None, config.region, manager.keyring
    )
    runs.subscribe(census.observe)
    manager.runnables.add(census)
    if config.workers > 0:  # subscribed before the reflector starts: it judges the first list's runs
        stuck = StuckCheck(
            manager.kube,
            holds=worker.ownership.holds,
            region=config.region,
            keyring=manager.keyring,
            policies=manager.policies,
            events=worker.events,
            config=StuckConfig(
                interval=config.stuck_check_seconds,
                threshold=config.stuck_after,
                bounds=config.stuck_bounds,
                unowned_after=config.stuck_unowned_after,
                unanswered_after=config.stuck_unanswered_after,
                lease_namespace=config.lease_namespace,
            ),
        )
        manager.stuck = stuck
        runs.subscribe(stuck.observe_run)
        manager.runnables.add(stuck)
        notifier = Notifier(
            manager.kube,
            manager.policies,
            holds=worker.ownership.holds,
            region=config.region,
            keyring=manager.keyring,
            events=worker.events,
            config=NotifyConfig(
                timeout=config.notify_timeout,
                backoff=config.notify_backoff,
                backoff_cap=config.notify_backoff_max,
                give_up_after=config.notify_give_up,
            ),
        )
        runs.subscribe(notifier.observe)  # off the commit path: it stores and wakes, never awaits
        manager.runnables.add(notifier)


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    del registry  # no kopf handler: the manager's reflector is this kind's intake
    manager.builds.append(build)
