"""The key rotation pass: every run's data key and checkpoint under the keyring's active key.

After a new key becomes active, new values are sealed and stamped with it, but runs written
before still name the old key: their data key is wrapped with it, their checkpoint is stamped
with it. This pass lists the runs (in pages, as the reflector does), once at start-up and then
every interval (never with a keyring of one key: nothing could be re-sealed), and for each run
still on an older key makes at most two writes:

1. the data-key annotation rewrapped under the active key (the same data key, so every sealed
   value stays as it is): ONE merge patch carrying the read ``resourceVersion`` as precondition.
   The admission webhook keeps a data-key change only when it opens to the same data key;
2. the checkpoint re-stamped over the same decisive fields, only if it verifies now (a checkpoint
   that does not is the engine's to quarantine): ONE status write with the resourceVersion as
   precondition; state, stateVersion and history are untouched, so no transition happens.

A 409 (the worker committed in between) skips the run: the next pass picks it up, and a worker
commit stamps with the active key anyway. Writes are paced (at most ``writes_per_second``), so a
rotation over 10,000 runs is a steady trickle, not a storm. Nothing here decides anything the
engine decides: it only re-expresses what verifies under the old key with the new one.

Then the ActionRecords: each whose outcome stamp verifies under an older key gets the same status
written again (ONE status write, the ActionStore stamps it with the active key); one that does not
verify is left to the dispatcher (reconciled by query), never blessed anew.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from durable_agents.api.v1alpha1 import GROUP, VERSION, ActionRecordStatus, AgentRunStatus
from durable_agents.core.key_use import needs_restamp, restamp_stored
from durable_agents.core.outcome_stamps import outcome_verifies
from durable_agents.core.positions import restamped_position
from durable_agents.core.sealed_values import DATA_KEY_ANNOTATION, data_key_id, rewrap
from durable_agents.core.sealing import Keyring, UndecryptableError
from durable_agents.core.stamps import stamp_key_id
from durable_agents.shell.ground import fast_json, metrics
from durable_agents.shell.ground.faults import FaultPoints
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ground.lifecycle import Background, forever
from durable_agents.shell.ground.store import Conflict, Gone, RunStore
from durable_agents.shell.ledger.actions import PLURAL as ACTION_RECORDS
from durable_agents.shell.ledger.actions import ActionStore

log = logging.getLogger(__name__)

RETRY_AFTER_ERRORS = 2.0  # seconds before a pass that hit errors (webhook not up yet) runs again


async def iter_runs(
    kube: Kube, namespace: str | None, page_size: int, plural: str = "agentruns"
) -> AsyncIterator[dict[str, Any]]:
    """Every AgentRun (or other object of ``plural``; of one namespace, or all), in pages of ``page_size``."""
    custom = kube.custom
    call: Callable[..., Any] = (
        functools.partial(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural)
        if namespace
        else functools.partial(custom.list_cluster_custom_object, GROUP, VERSION, plural)
    )
    token: str | None = None
    while True:
        response = await kube.call(call, limit=page_size, _continue=token, _preload_content=False)
        page = fast_json.loads(response.data)  # a cold start lists every run here: orjson, not json
        for item in page.get("items") or []:
            yield item
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


@dataclass(frozen=True)
class ResealConfig:
    interval: float = 600.0
    writes_per_second: float = 20.0
    namespace: str | None = None
    page_size: int = 200


@dataclass
class PassReport:
    """What one pass did: runs seen, writes made by kind, runs left for later by reason."""

    runs: int = 0
    written: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    def wrote(self, what: str) -> None:
        self.written[what] = self.written.get(what, 0) + 1
        metrics.RESEALED.labels(what).inc()

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        metrics.RESEAL_SKIPPED.labels(reason).inc()


class Resealer(Background):
    def __init__(self, kube: Kube, keyring: Keyring, config: ResealConfig | None = None) -> None:
        self.kube = kube
        self.keyring = keyring
        self.config = config or ResealConfig()
        # Inert fault points: the test hooks count the worker's and dispatcher's writes only.
        self.store = RunStore(kube, FaultPoints([]))
        self.records = ActionStore(kube, keyring, FaultPoints([]))  # stamps with the active key
        self.passes = 0
        self._next_write = 0.0

    async def run(self) -> None:
        """A pass now, then one every interval; sooner again while passes hit errors. None with a
        keyring of one key: a run on another key could not be opened to re-seal it (the engine
        quarantines it when it needs the key), and each pass lists every run, a second list beside
        the worker's at every start (a cold start over 10,000 runs spent a quarter of its CPU here)."""
        if set(self.keyring.keys) == {self.keyring.active_key_id}:
            log.info(
                "key rotation: the keyring holds only key %s, nothing to re-seal", self.keyring.active_key_id
            )
            await forever()
        backoff = RETRY_AFTER_ERRORS
        while True:
            try:
                await self.reseal_all()
                failed = False
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the API server restarting, the webhook not up: never fatal
                log.warning("key rotation pass failed (%s: %s)", type(err).__name__, err)
                failed = True
            if failed:
                await asyncio.sleep(min(backoff, self.config.interval))
                backoff = min(backoff * 2, self.config.interval)
            else:
                backoff = RETRY_AFTER_ERRORS
                await asyncio.sleep(self.config.interval)

    async def reseal_all(self) -> PassReport:
        report = PassReport()
        async for run in iter_runs(self.kube, self.config.namespace, self.config.page_size):
            report.runs += 1
            await self.reseal(run, report)
        async for record in iter_runs(
            self.kube, self.config.namespace, self.config.page_size, ACTION_RECORDS
        ):
            await self._restamp_record(record, report)
        self.passes += 1
        if report.written or report.skipped:
            log.info(
                "key rotation pass %d under key %s: %d runs, wrote %s, left for later %s",
                self.passes,
                self.keyring.active_key_id,
                report.runs,
                report.written,
                report.skipped,
            )
        return report

    async def reseal(self, run: dict[str, Any], report: PassReport) -> None:
        """At most two writes for ``run``: its data key, then its checkpoint."""
        try:
            run = await self._rewrap(run, report)
            await self._restamp(run, report)
        except (Conflict, _Skip) as skip:
            report.skip(str(skip) if isinstance(skip, _Skip) else "conflict")
        except Gone:
            pass
        except ApiException as err:
            if err.status is not None and 400 <= err.status < 500 and err.status != 429:
                log.warning("key rotation: %s refused: %s %s", _key(run), err.status, err.body)
                report.skip("refused")  # this run only (a validation, a webhook's refusal)
                return
            report.skip("error")  # the API server or the webhook not answering: the pass stops
            raise PassFailed(f"{_key(run)}: {err.status} {err.reason}") from err

    async def _rewrap(self, run: dict[str, Any], report: PassReport) -> dict[str, Any]:
        meta = run["metadata"]
        annotation = (meta.get("annotations") or {}).get(DATA_KEY_ANNOTATION)
        if not isinstance(annotation, str) or data_key_id(annotation) == self.keyring.active_key_id:
            return run
        try:
            rewrapped = rewrap(self.keyring, annotation, meta["namespace"], meta["name"], entropy=os.urandom)
        except UndecryptableError as err:  # the engine quarantines the run when it needs the key
            log.warning("key rotation: %s: %s", _key(run), err)
            raise _Skip("undecryptable") from err
        if rewrapped is None:
            return run
        body = {
            "metadata": {
                "resourceVersion": meta["resourceVersion"],
                "annotations": {DATA_KEY_ANNOTATION: rewrapped},
            }
        }
        await self._pace()
        out = await self.store.patch(run, body)
        if (out["metadata"].get("annotations") or {}).get(DATA_KEY_ANNOTATION) != rewrapped:
            raise _Skip("put-back")  # the admission webhook kept the old one (another keyring?)
        report.wrote("data_key")
        return out

    async def _restamp(self, run: dict[str, Any], report: PassReport) -> None:
        status = run.get("status") or {}
        checkpoint = status.get("checkpoint")
        run_id = status.get("runId") or run["metadata"]["uid"]
        out = dict(status)
        if isinstance(checkpoint, dict) and needs_restamp(checkpoint, self.keyring.active_key_id):
            restamped = restamp_stored(checkpoint, self.keyring, run_id, entropy=os.urandom)
            if restamped is None:
                raise _Skip("unverified")  # left as it is: the engine quarantines what does not verify
            out["checkpoint"] = restamped
        position = _restamped_position(self.keyring, run_id, status)
        if position is not None:
            out["positionStamp"] = position
        if out == status:
            return
        await self._pace()
        await self.store.commit_status(run, out)
        report.wrote("checkpoint")

    async def _restamp_record(self, record: dict[str, Any], report: PassReport) -> None:
        """An ActionRecord's outcome stamp under the active key, if it verifies under an older one
        (ONE status write of the same status: the store stamps it with the active key)."""
        status = record.get("status") or {}
        if stamp_key_id(status.get("stamp")) in (None, self.keyring.active_key_id):
            return
        try:
            parsed = ActionRecordStatus.model_validate(status)
            name, key = record["metadata"]["name"], record["spec"]["idempotencyKey"]
        except (ValidationError, KeyError):
            return
        if not outcome_verifies(self.keyring, name, key, parsed):
            report.skip("unverified")  # never blessed anew: the dispatcher reconciles it by query
            return
        await self._pace()
        try:
            await self.records.commit_status(record, status)
        except (Conflict, Gone):
            report.skip("conflict")  # the dispatcher wrote it meanwhile: stamped with the active key
            return
        report.wrote("action_record")

    async def _pace(self) -> None:
        """At most ``writes_per_second`` writes, evenly spaced."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._next_write > now:
            await asyncio.sleep(self._next_write - now)
        self._next_write = max(now, self._next_write) + 1.0 / self.config.writes_per_second


class PassFailed(Exception):
    """A write failed for another reason than a conflict: the pass stops, and runs again soon."""


class _Skip(Exception):
    """This run is left for a later pass (or for the engine); the message is the reason."""


def _restamped_position(keyring: Keyring, run_id: str, status: dict[str, Any]) -> str | None:
    """The status's position stamp under the active key, if it verifies under an older one."""
    stamp = status.get("positionStamp")
    if not isinstance(stamp, str) or stamp_key_id(stamp) in (None, keyring.active_key_id):
        return None  # most runs, on every pass: known without validating the status
    try:
        parsed = AgentRunStatus.model_validate({k: v for k, v in status.items() if k != "checkpoint"})
    except ValidationError:
        return None  # the engine's to quarantine
    return restamped_position(keyring, run_id, parsed)


def _key(run: dict[str, Any]) -> str:
    meta = run.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"
