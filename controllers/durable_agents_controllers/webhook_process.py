"""The admission webhook's own process (``python -m durable_agents_controllers.webhook_process``),
started and supervised by the operator (:mod:`.webhook_supervisor`).

Its own interpreter: nothing the operator's worker does (long C calls over a large run that hold
the operator's interpreter lock) delays an answer. It reads the operator's configuration from the
same environment (the keyring: it stamps with the keys the engine verifies; the Kubernetes
credentials; the region), serves the certificate files the operator writes (``--certs``: a
renewal rewrites them and kopf's server here restarts on them), and keeps its own read-only view of
the policies (an AgentPolicy and a ClusterAgentPolicy list-and-watch feeding its own
:class:`~durable_agents.shell.intake.policies.PolicyCache`: the reviews never release or enqueue a
run, so nothing here belongs to the operator's). It listens only once both lists are in.

kopf dispatches the reviews to the handlers, as in an operator, but nothing else of kopf runs
here: the resources served are known (no discovery), and the handlers keep no memo.

It ends on SIGTERM (its connections closed, exit 0), and when its parent is gone: the kernel's
parent-death signal (``PR_SET_PDEATHSIG``), and a check of its parent every second besides (the
signal is Linux's; a parent that died before it was asked for is caught by the check).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import ctypes
import functools
import logging
import os
import signal
import ssl
import time
from pathlib import Path
from typing import Any

import kopf
from kopf._cogs.structs import references
from kopf._cogs.structs.ephemera import AnyMemo
from kopf._core.engines.admission import MemoGetter, serve_admission_request
from kopf._core.engines.indexing import OperatorIndexers

from durable_agents.api.v1alpha1 import AGENT_SCHEDULE_PLURAL, FAILOVER_PLURAL, GROUP, VERSION
from durable_agents.shell.admission.definitions import PLURALS as DEFINITION_PLURALS
from durable_agents.shell.admission.policies import CLUSTER_POLICY_PLURAL
from durable_agents.shell.intake.policies import CLUSTER
from durable_agents.shell.intake.reflector import RunReflector
from durable_agents.shell.observability.json_logs import configure_logging
from durable_agents_controllers import admission_patch, agentpolicy, agentschedule, keyguard, webhook
from durable_agents_controllers.config import ConfigError, OperatorConfig
from durable_agents_controllers.manager import Manager

log = logging.getLogger("durable_agents_controllers.webhook_process")  # also when run as __main__
PR_SET_PDEATHSIG = 1
PARENT_CHECK = 1.0  # seconds between checks that the operator is still this process's parent
SSL_RETRIES = 20  # a renewal read halfway (the operator replaces the files one by one): read again
# What the webhook configurations send here: (group, version, plural, namespaced).
SERVED = (
    (GROUP, VERSION, "agentruns", True),
    (GROUP, VERSION, FAILOVER_PLURAL, True),
    (GROUP, VERSION, "agentpolicies", True),
    (GROUP, VERSION, CLUSTER_POLICY_PLURAL, False),
    ("", "v1", "secrets", True),  # keyring Secrets (keyguard)
    *((GROUP, VERSION, plural, True) for plural in DEFINITION_PLURALS.values()),  # Agents, ModelConfigs
    (GROUP, VERSION, AGENT_SCHEDULE_PLURAL, True),
)


def die_with_parent(parent: int) -> None:
    """Ask the kernel for SIGTERM when the parent dies; exit now if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        raise SystemExit("durable-agents webhook: the operator that started this process is gone")


class _NoMemos(MemoGetter):
    """kopf's memo store for admission handlers, keeping nothing: our handlers use no memo."""

    async def recall_memo(self, raw_body: Any, *, memobase: Any = None, ephemeral: bool = False) -> Any:
        del raw_body, ephemeral
        return copy.copy(memobase)  # what kopf gives a new object


class ProcessWebhookServer(webhook.LimitedWebhookServer):
    """The limited server; its certificate read again while a renewal is being written."""

    def _build_ssl(self) -> tuple[bytes | None, ssl.SSLContext | None]:
        for _ in range(SSL_RETRIES):
            try:
                return super()._build_ssl()
            except ssl.SSLError as err:  # a new key beside the old certificate, for a moment
                log.info("webhook: the certificate files are being replaced (%s); reading again", err)
                time.sleep(0.1)
        return super()._build_ssl()


