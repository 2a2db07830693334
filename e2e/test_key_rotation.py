"""Key rotation over live runs: a new active key, a pass that re-seals every run under it with at
most two writes per run (no transition, no quarantine), and a keyring Secret from which a key still
in use cannot be removed.

The operator runs as the chart's identity with the admission webhook, and with keys of this test's
own (not the session's): key A, then A and B with B active, then B alone. The runs are created and
answered through the webhook (unstamped admin writes: the webhook stamps and seals them).
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from urllib3.exceptions import ProtocolError

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.sealed_values import DATA_KEY_ANNOTATION, data_key_id
from durable_agents.core.sealing import generate_key
from durable_agents.core.stamps import stamp_key_id
from durable_agents.shell.keys.keyguard import KEYRING_LABEL
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port, metric, scrape_when

RUNS = 50
LEASE = 2
WRITES_PER_SECOND = 25
A, B = "rot-a", "rot-b"
SECRET = "durable-agents-keys"


def asking() -> dict[str, Any]:
    return {
        "taskType": "e2e",
        "objective": "ask, then finish",
        "steps": [{"name": "confirm", "ask": {"question": "ship it?"}}, {"name": "done", "complete": {}}],
    }


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """Key directories as the mounted Secret would be at each stage: {A}, {A, B}, {B}."""
    material = {A: generate_key(entropy=os.urandom), B: generate_key(entropy=os.urandom)}
    dirs = {"a": [A], "ab": [A, B], "b": [B]}
    out = {}
    for name, ids in dirs.items():
        directory = tmp_path / f"keys-{name}"
        directory.mkdir()
        for key_id in ids:
            (directory / key_id).write_bytes(material[key_id])
        out[name] = directory
    return out


@pytest.fixture
def operator(
    start_operator: Callable[..., OperatorProcess], runs: Runs
) -> Callable[..., tuple[OperatorProcess, int]]:
    def start(name: str, keys_dir: Path, active: str) -> tuple[OperatorProcess, int]:
        metrics_port = free_port()
        op = start_operator(
            name,
            LEASE,
            DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()),
            DURABLE_AGENTS_METRICS_PORT=str(metrics_port),
            DURABLE_AGENTS_SEALING_KEYS_DIR=str(keys_dir),
            DURABLE_AGENTS_SEALING_ACTIVE_KEY=active,
            DURABLE_AGENTS_RESEAL_WRITES_PER_SECOND=str(WRITES_PER_SECOND),
        )
        eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
        runs.await_webhook()  # the runs are created and answered unstamped, through it
        return op, metrics_port

    return start


class Recorder:
    """Every change to the namespace's runs from a resourceVersion on, as a watch delivers it."""

    def __init__(self, runs: Runs, version: str) -> None:
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self.error: Exception | None = None
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._stream, args=(runs, version), daemon=True)
        self._thread.start()

    def _stream(self, runs: Runs, version: str) -> None:
        # A watch the server or the connection ends is resumed from the last resourceVersion seen,
        # as any client does: no change is lost or seen twice. Anything else fails the test.
        deadline = time.monotonic() + float(Within.SETTLE)
        while not self._closed and time.monotonic() < deadline:
            stream = self._watch.stream(
                runs.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                runs.namespace,
                "agentruns",
                resource_version=version,
                timeout_seconds=int(Within.RUN),
            )
            try:
                for event in stream:
                    self.events.append((time.monotonic(), event["type"], event["object"]))
                    version = event["object"]["metadata"]["resourceVersion"]
            except ProtocolError:
                continue  # "Response ended prematurely": resumed from ``version``
            except Exception as err:
                if not self._closed:
                    self.error = err
                return

    _closed = False

    def close(self) -> None:
        self._closed = True
        self._watch.stop()

    def stop(self) -> None:
        self.close()
        assert self.error is None, f"the watch failed: {self.error!r}"


@pytest.fixture
def recorder() -> Iterator[list[Recorder]]:
    made: list[Recorder] = []
    yield made
    for rec in made:
        rec.close()


