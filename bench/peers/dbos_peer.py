"""DBOS + PostgreSQL: a ``@DBOS.workflow`` of 10 ``@DBOS.step`` steps; before step 5 it waits in
``DBOS.recv`` for the approval that the driver sends from outside the workflow with ``DBOS.send``;
step 8 POSTs to the counting server with an idempotency key derived from the workflow ID.

Twenty driver threads keep 20 workflows in flight. The driver learns that a workflow is parked from
an in-process signal set just before ``recv`` (no durable write, so it adds no commit), sends the
approval, and takes ``delivered`` when ``DBOS.send`` has returned (its transaction committed).
``resumed`` is taken in the workflow right after ``recv`` returned.
"""

from __future__ import annotations

import importlib.metadata
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dbos import DBOS, SetWorkflowID

from bench.peers.postgres import CommitCounter
from bench.peers.worker import PeerSystem, serve
from bench.peers.workload import (
    APPROVAL_DECISION,
    APPROVAL_STEP,
    APPROVAL_TOPIC,
    POST_STEP,
    STEPS,
    RepResult,
    RunTiming,
    compute,
    expected_digest,
    post_effect,
)

_REFSYSTEM_URL = ""
_paused: dict[str, threading.Event] = {}
_resumed: dict[str, float] = {}


def effect_key(workflow_id: str) -> str:
    return f"{workflow_id}/step-{POST_STEP}"


@DBOS.step()
def compute_step(prev: str, run_id: str, step: int, extra: str = "") -> str:
    return compute(prev, run_id, step, extra)


@DBOS.step()
def post_step(prev: str, run_id: str, key: str) -> str:
    receipt = post_effect(_REFSYSTEM_URL, key, {"run": run_id, "state": prev})
    return compute(prev, run_id, POST_STEP, receipt)


@DBOS.workflow()
def peer_workflow(run_id: str) -> str:
    workflow_id = DBOS.workflow_id
    assert workflow_id is not None
    state = ""
    for step in range(1, STEPS + 1):
        if step == APPROVAL_STEP:
            signal = _paused.get(workflow_id)
            if signal is not None:
                signal.set()
            decision = DBOS.recv(APPROVAL_TOPIC, timeout_seconds=120)
            _resumed[workflow_id] = time.time()
            if decision != APPROVAL_DECISION:
                raise RuntimeError(f"no approval: recv returned {decision!r}")
            state = compute_step(state, run_id, step, decision)
        elif step == POST_STEP:
            state = post_step(state, run_id, effect_key(workflow_id))
        else:
            state = compute_step(state, run_id, step)
    return state


class DbosPeer(PeerSystem):
    name = "dbos-postgres"

    def setup(self) -> dict[str, Any]:
        global _REFSYSTEM_URL
        _REFSYSTEM_URL = self.refsystem_url
        pg = self.config["postgres"]
        self.counter = CommitCounter(pg)
        url = f"postgresql://postgres@127.0.0.1:{pg['port']}/dbos_bench"
        config: dict[str, Any] = {
            "name": "peers-bench",
            "system_database_url": url,
            "log_level": "WARNING",
        }
        DBOS(config=config)  # type: ignore[arg-type]
        DBOS.launch()
        return {
            "versions": {"dbos": importlib.metadata.version("dbos")},
            "settings": {
                **{k: v for k, v in config.items() if k != "system_database_url"},
                "sys_db_pool_size": "default (20)",
                "executor threads": "default (unbounded)",
            },
            "mapping": "10 @DBOS.step steps (9 compute, step 8 the POST) plus DBOS.recv before step 5",
        }

    def _one(self, run_id: str) -> RunTiming:
        timing = RunTiming(run_id=run_id)
        workflow_id = f"peer-{run_id}"
        timing.key = effect_key(workflow_id)
        paused = _paused[workflow_id] = threading.Event()
        try:
            timing.started = time.time()
            with SetWorkflowID(workflow_id):
                handle = DBOS.start_workflow(peer_workflow, run_id)
            if not paused.wait(120):
                raise TimeoutError("the workflow never reached its approval wait")
            timing.paused = time.time()
            DBOS.send(workflow_id, APPROVAL_DECISION, topic=APPROVAL_TOPIC)
            timing.delivered = time.time()
            digest = handle.get_result()
            timing.finished = time.time()
            timing.resumed = _resumed.pop(workflow_id)
            if digest != expected_digest(run_id, timing.key):
                raise AssertionError("the workflow's digest differs from the workload's")
            timing.ok = True
        except Exception as err:
            timing.finished = timing.finished or time.time()
            timing.error = f"{type(err).__name__}: {err}"
        finally:
            _paused.pop(workflow_id, None)
        return timing

    def run_rep(self, rep: int, runs: int, in_flight: int, variant: str | None = None) -> RepResult:
        prefix = f"r{rep}-{uuid.uuid4().hex[:6]}"
        ids = [f"{prefix}-{i}" for i in range(runs)]
        before = self.counter.position()
        with ThreadPoolExecutor(max_workers=in_flight) as pool:
            timings = list(pool.map(self._one, ids))
        after = self.counter.position()
        detail = self.counter.between(before, after)
        return RepResult.from_timings(
            self.name, rep, timings, in_flight, float(detail["commit_records"]), detail
        )

    def teardown(self) -> None:
        DBOS.destroy()


def main() -> int:
    return serve(DbosPeer)


if __name__ == "__main__":
    raise SystemExit(main())
