"""The run worker's own status writes coming back through the watch, recognized by resourceVersion.

A unit of work that commits and then finds that the run waits has decided from exactly the record
it wrote. The watch delivers that record once more, and deciding it again found the same wait,
after a decode of the whole run, the run's checks and a look at its ledger (on the peer workload,
one ActionRecord GET of the three a run cost), and one such unit per parked run at the end of a
burst. The work queue does not process such
a key when that body is its only reason to run (:mod:`durable_agents.shell.ground.workqueue`):
an enqueue without a body (a timer, an ActionRecord's outcome, a child's, a shard taken, a policy
changed) still runs it, and so does any other write to the run (another resourceVersion).

Each entry lives from the unit's end to its echo (taken then, matched or not): a handful at a
time, not one per run.
"""

from __future__ import annotations

from typing import Any

from durable_agents.shell.ground.kube import ObjectKey


class OwnWrites:
    def __init__(self) -> None:
        self._decided: dict[ObjectKey, str] = {}

    def decided(self, key: ObjectKey, record: dict[str, Any]) -> None:
        """The unit ended with the run waiting, decided from ``record`` as stored."""
        version = (record.get("metadata") or {}).get("resourceVersion")
        if version:
            self._decided[key] = str(version)

    def already_decided(self, key: ObjectKey, version: str) -> bool:
        """Whether a body of ``version`` is the record the last unit decided from (asked once)."""
        return self._decided.pop(key, None) == version

    def forget(self, key: ObjectKey) -> None:
        self._decided.pop(key, None)

    def __len__(self) -> int:
        return len(self._decided)
