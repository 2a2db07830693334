"""The console's browser tests: Debian's headless chromium driven by Playwright, and consoles
started as ``kubectl agentrun console`` by users with their own kubeconfigs.

Playwright never downloads a browser here: it starts ``/usr/bin/chromium`` (``make chromium``
installs Debian's package) with the flags that keep it off the network (no background
networking, component updates or sync: this machine's network is closed, and each refused
connection costs). Each user gets a fresh browser context (its own cookies).
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

CHROMIUM: Final = Path(os.environ.get("CONSOLE_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
# make console-screenshots: the tests save their screenshots here (docs/approving/img/). Not named
# DURABLE_AGENTS_*: the operator processes the tests start refuse unknown variables of that prefix.
SCREENSHOTS: Final = os.environ.get("CONSOLE_SCREENSHOTS")


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A Playwright Browser on Debian's chromium."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is missing: make chromium (Debian's chromium package)")
    with sync_playwright() as driver:
        browser = driver.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=list(CHROMIUM_ARGS)
        )
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Console:
    """A ``kubectl agentrun console`` process of one user: its URL (with the one-time token)."""

    process: subprocess.Popen[str]
    sign_in_url: str
    log: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return self.sign_in_url.split("/sign-in", 1)[0]

    def stop(self) -> str:
        """Stop it; everything it wrote (stdout and stderr: its log)."""
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return "\n".join(self.log)


def start_console(kubeconfig: Path, namespace: str, timeout: float = 90.0) -> Console:
    """``kubectl agentrun console -n NAMESPACE`` as the user of ``kubeconfig``; waits for its URL."""
    argv = [sys.executable, "-m", "durable_agents.kubectl.main", "console", "-n", namespace]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            process.kill()
            raise AssertionError(f"the console printed no URL within {timeout}s: {seen}") from None
        seen.append(line)
        if "/sign-in?token=" in line:
            url = line[line.index("http://") :].strip()
            console = Console(process, url, seen)
            threading.Thread(target=_collect, args=(lines, console.log), daemon=True).start()
            return console


def _collect(lines: queue.Queue[str], log: list[str]) -> None:
    while True:
        log.append(lines.get())
