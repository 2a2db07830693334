"""Warm starts: operator processes forked from :mod:`durable_agents_testkit.forkserver`."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from durable_agents_testkit import forkserver
from durable_agents_testkit.forkserver import Exited, Request, Started
from durable_agents_testkit.operator_process import OperatorProcess

SPAWN_TIMEOUT = 30.0  # seconds for the server to answer a request with the child's pid


class ForkServer:
    """Starts operator processes by forking an interpreter that has already imported the operator.

    Each operator is still a fresh OS process that knows nothing but what it reads from the API
    server; only the import (2 s of CPU per process, 4-5 s with the model and MCP SDKs) is done
    once. A kill chain of hundreds of processes on two cores is bound by exactly that. What
    modules read from the environment at import time is set again in the child (the kubeconfig
    location); everything else, the webhook included, is chosen from the configuration the
    child's entry point reads.
    """

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", forkserver.__name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, **(env or {})},
            text=True,
            bufsize=1,
        )
        self.exits: dict[int, int] = {}
        self._spawned: set[int] = set()
        self._started: queue.Queue[int] = queue.Queue()
        self._spawning = threading.Lock()  # one request and its answer at a time
        self._changed = threading.Condition()  # exits, recorded by the reader thread
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != forkserver.READY:
            raise RuntimeError("the fork server did not start")
        self._reader = threading.Thread(target=self._read, name="fork-server", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = forkserver.decode_message(line)
            if isinstance(message, Started):
                self._started.put(message.pid)
            elif isinstance(message, Exited):
                with self._changed:
                    self.exits[message.pid] = message.code
                    self._changed.notify_all()

    def spawn(self, env: dict[str, str], log: Path) -> int:
        """Start an operator with exactly ``env`` as its environment; its pid."""
        assert self.proc.stdin is not None
        with self._spawning:
            self.proc.stdin.write(Request(env, log).encode())
            self.proc.stdin.flush()
            pid = self._started.get(timeout=SPAWN_TIMEOUT)
        with self._changed:
            # The kernel reuses pids: an exit recorded under this one was an earlier child's (its
            # Exited line is always read before this Started line), not this child's.
            self.exits.pop(pid, None)
            self._spawned.add(pid)
            return pid

    def wait(self, pid: int, timeout: float) -> int:
        """The exit code of ``pid`` once it has ended (negative: the signal that killed it)."""
        with self._changed:
            if not self._changed.wait_for(lambda: pid in self.exits, timeout):
                raise subprocess.TimeoutExpired(f"operator pid {pid}", timeout)
            return self.exits[pid]

    def close(self) -> None:
        # A child not stopped by its test would outlive the server (reparented), retrying against
        # an API server that is gone and taking CPU from the tests after it: each child leads its
        # own session (setsid), so its group is killed.
        for pid in self._spawned - set(self.exits):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def runs_this_checkout(env: Mapping[str, str]) -> bool:
    """Whether an operator started with ``env`` runs the code the fork server imported (not when
    ``PYTHONPATH`` points it at another release's): only then may it be forked warm."""
    return "PYTHONPATH" not in env


class WarmOperator(OperatorProcess):
    """An :class:`OperatorProcess` forked by a :class:`ForkServer` instead of exec'd."""

    def __init__(self, server: ForkServer, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server = server
        self._pid: int | None = None

    def start(self, timeout: float = 60.0) -> OperatorProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._pid = self.server.spawn(self.environment(), self.log_path)
        self.await_ready(timeout)
        return self

    @property
    def pid(self) -> int:
        assert self._pid is not None
        return self._pid

    @property
    def alive(self) -> bool:
        return self._pid is not None and self._pid not in self.server.exits

    def wait_exit(self, timeout: float) -> int:
        return self.server.wait(self.pid, timeout)
