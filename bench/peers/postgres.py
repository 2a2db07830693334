"""A throwaway PostgreSQL cluster for the peers (initdb + pg_ctl in a temporary directory), and an
exact count of the durable commits made in a window.

Durability is on and checked: ``fsync=on``, ``synchronous_commit=on``, ``full_page_writes=on``.
Commits are counted from the WAL itself: every top-level transaction that wrote anything ends in a
``COMMIT`` record of the Transaction resource manager, and with ``synchronous_commit=on`` the commit
waits for that record to be flushed (group commit may share one flush between several). Read-only
transactions write no commit record, so they are not durable commits and are not counted.
``pg_stat_database.xact_commit`` would count them, and it is flushed lazily by idle backends.
The next transaction ID (``pg_snapshot_xmax``) is read too, as a cross-check.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

DATABASES = ("dbos_bench", "langgraph_bench")
SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "listen_addresses": "127.0.0.1",
    "max_connections": "200",
    "shared_buffers": "256MB",
    # Keep the WAL of a whole benchmark, so every window can be read back with pg_waldump.
    "wal_keep_size": "2048",
    "max_wal_size": "4GB",
}


def find_bin_dir() -> Path | None:
    """The newest Debian PostgreSQL server's bin directory, or PG_BIN_DIR / pg_config's."""
    if env := os.environ.get("PG_BIN_DIR"):
        return Path(env)
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3].split(".")[0])
    )
    if found:
        return Path(found[-1]).parent
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class WalPosition:
    lsn: str
    next_xid: int


class ThrowawayPostgres:
    """One PostgreSQL cluster in a fresh temporary directory, removed by :meth:`stop`. As root, the
    server runs as the ``postgres`` system user (PostgreSQL refuses to run as root), so the
    directory is made directly in the system's temporary directory, which that user can reach."""

    def __init__(self, bin_dir: Path | None = None) -> None:
        found = bin_dir or find_bin_dir()
        if found is None:
            raise RuntimeError(
                "no PostgreSQL server found: install Debian's postgresql package "
                "(apt-get install -y postgresql) or set PG_BIN_DIR"
            )
        self.bin_dir = found
        self.base_dir = Path(tempfile.mkdtemp(prefix="peers-postgres-"))
        self.data_dir = self.base_dir / "pgdata"
        self.socket_dir = self.base_dir / "sock"
        self.log_path = self.base_dir / "postgres.log"
        self.port = _free_port()
        self._as_user: list[str] = []
        self.started = False

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([*self._as_user, *argv], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        return out

    def start(self) -> ThrowawayPostgres:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> ThrowawayPostgres:
        self.socket_dir.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")  # created by Debian's postgresql-common
            for path in (self.base_dir, self.socket_dir):
                os.chown(path, user.pw_uid, user.pw_gid)
            self._as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-locale",
        )
        options = " ".join(f"-c {k}={v}" for k, v in SETTINGS.items())
        options += f" -c port={self.port} -c unix_socket_directories={self.socket_dir}"
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_path),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        )
        self.started = True
        atexit.register(self.stop)  # never leave a server behind, even when the caller crashes
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            for db in DATABASES:
                conn.execute(f"CREATE DATABASE {db}")
        return self

    def stop(self) -> None:
        if self.started:
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop")
            self.started = False
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def url(self, db: str, driver: str = "postgresql") -> str:
        return f"{driver}://postgres@127.0.0.1:{self.port}/{db}"

    def postmaster_pid(self) -> int:
        return int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])

    def facts(self) -> dict[str, Any]:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            names = ["server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method"]
            shown = {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in names}  # type: ignore[index]
        for name in ("fsync", "synchronous_commit"):
            if shown[name] != "on":
                raise RuntimeError(f"PostgreSQL {name} is {shown[name]!r}, the benchmark needs it on")
        return {"bin_dir": str(self.bin_dir), "port": self.port, **shown}

    def descriptor(self) -> dict[str, Any]:
        """What a worker process needs to count commits itself (see :class:`CommitCounter`)."""
        return {
            "port": self.port,
            "wal_dir": str(self.data_dir / "pg_wal"),
            "waldump": str(self.bin_dir / "pg_waldump"),
        }


_COMMIT = re.compile(r"rmgr: Transaction .*desc: COMMIT")


class CommitCounter:
    """Durable commits between two positions of the WAL of one cluster (all databases)."""

    def __init__(self, descriptor: dict[str, Any]) -> None:
        self.url = f"postgresql://postgres@127.0.0.1:{descriptor['port']}/postgres"
        self.wal_dir = descriptor["wal_dir"]
        self.waldump = descriptor["waldump"]

    def position(self) -> WalPosition:
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_current_wal_lsn()::text, pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
            ).fetchone()
        assert row is not None
        return WalPosition(lsn=str(row[0]), next_xid=int(row[1]))

    def between(self, start: WalPosition, end: WalPosition) -> dict[str, Any]:
        """COMMIT records in [start, end), the transaction IDs assigned, and WAL bytes written."""
        if start.lsn == end.lsn:
            commits = 0
        else:
            out = subprocess.run(
                [self.waldump, "-p", self.wal_dir, "-s", start.lsn, "-e", end.lsn, "-r", "Transaction"],
                capture_output=True,
                text=True,
                check=False,
            )
            # pg_waldump may complain at the end of the valid WAL of the last segment; the records
            # it printed up to `-e` are complete. No output at all is a failure.
            if out.returncode != 0 and not out.stdout:
                raise RuntimeError(f"pg_waldump failed: {out.stderr.strip()}")
            commits = sum(1 for line in out.stdout.splitlines() if _COMMIT.search(line))
        return {
            "commit_records": commits,
            "xids_assigned": end.next_xid - start.next_xid,
            "wal_bytes": _lsn(end.lsn) - _lsn(start.lsn),
        }


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)
