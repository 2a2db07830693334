"""LangGraph with its SQLite checkpointer (``--variant sqlite``) or its PostgreSQL checkpointer
(``--variant postgres``): a linear graph of 10 nodes, run with ``durability="sync"`` (every
checkpoint is written before the next step starts). Node 5 calls ``interrupt()``; the driver
resumes the thread from outside with ``Command(resume=...)``. Node 8 POSTs to the counting server.

Twenty driver tasks on one event loop keep 20 threads in flight (the async savers: one aiosqlite
connection for SQLite, as the saver is built; a pool of 20 connections for PostgreSQL). The run is
parked when ``ainvoke`` returns with ``__interrupt__`` (its checkpoint is written); ``delivered``
is the moment the resume call is made, ``resumed`` the moment ``interrupt()`` returned in node 5.

Durable commits: PostgreSQL COMMIT records in the WAL (see :mod:`bench.peers.postgres`); SQLite
``COMMIT`` statements seen by the connection's trace callback (WAL journal, ``synchronous=FULL``:
each is flushed with fsync).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypedDict

import aiohttp
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from bench.peers.postgres import CommitCounter
from bench.peers.worker import PeerSystem, serve
from bench.peers.workload import (
    APPROVAL_DECISION,
    APPROVAL_STEP,
    POST_STEP,
    STEPS,
    RepResult,
    RunTiming,
    compute,
    expected_digest,
)


class PeerState(TypedDict):
    run_id: str
    state: str


class LangGraphPeer(PeerSystem):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.variant: str = config["variant"]
        if self.variant not in ("sqlite", "postgres"):
            raise ValueError(f"unknown variant {self.variant!r}")
        self.name = f"langgraph-{self.variant}"
        self.loop = asyncio.new_event_loop()
        self.resumed: dict[str, float] = {}
        self.sqlite_commits = 0
        self._cleanup: list[Callable[[], Awaitable[None]]] = []
        self.counter: CommitCounter | None = None

    # -- the graph ---------------------------------------------------------------------------

    def effect_key(self, run_id: str) -> str:
        return f"{self.name}-{run_id}/step-{POST_STEP}"

    def _node(self, step: int) -> Callable[[PeerState], Awaitable[dict[str, str]]]:
        async def node(s: PeerState) -> dict[str, str]:
            run_id = s["run_id"]
            if step == APPROVAL_STEP:
                decision = interrupt({"run": run_id, "step": step, "asks": "approval"})
                self.resumed[run_id] = time.time()
                if decision != APPROVAL_DECISION:
                    raise RuntimeError(f"no approval: resumed with {decision!r}")
                return {"state": compute(s["state"], run_id, step, decision)}
            if step == POST_STEP:
                key = self.effect_key(run_id)
                async with self.http.post(
                    f"{self.refsystem_url}/effects",
                    json={"run": run_id, "state": s["state"]},
                    headers={"Idempotency-Key": key},
                ) as response:
                    response.raise_for_status()
                    receipt = str((await response.json())["receipt"])
                return {"state": compute(s["state"], run_id, step, receipt)}
            return {"state": compute(s["state"], run_id, step)}

        return node

    def _build(self, saver: BaseCheckpointSaver[Any]) -> Any:
        builder = StateGraph(PeerState)
        previous = START
        for step in range(1, STEPS + 1):
            builder.add_node(f"step{step}", self._node(step))  # type: ignore[call-overload]
            builder.add_edge(previous, f"step{step}")
            previous = f"step{step}"
        builder.add_edge(previous, END)
        return builder.compile(checkpointer=saver)

    # -- setup -------------------------------------------------------------------------------

    def setup(self) -> dict[str, Any]:
        return self.loop.run_until_complete(self._setup())

    async def _setup(self) -> dict[str, Any]:
        self.http = aiohttp.ClientSession()
        self._cleanup.append(self.http.close)
        facts: dict[str, Any] = {"durability": "sync"}
        saver: BaseCheckpointSaver[Any]
        if self.variant == "sqlite":
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            path = Path(self.config["work_dir"]) / "langgraph.sqlite"
            conn = await aiosqlite.connect(str(path))
            self._cleanup.append(conn.close)
            sqlite_saver = AsyncSqliteSaver(conn)
            await sqlite_saver.setup()  # journal_mode=WAL
            await conn.execute("PRAGMA synchronous=FULL")
            async with conn.execute("PRAGMA journal_mode") as cur:
                journal = (await cur.fetchone() or ["?"])[0]
            async with conn.execute("PRAGMA synchronous") as cur:
                sync = (await cur.fetchone() or [-1])[0]
            if journal != "wal" or sync != 2:
                raise RuntimeError(f"SQLite is not durable here: journal_mode={journal} synchronous={sync}")
            await conn.set_trace_callback(self._trace)
            facts.update(
                sqlite={
                    "path": str(path),
                    "journal_mode": journal,
                    "synchronous": "FULL",
                    "lib": sqlite3.sqlite_version,
                }
            )
            saver = sqlite_saver
            versions = ["langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "aiosqlite"]
        else:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg.rows import dict_row
            from psycopg_pool import AsyncConnectionPool

            pg = self.config["postgres"]
            self.counter = CommitCounter(pg)
            url = f"postgresql://postgres@127.0.0.1:{pg['port']}/langgraph_bench"
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                conninfo=url,
                min_size=1,
                max_size=20,
                open=False,
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            )
            await pool.open(wait=True)
            self._cleanup.append(pool.close)
            pg_saver = AsyncPostgresSaver(pool)
            await pg_saver.setup()
            facts.update(postgresPool={"max_size": 20, "autocommit": True})
            saver = pg_saver
            versions = [
                "langgraph",
                "langgraph-checkpoint",
                "langgraph-checkpoint-postgres",
                "psycopg",
                "psycopg-pool",
            ]
        self.graph = self._build(saver)
        facts["versions"] = {name: importlib.metadata.version(name) for name in versions}
        facts["mapping"] = "a linear StateGraph of 10 nodes; interrupt() in node 5; node 8 the POST"
        return facts

    def _trace(self, statement: str) -> None:
        if statement.strip().upper().startswith(("COMMIT", "END")):
            self.sqlite_commits += 1

    # -- one repetition ----------------------------------------------------------------------

    async def _one(self, run_id: str) -> RunTiming:
        timing = RunTiming(run_id=run_id, key=self.effect_key(run_id))
        config: dict[str, Any] = {"configurable": {"thread_id": run_id}}
        try:
            timing.started = time.time()
            first = await self.graph.ainvoke({"run_id": run_id, "state": ""}, config, durability="sync")
            if "__interrupt__" not in first:
                raise AssertionError(f"the graph did not stop at its interrupt: {sorted(first)}")
            timing.paused = timing.delivered = time.time()
            out = await self.graph.ainvoke(Command(resume=APPROVAL_DECISION), config, durability="sync")
            timing.finished = time.time()
            timing.resumed = self.resumed.pop(run_id)
            if out.get("state") != expected_digest(run_id, timing.key):
                raise AssertionError("the graph's digest differs from the workload's")
            timing.ok = True
        except Exception as err:
            timing.finished = timing.finished or time.time()
            timing.error = f"{type(err).__name__}: {err}"
        return timing

    async def _rep(self, ids: list[str], in_flight: int) -> list[RunTiming]:
        queue = iter(ids)
        done: list[RunTiming] = []

        async def slot() -> None:
            for run_id in queue:
                done.append(await self._one(run_id))

        await asyncio.gather(*(slot() for _ in range(in_flight)))
        return done

    def run_rep(self, rep: int, runs: int, in_flight: int, variant: str | None = None) -> RepResult:
        prefix = f"r{rep}-{uuid.uuid4().hex[:6]}"
        ids = [f"{prefix}-{i}" for i in range(runs)]
        before = self.counter.position() if self.counter else None
        commits_before = self.sqlite_commits
        timings = self.loop.run_until_complete(self._rep(ids, in_flight))
        if self.counter is not None and before is not None:
            detail = self.counter.between(before, self.counter.position())
            commits = float(detail["commit_records"])
        else:
            commits = float(self.sqlite_commits - commits_before)
            detail = {"sqlite_commits": int(commits)}
        return RepResult.from_timings(self.name, rep, timings, in_flight, commits, detail)

    def teardown(self) -> None:
        async def close() -> None:
            for fn in reversed(self._cleanup):
                await fn()

        self.loop.run_until_complete(close())
        self.loop.close()


def main() -> int:
    return serve(LangGraphPeer)


if __name__ == "__main__":
    raise SystemExit(main())
