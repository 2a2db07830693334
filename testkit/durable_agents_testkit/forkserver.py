"""A warm fork server for operator processes: ``python -m durable_agents_testkit.forkserver``.

It imports the operator once, then forks a child per request. Each child is still a fresh OS
process that knows nothing but what it reads from the API server; only the import (2-5 s of CPU
per process) is shared. Its client is :class:`durable_agents_testkit.chaos.warm.ForkServer`, used by
the chaos lab and by the e2e suite's ``start_operator``.

The protocol, one text line per message on the server's stdin and stdout:

- server: ``ready``, once, when the operator is imported;
- client: a :class:`Request` (JSON: ``{"env": {...}, "log": "/path"}``); the server forks a child
  that runs the operator with exactly ``env`` as its environment, in a new session, stdin from
  ``/dev/null``, stdout and stderr appended to ``log``;
- server: ``started PID`` for each request, in order (the client sends one request at a time);
- server: ``exit PID CODE`` when a child ends (CODE as :func:`os.waitstatus_to_exitcode`:
  negative for a signal);
- end of input: the server exits; its children go on (the client stops them first).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import select
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

READY = "ready"
# What the operator imports on first use (the model SDK's chat resources, the MCP client, the HTTP
# stack under them, each Kubernetes API group with its models): 3-5 s of CPU in every child else.
WARM_MODULES = (
    "openai",
    "openai.resources.chat",
    "openai.lib.streaming.chat",
    "openai.pagination",
    "mcp",
    "mcp_types",
    "mcp.shared.exceptions",
    "httpcore2",
    "h11",
    "anyio._backends._asyncio",
    "truststore",
    "jiter",
)
WARM_KUBERNETES_APIS = (
    "AdmissionregistrationV1Api",
    "AuthorizationV1Api",
    "CoordinationV1Api",
    "CoreV1Api",
    "CustomObjectsApi",
)
POLL_SECONDS = 0.02  # how often ended children are looked for while no request arrives

RunOperator = Callable[[Mapping[str, str]], None]


# --- the protocol ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """Start an operator with exactly ``env`` as its environment, logging to ``log``."""

    env: dict[str, str]
    log: Path

    def encode(self) -> str:
        return json.dumps({"env": self.env, "log": str(self.log)}) + "\n"

    @classmethod
    def decode(cls, line: str) -> Request:
        raw = json.loads(line)
        return cls(env={str(k): str(v) for k, v in raw["env"].items()}, log=Path(raw["log"]))


@dataclass(frozen=True)
class Started:
    """The answer to a request: the child's pid."""

    pid: int

    def encode(self) -> str:
        return f"started {self.pid}"


@dataclass(frozen=True)
class Exited:
    """A child ended with ``code`` (negative: killed by that signal)."""

    pid: int
    code: int

    def encode(self) -> str:
        return f"exit {self.pid} {self.code}"


def decode_message(line: str) -> Started | Exited | None:
    """A line of the server's output after ``ready`` (None: not a message, e.g. a stray print)."""
    kind, _, rest = line.strip().partition(" ")
    if kind == "started":
        return Started(int(rest))
    if kind == "exit":
        pid, code = rest.split()
        return Exited(int(pid), int(code))
    return None


# --- the server ----------------------------------------------------------------------------------


def load_operator() -> RunOperator:
    """Import the operator (the cost this server pays once for all its children) and return how a
    child runs it. The one place that knows how the operator starts: as ``python -m
    durable_agents_controllers`` would with ``env`` as its whole environment; the operator reads
    its configuration from it, once, when its entry point starts."""
    import kubernetes.client
    from kubernetes.config import kube_config

    from durable_agents_controllers.__main__ import main

    for module in WARM_MODULES:
        importlib.import_module(module)
    for api in WARM_KUBERNETES_APIS:
        getattr(kubernetes.client, api)  # the client imports each API group on first access

    def run(env: Mapping[str, str]) -> None:
        os.environ.clear()
        os.environ.update(env)
        # Read from the environment at import time: set it as a fresh import would have.
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = os.environ.get("KUBECONFIG", "~/.kube/config")
        random.seed()  # not the server's sequence, nor a sibling's
        main()

    return run


def _redirect(log: Path) -> None:
    """stdin from /dev/null; stdout and stderr appended to ``log``, line-buffered."""
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)


def child(line: str, run: RunOperator) -> NoReturn:
    """In the forked child: become the operator asked for by ``line``; never return."""
    code = 1
    try:
        request = Request.decode(line)
        os.setsid()
        _redirect(request.log)
        run(request.env)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _send(message: str) -> None:
    print(message, flush=True)


def _reap() -> None:
    """Report every child that has ended since the last look."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # no children at all
            return
        if pid == 0:
            return
        _send(Exited(pid, os.waitstatus_to_exitcode(status)).encode())


def serve() -> None:
    run = load_operator()
    _send(READY)
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], POLL_SECONDS)
        _reap()
        if not readable:
            continue
        line = sys.stdin.readline()
        if not line:
            return
        pid = os.fork()
        if pid == 0:
            child(line, run)
        _send(Started(pid).encode())


if __name__ == "__main__":
    serve()
