"""The worker's one rule for an exception in a run's unit of work: retry it a bounded number of
times with exponential backoff, then quarantine the run (``InternalError``). Never an endless
traceback loop, never silence.

Counted in memory, per run and per state version (a run that moved on starts again from zero;
a unit that finishes clears the count; a restart of the operator does too, so at most
``max_attempts`` tracebacks per run and process life). Errors of the API server's transport
(5xx, 429, a connection refused or cut) are not the run's fault: they are retried with a capped
backoff, one warning line each, and never quarantine a run (the quarantine's own write would
fail the same way).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kubernetes.client.rest import ApiException

from durable_agents.core.engine import RunSnapshot
from durable_agents.shell.ground.kube import ObjectKey

log = logging.getLogger("durable_agents.shell.runs.worker")
MAX_ATTEMPTS = 5
FIRST_BACKOFF = 1.0  # seconds; doubled after each failure: 1, 2, 4, 8, then quarantine
TRANSIENT_BACKOFF_CAP = 60.0


def transient(err: BaseException) -> bool:
    """An error of the way to the API server, not of the run: worth waiting out, never quarantined."""
    if isinstance(err, ApiException):
        return not err.status or err.status == 429 or err.status >= 500
    if isinstance(err, ConnectionError | TimeoutError):
        return True
    # urllib3 (the Kubernetes client's transport) is not a dependency of ours: known by module.
    return any(cls.__module__.startswith("urllib3") for cls in type(err).__mro__)


def describe(err: BaseException) -> str:
    """The exception's type and message, as an InternalError's message carries it."""
    text = str(err).strip().replace("\n", " ")
    return f"{type(err).__name__}: {text[:1500]}" if text else type(err).__name__


@dataclass
class Where:
    """How far a unit of work got: its stage, and the state and transition it was at."""

    stage: str
    state: str = ""
    version: int = 0
    event: str | None = None

    def describe(self) -> str:
        if self.event:
            return f"{self.stage} of the transition {self.state} --{self.event}-->"
        return self.stage  # the message names the state (and version) beside it


@dataclass(frozen=True)
class Verdict:
    attempts: int  # failures counted at this state version (0: transient, not counted)
    delay: float  # seconds until the next try
    quarantine: bool
    where: Where


@dataclass
class Failures:
    max_attempts: int = MAX_ATTEMPTS
    first_backoff: float = FIRST_BACKOFF
    where: dict[ObjectKey, Where] = field(default_factory=dict)
    _counted: dict[ObjectKey, tuple[int, int]] = field(default_factory=dict)  # (stateVersion, failures)
    _transient: dict[ObjectKey, int] = field(default_factory=dict)

    def at(
        self, key: ObjectKey, stage: str, run: RunSnapshot | None = None, event: str | None = None
    ) -> None:
        """Note the stage a unit of work is entering (kept for the message if it fails there)."""
        before = self.where.get(key)
        if run is not None:
            self.where[key] = Where(stage, run.state.value, run.status.state_version, event)
        elif before is not None:
            self.where[key] = Where(stage, before.state, before.version, event)
        else:
            self.where[key] = Where(stage)

    def succeeded(self, key: ObjectKey) -> None:
        self.forget(key)

    def forget(self, key: ObjectKey) -> None:
        self.where.pop(key, None)
        self._counted.pop(key, None)
        self._transient.pop(key, None)

    def failed(self, key: ObjectKey, err: BaseException) -> Verdict:
        """Count a failure of ``key``'s unit of work and say what follows: a retry after a delay,
        or the quarantine once ``max_attempts`` failed at the same state version."""
        where = self.where.get(key) or Where("load")
        if transient(err):
            n = self._transient[key] = self._transient.get(key, 0) + 1
            return Verdict(0, min(TRANSIENT_BACKOFF_CAP, self.first_backoff * 2 ** min(n, 6)), False, where)
        version, count = self._counted.get(key, (where.version, 0))
        count = count + 1 if version == where.version else 1
        self._counted[key] = (where.version, count)
        delay = self.first_backoff * 2 ** (count - 1)
        return Verdict(count, delay, count >= self.max_attempts, where)

    def log(self, key: ObjectKey, verdict: Verdict, err: BaseException) -> None:
        """One log record per failure: a warning line for a transient one, else the traceback
        (at most ``max_attempts`` of them per run and state version)."""
        where = verdict.where.describe()
        if not verdict.attempts:
            log.warning(
                "run %s/%s: API server unavailable at %s (%s); again in %.0fs",
                *key,
                where,
                describe(err),
                verdict.delay,
                exc_info=False,
            )
        elif not verdict.quarantine:
            log.error(
                "run %s/%s: failed at %s (attempt %d/%d); again in %.0fs",
                *key,
                where,
                verdict.attempts,
                self.max_attempts,
                verdict.delay,
                exc_info=err,
            )
        else:
            log.error(
                "run %s/%s: failed at %s %d times: quarantining it (InternalError)",
                *key,
                where,
                verdict.attempts,
                exc_info=err,
            )
