"""The operator as a separate OS process, for e2e tests: start, kill, freeze, thaw, read its log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import keyring_env

READY_LINE = "durable-agents worker"


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: Path,
        log_dir: Path,
        *,
        name: str = "operator",
        lease_duration: int = 3,
        env: dict[str, str] | None = None,
        identity: str | None = None,
    ) -> None:
        self.identity = identity or f"{name}-{uuid.uuid4().hex[:6]}"
        self.kubeconfig = kubeconfig
        self.log_path = log_dir / f"{self.identity}.log"
        self.lease_duration = lease_duration
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def environment(self) -> dict[str, str]:
        """The process environment: this one's, the cluster, identity, lease and the session's
        sealing keys, then the extras."""
        return {
            **os.environ,
            **keyring_env(),
            "KUBECONFIG": str(self.kubeconfig),
            "DURABLE_AGENTS_IDENTITY": self.identity,
            "DURABLE_AGENTS_LEASE_DURATION": str(self.lease_duration),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }

    def await_ready(self, timeout: float) -> None:
        eventually(self._ready_or_dead, timeout, f"operator {self.identity} to start")
        # Dead before the ready line is a failed start. Dead after it is a started process that
        # ended (a chaos victim's kill hook may fire before this poll runs): the caller judges it.
        if not self.alive and not self._was_ready():
            raise RuntimeError(f"operator {self.identity} exited at start:\n{self.log_tail()}")

    def start(self, timeout: float = Within.TAKEOVER) -> OperatorProcess:
        env = self.environment()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "durable_agents_controllers"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.await_ready(timeout)
        return self

    def _was_ready(self) -> bool:
        return self.log_path.exists() and READY_LINE in self.log_path.read_text()

    def _ready_or_dead(self) -> bool:
        return not self.alive or self._was_ready()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait_exit(10)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def wait_killed(self, timeout: float) -> int:
        """Wait for a test hook to kill this process; fail with its log if it does not happen."""
        try:
            code = self.wait_exit(timeout)
        except subprocess.TimeoutExpired:
            log = self.log_tail(60)
            raise AssertionError(
                f"operator {self.identity} not killed within {timeout:.0f}s; log:\n{log}"
            ) from None
        assert code < 0, f"operator {self.identity} exited with {code}, not by a signal:\n{self.log_tail(60)}"
        return code

    def stopped(self) -> bool:
        """True when the process is frozen by SIGSTOP (state T in /proc)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] == "T"

    def stop(self) -> None:
        if self.alive:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.wait_exit(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def logged(self, text: str, times: int = 1) -> bool:
        """Whether ``text`` appears in this process's log so far (at least ``times`` times)."""
        return self.log_path.exists() and self.log_path.read_text().count(text) >= times

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text().splitlines()[-lines:])