def admission_metrics() -> webhook.Observe | None:
    """The review latency histogram, when the operator collects this process's metrics."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    from prometheus_client import Histogram  # in multiprocess mode: the variable is set

    seconds = Histogram(
        "durable_agents_admission_review_seconds",
        "Seconds the admission webhook process took to answer a review, by resource and answer",
        ["allowed", "resource"],
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    )

    def observe(resource: str, allowed: bool, took: float) -> None:
        seconds.labels(str(allowed).lower(), resource).observe(took)

    return observe


def policy_watches(manager: Manager) -> list[RunReflector]:
    """This process's AgentPolicy and ClusterAgentPolicy list-and-watches into its policy cache."""
    config, policies = manager.config, manager.policies

    def namespaced(event_type: str | None, body: dict[str, Any]) -> None:
        policies.observe(event_type, body)

    def cluster(event_type: str | None, body: dict[str, Any]) -> None:
        body["metadata"] = {**dict(body.get("metadata") or {}), "namespace": CLUSTER}
        policies.observe(event_type, body)

    common: dict[str, Any] = {"page_size": config.list_chunk, "watch_timeout": config.watch_timeout}
    return [
        RunReflector(
            manager.kube,
            namespaced,
            namespace=config.namespace,
            plural="agentpolicies",
            **common,
        ),
        RunReflector(manager.kube, cluster, plural=CLUSTER_POLICY_PLURAL, **common),
    ]


def admission_function(manager: Manager) -> Any:
    """kopf's review dispatch, bound to a registry of the admission handlers only."""
    registry = kopf.OperatorRegistry()
    webhook.register_handlers(registry, manager)
    agentpolicy.register_admission(registry, manager)
    keyguard.register_admission(registry, manager)
    agentschedule.register_admission(registry, manager)
    insights = references.Insights()
    insights.webhook_resources.update(
        references.Resource(group, version, plural, namespaced=namespaced)
        for group, version, plural, namespaced in SERVED
    )
    return functools.partial(
        serve_admission_request,
        settings=kopf.OperatorSettings(),
        registry=registry,
        insights=insights,
        memories=_NoMemos(),
        memobase=AnyMemo(kopf.Memo()),
        indices=OperatorIndexers().indices,
    )


async def serve(config: OperatorConfig, certs: Path, parent: int) -> None:
    manager = Manager(config)  # its client, keyring and policy cache; none of its parts
    watches = policy_watches(manager)
    for watch in watches:
        watch.start()
    for watch in watches:
        await watch.synced.wait()
    server = ProcessWebhookServer(
        addr=config.webhook_host,
        port=config.webhook_port,
        certfile=certs / "tls.crt",
        pkeyfile=certs / "tls.key",
        cafile=certs / "ca.crt",
    )
    server.observe = admission_metrics()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def listen() -> None:
        async for _ in server(admission_function(manager)):
            log.info("webhook process %d listening on port %s", os.getpid(), config.webhook_port)

    async def orphaned() -> None:
        while os.getppid() == parent:  # noqa: ASYNC110 (nothing to wait on: the kernel says nothing)
            await asyncio.sleep(PARENT_CHECK)
        log.warning("webhook process: the operator (process %d) is gone; stopping", parent)

    tasks = [asyncio.create_task(listen()), asyncio.create_task(orphaned()), asyncio.create_task(stop.wait())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # the server's failure, if it failed: logged, and the process exits 1
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # the server closes its connections
        for watch in watches:
            await watch.stop()
        manager.kube.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="durable-agents-webhook", description=__doc__.split("\n")[0])
    parser.add_argument("--parent", type=int, required=True, help="the operator's process ID")
    parser.add_argument("--certs", type=Path, required=True, help="directory of tls.crt, tls.key, ca.crt")
    args = parser.parse_args()
    die_with_parent(args.parent)
    try:
        config = OperatorConfig.from_env()
    except ConfigError as err:
        raise SystemExit(f"durable-agents webhook: configuration: {err}") from None
    if config.webhook_port is None:
        raise SystemExit("durable-agents webhook: DURABLE_AGENTS_WEBHOOK_PORT is not set")
    configure_logging(config.log_level, config.log_format)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # One access line per review only at debug level: formatting it was 6 % of this process's CPU
    # (issue 38), and the API server's audit log records every request already.
    admission_patch.install()
    debugging = logging.getLogger().isEnabledFor(logging.DEBUG)
    logging.getLogger("aiohttp.access").setLevel(logging.DEBUG if debugging else logging.WARNING)
    asyncio.run(serve(config, args.certs, args.parent))
    log.info("webhook process %d stopped", os.getpid())


if __name__ == "__main__":
    main()
