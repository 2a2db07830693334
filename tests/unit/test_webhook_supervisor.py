"""The operator's side of the webhook process: its metrics on the operator's endpoint (and none
of the operator's own twice), and the test hook that holds the operator's interpreter lock."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from durable_agents.shell.ground.faults import FaultPoints, Hold, hold_interpreter
from durable_agents_controllers.webhook_supervisor import WebhookMetrics

pytestmark = pytest.mark.unit

WRITE = """
from prometheus_client import Counter, Histogram
Histogram("durable_agents_admission_review_seconds", "h", ["allowed", "resource"]).labels(
    "true", "agentruns"
).observe(0.2)
Counter("durable_agents_transitions_total", "c").inc()
"""


def test_the_operator_serves_the_webhook_processs_own_metrics_only(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", WRITE], env=env, check=True, timeout=60)
    families = {family.name: family for family in WebhookMetrics(tmp_path).collect()}
    assert set(families) == {"durable_agents_admission_review_seconds"}, "the operator's own are its own"
    samples = {s.name: s.value for s in families["durable_agents_admission_review_seconds"].samples}
    assert samples["durable_agents_admission_review_seconds_count"] == 1.0


@pytest.mark.parametrize(("text", "expected"), [("held:30", Hold("held", 30)), ("a:b:2", Hold("a:b", 2))])
def test_a_hold_names_a_run_prefix_and_seconds(text: str, expected: Hold) -> None:
    assert Hold.parse(text) == expected


@pytest.mark.parametrize("text", ["held", ":3", "held:0", "held:1.5", "held:-1"])
def test_a_malformed_hold_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="PREFIX:SECONDS"):
        Hold.parse(text)


def test_the_hold_keeps_every_other_thread_of_the_process_waiting() -> None:
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    thread = threading.Thread(target=tick)
    thread.start()
    time.sleep(0.1)
    began = time.monotonic()
    hold_interpreter(1)
    ended = time.monotonic()
    stop.set()
    thread.join()
    assert not [t for t in ticks if began + 0.05 < t < ended - 0.05], "a thread ran during the hold"


def test_the_hold_fires_once_and_only_for_its_runs() -> None:
    faults = FaultPoints([], hold=Hold("held", 1))
    faults.hold_at_commit("ns", "other")
    assert faults.hold is not None, "another run's commit is not held"
    faults.hold_at_commit("ns", "held-1")
    assert faults.hold is None, "held once: the next commit of the run is not"
