"""The admission webhook's own process lives and dies with the operator (issue 30): the operator
starts it, starts it again when it dies (its readiness following), stops it on SIGTERM, and a
SIGKILL of the operator leaves no webhook process serving (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

SERVING = "admission webhook serving"
STARTED = re.compile(r"admission webhook process (\d+) started")
DONE = {"taskType": "t", "objective": "o", "steps": [{"name": "ask", "await": {"event": "go"}}]}


def webhook_pids(op: OperatorProcess) -> list[int]:
    return [int(pid) for pid in STARTED.findall(op.log_path.read_text())] if op.log_path.exists() else []


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited process its new parent has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def ready(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


@pytest.mark.local_plane("webhook")
def test_the_webhook_process_is_started_again_when_it_dies_and_stops_with_the_operator(
    namespace: str, runs: Runs, start_operator: Callable[..., OperatorProcess]
) -> None:
    health = free_port()
    port = free_port()
    op = start_operator(
        "webhook-process", DURABLE_AGENTS_WEBHOOK_PORT=str(port), DURABLE_AGENTS_HEALTH_PORT=str(health)
    )
    eventually(lambda: op.logged(SERVING), Within.COMMIT, "the admission webhook")
    (first,) = webhook_pids(op)
    assert first != op.pid, "a process of its own"
    assert parent_of(first) == op.pid, "the operator's child"
    eventually(lambda: ready(health) == 200, Within.COMMIT, "the operator ready")

    os.kill(first, 9)
    eventually(
        lambda: op.logged("the admission webhook process exited (signal SIGKILL)"),
        Within.COMMIT,
        "the operator to see its webhook process die",
    )
    eventually(lambda: op.logged(SERVING, times=2), Within.TAKEOVER, "the webhook process started again")
    (_, second) = webhook_pids(op)
    assert parent_of(second) == op.pid
    eventually(lambda: ready(health) == 200, Within.COMMIT, "the operator ready again")
    runs.await_webhook()
    name = runs.create(DONE, stamped=False)  # through the new process: stamped by it
    assert runs.get(name)["spec"]["createdBy"]["stamp"], "stamped by the restarted webhook process"

    op.stop()  # SIGTERM
    assert op.wait_exit(1) == 0, op.log_tail()
    assert op.logged(f"admission webhook process {second} stopped (exit status 0)"), op.log_tail()
    assert not running(second), "the webhook process ended with the operator"


@pytest.mark.local_plane("webhook")
def test_a_sigkill_of_the_operator_leaves_no_webhook_process_serving(
    namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    port = free_port()
    op = start_operator("webhook-orphan", DURABLE_AGENTS_WEBHOOK_PORT=str(port))
    eventually(lambda: op.logged(SERVING), Within.COMMIT, "the admission webhook")
    (child,) = webhook_pids(op)
    assert running(child)
    assert accepts(port)

    op.kill()  # SIGKILL: no clean-up of its own
    eventually(lambda: not running(child), Within.COMMIT, f"webhook process {child} to end with its operator")
    assert not accepts(port), "nothing serves the webhook's port once the operator is gone"
