"""Fault injection for the recovery tests: die or freeze at a chosen write. Inert by default.

Configured once at start-up (the operator's configuration installs them):
``DURABLE_AGENTS_TEST_KILL_AT=before:N`` (or ``after:N``) sends SIGKILL to this process right
before (after) its Nth successful write of record: run status commits, action-record creations
and action status writes, counted together in the order they happen.
``DURABLE_AGENTS_TEST_STOP_AT`` sends SIGSTOP instead, to make a zombie worker.
``DURABLE_AGENTS_TEST_OOM_AT`` allocates memory instead, until the kernel's OOM killer ends the
process at its container's memory limit: once per container filesystem (a marker file in the
temporary directory, which a Pod's restarted container keeps), so the restarted operator goes on.
``DURABLE_AGENTS_TEST_STOP_BEFORE_SEND=1`` sends SIGSTOP to this process once, as its dispatcher
is about to send its first effect request (after the claim and the query, before the last check
that the claim still holds): a dispatcher paused mid-dispatch.
``DURABLE_AGENTS_TEST_COMMIT_DELAY=0.3`` makes each run commit wait that long first, like slow
bounded work (a model call), so a test can catch a worker mid-step; each held write logs
``test hook: commit to NS/NAME held``, so a test can await it.
``DURABLE_AGENTS_TEST_HOLD_INTERPRETER=PREFIX:SECONDS`` makes the first commit of a run whose name
starts with PREFIX hold this process's interpreter lock (the GIL) for SECONDS, in one C call that
never lets it go, as a long pydantic validation or JSON encoding of a large run does: nothing else
in the process runs meanwhile, no thread either. Logged ``test hook: commit to NS/NAME holds the
interpreter lock`` before and ``test hook: interpreter lock released`` after (once per process).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


OOM_MARKER = "durable-agents-test-oom-fired"
OOM_CHUNK = 64 << 20  # bytes per allocation: filled, so resident at once (not lazily mapped zeros)
OOM_CAP = 8 << 30  # a memory limit not enforced: stop here and say so, never eat the machine


@dataclass(frozen=True)
class Trigger:
    phase: str  # "before" or "after"
    nth: int
    sig: signal.Signals | None  # None: exhaust memory (TEST_OOM_AT)

    @classmethod
    def parse(cls, text: str, sig: signal.Signals | None) -> Trigger:
        phase, _, nth = text.partition(":")
        if phase not in ("before", "after") or not nth.isdigit() or int(nth) < 1:
            raise ValueError(f"expected before:N or after:N with N >= 1, got {text!r}")
        return cls(phase, int(nth), sig)


@dataclass(frozen=True)
class Hold:
    """Hold the interpreter lock at the first commit of a run named ``prefix``..., for ``seconds``."""

    prefix: str
    seconds: int

    @classmethod
    def parse(cls, text: str) -> Hold:
        prefix, _, seconds = text.rpartition(":")
        if not prefix or not seconds.isdigit() or int(seconds) < 1:
            raise ValueError(f"expected PREFIX:SECONDS with SECONDS >= 1, got {text!r}")
        return cls(prefix, int(seconds))


def hold_interpreter(seconds: int) -> None:
    """Sleep in libc through ctypes' PyDLL, which keeps the GIL for the call (CDLL would drop it).
    A signal cuts libc's sleep short (it returns the seconds left): slept again, for those."""
    sleep = ctypes.PyDLL(None).sleep
    sleep.restype = ctypes.c_uint
    left = seconds
    while left > 0:
        left = sleep(ctypes.c_uint(left))