def key_ids(run: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the key wrapping the run's data key, the key stamping its checkpoint)."""
    annotation = (run["metadata"].get("annotations") or {}).get(DATA_KEY_ANNOTATION)
    checkpoint = (run.get("status") or {}).get("checkpoint") or {}
    return data_key_id(annotation), stamp_key_id(checkpoint.get("integrity"))


def set_keys(core: client.CoreV1Api, namespace: str, *ids: str, material: dict[str, Path]) -> Any:
    secret = core.read_namespaced_secret(SECRET, namespace)
    secret.data = {k: base64.b64encode((material["ab"] / k).read_bytes()).decode() for k in ids}
    return core.replace_namespaced_secret(SECRET, namespace, secret)


def refused(call: Callable[[], Any]) -> str:
    with pytest.raises(client.ApiException) as err:
        call()
    assert err.value.status == 403, err.value.body
    return str(json.loads(err.value.body)["message"])


@pytest.mark.local_plane("webhook")
def test_rotation_reseals_50_live_runs_gently_and_a_key_in_use_cannot_be_retired(
    operator: Callable[..., tuple[OperatorProcess, int]],
    runs: Runs,
    namespace: str,
    keys: dict[str, Path],
    recorder: list[Recorder],
) -> None:
    core = client.CoreV1Api(runs.kube.api)
    first, _ = operator("before", keys["a"], A)
    names = [f"r{i:02d}" for i in range(RUNS)]
    for name in names:
        runs.create(asking(), name=name, stamped=False)  # the webhook stamps and seals

    def all_parked() -> list[dict[str, Any]] | None:
        items = runs.all()
        parked = [r for r in items if (r.get("status") or {}).get("state") == "waiting_input"]
        return items if len(parked) == RUNS and all(key_ids(r)[1] for r in parked) else None

    before = {r["metadata"]["name"]: r for r in eventually(all_parked, Within.RUN, f"{RUNS} runs waiting")}
    assert {key_ids(r) for r in before.values()} == {(A, A)}
    assert all(r["spec"]["steps"][0]["ask"]["question"].startswith("sealed:v1:") for r in before.values())

    # The keyring Secret, guarded: A is active and every run uses it.
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": SECRET, "labels": {KEYRING_LABEL: "true"}},
            "data": {A: base64.b64encode((keys["a"] / A).read_bytes()).decode()},
        },
    )
    message = refused(lambda: set_keys(core, namespace, material=keys))
    assert f"key '{A}' is the operator's active key" in message
    assert f"{RUNS} AgentRun(s) still use key(s) '{A}'" in message
    assert f"{namespace}/r00 ({A}: data key, checkpoint integrity)" in message
    assert f"and {RUNS - 10} more" in message
    message = refused(lambda: core.delete_namespaced_secret(SECRET, namespace))
    assert f"{RUNS} AgentRun(s) still use key(s) '{A}'" in message
    set_keys(core, namespace, A, B, material=keys)  # adding a key takes nothing away

    # Rotation: A and B, B active. Every change to the runs from here on is recorded.
    first.stop()
    rec = Recorder(
        runs,
        runs.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns")["metadata"][
            "resourceVersion"
        ],
    )
    recorder.append(rec)
    rotated, metrics_port = operator("rotated", keys["ab"], B)

    def all_under_b() -> list[dict[str, Any]] | None:
        items = runs.all()
        return items if len(items) == RUNS and all(key_ids(r) == (B, B) for r in items) else None

    after = {r["metadata"]["name"]: r for r in eventually(all_under_b, Within.RUN, "every run under key B")}
    for name, run in after.items():
        was = before[name]["status"]
        assert run["status"]["state"] == "waiting_input", name
        assert run["status"]["stateVersion"] == was["stateVersion"], f"{name}: no transition"
        assert run["status"].get("history") == was.get("history"), name
        assert run["spec"] == before[name]["spec"], f"{name}: sealed values untouched"

    # Writes bounded: one data-key write and one checkpoint write per run, paced. The last write is
    # counted once it has returned to the operator: a moment after the test can see it.
    data_keys = 'durable_agents_resealed_total{what="data_key"}'
    checkpoints = 'durable_agents_resealed_total{what="checkpoint"}'
    text = scrape_when(metrics_port, {data_keys: RUNS, checkpoints: RUNS})
    assert metric(text, data_keys) == RUNS
    assert metric(text, checkpoints) == RUNS
    eventually(lambda: len(rec.events) >= 2 * RUNS, Within.MOMENT, "the watch to deliver the writes")
    changes = [(at, obj) for at, kind, obj in rec.events if kind == "MODIFIED"]
    per_run = Counter(obj["metadata"]["name"] for _, obj in changes)
    assert max(per_run.values()) <= 2, per_run
    assert sum(per_run.values()) == 2 * RUNS, per_run
    assert not any(obj["status"]["state"] == "quarantined" for _, obj in changes)
    span = changes[-1][0] - changes[0][0]
    assert span >= 0.75 * (2 * RUNS - 1) / WRITES_PER_SECOND, f"{2 * RUNS} writes in {span:.1f}s"

    # B is active: refused. A is used by nothing any more: allowed.
    message = refused(lambda: set_keys(core, namespace, A, material=keys))
    assert f"key '{B}' is the operator's active key" in message
    assert set(set_keys(core, namespace, B, material=keys).data) == {B}

    # The keyring without A at all: the re-sealed runs still open, verify, and finish.
    rec.stop()
    rotated.stop()
    operator("after", keys["b"], B)
    answered = names[:5]
    for name in answered:
        runs.patch_spec(name, {"answers": {"confirm": "yes"}}, stamped=False)
    for name in answered:
        runs.wait_state(name, "completed", timeout=Within.RUN)
    states = Counter((r.get("status") or {}).get("state") for r in runs.all())
    assert states == {"completed": 5, "waiting_input": RUNS - 5}, states
