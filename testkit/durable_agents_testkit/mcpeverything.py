"""The MCP project's reference server for client builders, ``@modelcontextprotocol/server-everything``
(issue 36, item 6), installed from npm at the version pinned by ``everything/package-lock.json``
and run on its streamable HTTP transport.

:func:`install` runs ``npm ci`` (no global install, no scripts) into a cache folder named by the
lock file's digest, once per machine and lock; :class:`EverythingServer` starts
``mcp-server-everything streamableHttp`` with ``PORT`` set to a free port and waits until it
listens. Node.js 20 and npm must be on the PATH (``/usr/bin/node``, ``/usr/bin/npm`` in CI).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path
from types import TracebackType
from typing import Final

from durable_agents_testkit.scrape import free_port

PINNED: Final = Path(__file__).parent / "everything"
PACKAGE: Final = "@modelcontextprotocol/server-everything"
VERSION: Final = "2026.8.31"
_CACHE = Path(os.environ.get("DURABLE_AGENTS_CACHE") or Path.home() / ".cache" / "durable-agents")


def _cache_dir() -> Path:
    lock = (PINNED / "package-lock.json").read_bytes()
    return _CACHE / f"mcp-everything-{hashlib.sha256(lock).hexdigest()[:16]}"


def install() -> Path:
    """The installed server's entry point (``dist/index.js``); ``npm ci`` first if this lock was
    never installed here. A file lock serializes concurrent test processes."""
    target = _cache_dir()
    entry = target / "node_modules" / PACKAGE / "dist" / "index.js"
    done = target / ".installed"
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            for name in ("package.json", "package-lock.json"):
                shutil.copyfile(PINNED / name, target / name)
            npm = shutil.which("npm")
            if npm is None:
                raise RuntimeError(
                    "npm is not on the PATH: Node.js 20 and npm are needed for server-everything"
                )
            proc = subprocess.run(
                [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
                cwd=target,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"npm ci of {PACKAGE} failed in {target}:\n{proc.stderr[-4000:]}")
            done.write_text(VERSION)
    if not entry.exists():
        raise RuntimeError(f"{entry} is missing after npm ci; remove {target} and retry")
    return entry


class EverythingServer:
    """``mcp-server-everything streamableHttp`` on a free port, as a context manager; ``url`` is
    its MCP endpoint. Its stdout and stderr are kept (:meth:`output`) for failure messages."""

    def __init__(self, entry: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._entry = entry
        self._lines: list[str] = []
        self._ready = threading.Event()
        self._proc: subprocess.Popen[str] | None = None

    def output(self) -> str:
        return "".join(self._lines[-200:])

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.append(line)
            if f"listening on port {self.port}" in line:
                self._ready.set()

    def __enter__(self) -> EverythingServer:
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("node is not on the PATH: Node.js 20 is needed for server-everything")
        env = {**os.environ, "PORT": str(self.port)}
        self._proc = subprocess.Popen(
            [node, str(self._entry), "streamableHttp"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, args=(self._proc,), daemon=True).start()
        if not self._ready.wait(60):
            self.__exit__(None, None, None)
            raise RuntimeError(
                f"server-everything did not listen on {self.port} within 60 s:\n{self.output()}"
            )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
