"""The operator's side of the webhook process: start it, restart it if it dies, stop it on the way
out, and say whether it serves (the readiness probe waits for it).

The admission webhook answers from a process of its own (:mod:`.webhook_process`), as
cert-manager's webhook is its own Deployment: the run worker's work on a run of the largest
admitted size is long C calls (pydantic, canonical JSON) that hold the operator's interpreter lock
for seconds, and an answer that waited for them could miss the API server's timeout
(failurePolicy Fail refuses the request then). It is a child of the operator, in the same
container, so every way the operator runs (the local plane of the tests and the demo, the chart,
kind) runs it the same way, with the same configuration (its environment), keys and credentials.

- It dies with the operator: SIGTERM of the operator stops it (SIGTERM, then SIGKILL after
  :data:`STOP_WITHIN`); SIGKILL of the operator kills it (``PR_SET_PDEATHSIG``, and it watches its
  parent besides), so no orphan keeps serving a port a new operator binds.
- Died on its own: logged with its exit status, not ready, started again (backoff up to
  :data:`MAX_BACKOFF`).
- Ready: once it accepts connections (it listens only once its policy caches are filled), this
  process logs :data:`READY_LINE` and sets ``serving``; cleared while it is down.
- Metrics (with ``METRICS_PORT``): prometheus-client's multiprocess mode. It writes its metrics
  into files in a directory made here; the operator's endpoint serves those of its own
  (``durable_agents_admission_*``: :class:`WebhookMetrics`), none of the operator's twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from durable_agents_controllers.config import OperatorConfig

log = logging.getLogger(__name__)
READY_LINE = "admission webhook serving"
MODULE = "durable_agents_controllers.webhook_process"
METRICS_PREFIX = "durable_agents_admission_"  # the webhook process's metrics (and only those)
STOP_WITHIN = 10.0  # seconds the webhook process gets to close its connections at shutdown
MIN_BACKOFF, MAX_BACKOFF = 1.0, 30.0  # between restarts of a webhook process that died
STEADY = 60.0  # seconds up after which a death starts the backoff afresh
LISTEN_WITHIN = 120.0  # seconds to wait for it to accept connections before saying so


class WebhookMetrics:
    """A collector for the operator's registry: the webhook process's metrics, from the files of
    prometheus-client's multiprocess mode."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def collect(self) -> Iterator[Metric]:
        files = glob.glob(str(self.directory / "*.db"))
        for family in MultiProcessCollector.merge(files, accumulate=True):  # type: ignore[no-untyped-call]
            if family.name.startswith(METRICS_PREFIX):  # only its own: no name twice on the endpoint
                yield family


_metrics_directory: Path | None = None


def metrics_directory() -> Path:
    """This operator's one directory for the webhook process's metrics, its collector registered
    once (kopf retries a failed start-up: the manager starts the webhook process again)."""
    global _metrics_directory
    if _metrics_directory is None:
        _metrics_directory = Path(tempfile.mkdtemp(prefix="durable-agents-webhook-metrics-"))
        REGISTRY.register(WebhookMetrics(_metrics_directory))
    return _metrics_directory


class WebhookProcess:
    """One of the manager's parts: the webhook process, kept running."""

    def __init__(self, config: OperatorConfig, certificates: Path, serving: asyncio.Event) -> None:
        self.config, self.certificates, self.serving = config, certificates, serving
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="WebhookProcess")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def command(self) -> list[str]:
        return [sys.executable, "-m", MODULE, "--parent", str(os.getpid()), "--certs", str(self.certificates)]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.config.metrics_port is not None:
            directory = metrics_directory()
            # A new webhook process counts afresh (a counter reset, as any restart is): the files
            # of the one before (1 MiB each, in the Pod's small /tmp) do not pile up.
            for old in glob.glob(str(directory / "*.db")):
                os.unlink(old)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
        return env

    async def run(self) -> None:
        backoff = MIN_BACKOFF
        try:
            while True:
                started = time.monotonic()
                code = await self._one()
                self.serving.clear()
                backoff = MIN_BACKOFF if time.monotonic() - started > STEADY else backoff
                log.error(
                    "the admission webhook process exited (%s); starting it again in %.0fs",
                    _exit_status(code),
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
        finally:
            self.serving.clear()
            if _metrics_directory is not None:  # stopped: its files go with it
                for old in glob.glob(str(_metrics_directory / "*.db")):
                    os.unlink(old)

    async def _one(self) -> int:
        """Run one webhook process until it exits: its exit status."""
        # Started from the event loop's thread (the main one, for the process's life): the
        # parent-death signal the child asks for is tied to the thread that started it.
        proc = await asyncio.create_subprocess_exec(*self.command(), env=self.environment())
        log.info("admission webhook process %d started", proc.pid)
        announce = asyncio.create_task(self._announce(proc))
        try:
            return await proc.wait()
        except asyncio.CancelledError:
            await _terminate(proc)
            raise
        finally:
            announce.cancel()

    async def _announce(self, proc: asyncio.subprocess.Process) -> None:
        """Log :data:`READY_LINE` and set ``serving`` once the process accepts connections."""
        host, port = self.config.webhook_host, self.config.webhook_port
        host = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LISTEN_WITHIN
        while proc.returncode is None:
            try:
                _, writer = await asyncio.open_connection(host, port)
            except OSError:
                if loop.time() > deadline:
                    log.warning("the admission webhook process does not accept connections yet")
                    deadline = loop.time() + LISTEN_WITHIN
                await asyncio.sleep(0.05)
                continue
            writer.close()
            self.serving.set()
            log.info("%s on https://%s:%s (process %d)", READY_LINE, self.config.webhook_host, port, proc.pid)
            return


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, and SIGKILL if it has not exited within :data:`STOP_WITHIN`."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), STOP_WITHIN)
    except TimeoutError:
        log.warning("admission webhook process %d not stopped within %.0fs: killed", proc.pid, STOP_WITHIN)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
    else:
        log.info("admission webhook process %d stopped (%s)", proc.pid, _exit_status(proc.returncode))


def _exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"
