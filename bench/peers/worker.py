"""The worker side of the orchestrator protocol: one system per process, driven over stdin/stdout.

The orchestrator starts ``python -m bench.peers.<system> '<json config>'``. The worker sets the
system up and prints one marked JSON line ``{"op": "ready", ...}``; then for every command line
``{"op": "rep", "rep": i, "runs": n, "in_flight": k}`` on stdin it runs one repetition and prints
one marked line with the :class:`~bench.peers.workload.RepResult`; ``{"op": "quit"}`` tears it
down. Libraries may print to stdout too: only lines starting with the mark are protocol.
"""

from __future__ import annotations

import abc
import json
import logging
import sys
import traceback
from typing import Any

from bench.peers.workload import RESULT_MARK, RepResult


class PeerSystem(abc.ABC):
    """One system under test."""

    name: str = ""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.refsystem_url: str = config["refsystem_url"]

    @abc.abstractmethod
    def setup(self) -> dict[str, Any]:
        """Start whatever the system needs; return facts for the results (settings, versions)."""

    @abc.abstractmethod
    def run_rep(self, rep: int, runs: int, in_flight: int, variant: str | None = None) -> RepResult:
        """Run ``runs`` runs of the workload with ``in_flight`` of them in flight at any time;
        ``variant`` selects one of several systems a worker serves (durable-agents' mappings)."""

    def teardown(self) -> None:  # noqa: B027 (optional hook)
        """Stop what :meth:`setup` started."""


def reply(message: dict[str, Any]) -> None:
    sys.stdout.write(RESULT_MARK + json.dumps(message) + "\n")
    sys.stdout.flush()


def serve(system_class: type[PeerSystem], argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = sys.argv[1:] if argv is None else argv
    config: dict[str, Any] = json.loads(args[0])
    system = system_class(config)
    try:
        info = system.setup()
    except Exception:
        reply({"op": "error", "error": traceback.format_exc()})
        return 1
    reply({"op": "ready", "info": info})
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            command = json.loads(line)
            if command["op"] == "quit":
                break
            if command["op"] != "rep":
                reply({"op": "error", "error": f"unknown command {command!r}"})
                continue
            try:
                result = system.run_rep(
                    int(command["rep"]),
                    int(command["runs"]),
                    int(command["in_flight"]),
                    command.get("variant"),
                )
            except Exception:
                reply({"op": "error", "error": traceback.format_exc()})
                continue
            reply({"op": "result", "result": result.to_json()})
    finally:
        system.teardown()
    return 0