class FaultPoints:
    def __init__(
        self,
        triggers: list[Trigger],
        delay: float = 0.0,
        stop_before_send: bool = False,
        hold: Hold | None = None,
    ) -> None:
        self.triggers = triggers
        self.delay = delay
        self.stop_before_send = stop_before_send
        self.hold = hold
        self.commits = 0
        self._lock: asyncio.Lock | None = None

    def serialized(self) -> contextlib.AbstractAsyncContextManager[object]:
        """With a trigger set, one write at a time, so "the Nth write" means one write.

        The run worker and the dispatcher write concurrently; without this, which write is the
        Nth would depend on scheduling. Inert (no lock) when no trigger is configured.
        """
        if not self.triggers:
            return contextlib.nullcontext()
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def hold_at_commit(self, namespace: str, name: str) -> None:
        """The interpreter-lock hold, if this commit is the one asked for (once per process)."""
        hold = self.hold
        if hold is None or not name.startswith(hold.prefix):
            return
        self.hold = None
        log.info(
            "test hook: commit to %s/%s holds the interpreter lock for %ds", namespace, name, hold.seconds
        )
        hold_interpreter(hold.seconds)
        log.info("test hook: interpreter lock released")

    def before_send(self) -> None:
        if self.stop_before_send:
            self.stop_before_send = False  # once: after SIGCONT, later requests go out
            os.kill(os.getpid(), signal.SIGSTOP)

    # Counted in successful writes, so a write refused with 409 does not shift the boundaries.
    def before(self) -> None:
        self._fire("before", self.commits + 1)

    def after(self) -> None:
        self.commits += 1
        self._fire("after", self.commits)

    def _fire(self, phase: str, nth: int) -> None:
        for t in self.triggers:
            if t.phase == phase and t.nth == nth:
                # Once: a write refused after SIGCONT does not count, so the next write would
                # be "the Nth" again and freeze the resumed process a second time.
                self.triggers = [other for other in self.triggers if other is not t]
                if t.sig is None:
                    exhaust_memory(Path(tempfile.gettempdir()) / OOM_MARKER)
                else:
                    os.kill(os.getpid(), t.sig)


def exhaust_memory(marker: Path) -> None:
    """Allocate until the kernel's OOM killer ends this process (its container's memory limit),
    unless ``marker`` says it already happened in this container's filesystem. If nothing stops it
    by :data:`OOM_CAP`, SIGKILL, with an error saying the limit was not enforced."""
    try:
        marker.touch(exist_ok=False)
    except FileExistsError:
        log.info("test hook: out of memory already, before this restart (%s): going on", marker)
        return
    log.warning("test hook: allocating memory until the OOM killer ends this process")
    held: list[bytes] = []
    while len(held) * OOM_CHUNK < OOM_CAP:
        held.append(b"\x01" * OOM_CHUNK)
    log.error("test hook: %d GiB allocated and not killed: no memory limit is enforced", OOM_CAP >> 30)
    os.kill(os.getpid(), signal.SIGKILL)


_process_faults = FaultPoints([])


def install_faults(points: FaultPoints) -> None:
    """Set this process's fault points (from the operator's configuration, at start-up)."""
    global _process_faults
    _process_faults = points


def process_faults() -> FaultPoints:
    """The one write counter of this process: run and action-record commits count together."""
    return _process_faults


# --- an internal error on demand (for the test of the worker's bounded retries) ---------------

INTERNAL_ERROR_VARIABLE = "DURABLE_AGENTS_TEST_INTERNAL_ERROR"
"""``=<prefix>``: each commit of a run whose name starts with ``<prefix>`` raises
:class:`InjectedInternalError` right before it is written, as a bug in the operator would."""


class InjectedInternalError(RuntimeError):
    """The exception :func:`inject_internal_error` raises."""


def inject_internal_error(run_name: str, stage: str) -> None:
    """Raise :class:`InjectedInternalError` if the test asked for one for this run. Inert unless
    :data:`INTERNAL_ERROR_VARIABLE` is set (read here, where it is used: one dictionary lookup)."""
    prefix = os.environ.get(INTERNAL_ERROR_VARIABLE)
    if prefix and run_name.startswith(prefix):
        raise InjectedInternalError(f"injected at {stage} ({INTERNAL_ERROR_VARIABLE}={prefix})")
