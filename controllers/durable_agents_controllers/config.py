"""The operator's configuration: every ``DURABLE_AGENTS_*`` variable, read once at start-up.

:data:`VARIABLES` is the one list of the variables (the table of docs/operate/configuration.md is
checked against it).
:meth:`OperatorConfig.from_env` parses them into typed values; a malformed value, or a
``DURABLE_AGENTS_*`` variable nobody reads (a typo would otherwise be silently ignored), stops
start-up with a message naming the variable. Nothing else in the operator reads the environment
for its own settings (``KUBECONFIG`` and the ``KUBERNETES_SERVICE_*`` variables of a Pod are the
Kubernetes client's).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from durable_agents import __version__
from durable_agents.core.durations import InvalidDuration, parse_duration
from durable_agents.core.regions import DEFAULT_REGION, REGION_EXPECTED, region_problem
from durable_agents.core.sealing import Keyring, KeyringError
from durable_agents.shell.ground.faults import FaultPoints, Hold, Trigger
from durable_agents.shell.keys.keyring import load_keyring
from durable_agents.shell.runs.worker import new_identity

PREFIX = "DURABLE_AGENTS_"
T = TypeVar("T")


class Reader(StrEnum):
    """Who reads a variable: the operator, or only the test kit (which the operator ignores)."""

    OPERATOR = "operator"
    FAULTS = "operator, tests only"  # fault injection: inert unless set
    TEST_KIT = "test kit"


@dataclass(frozen=True)
class Variable:
    suffix: str  # the name after DURABLE_AGENTS_
    default: str
    meaning: str
    reader: Reader = Reader.OPERATOR

    @property
    def name(self) -> str:
        return PREFIX + self.suffix


FAULTS, TEST_KIT = Reader.FAULTS, Reader.TEST_KIT
VARIABLES: tuple[Variable, ...] = (
    Variable("NAMESPACE", "(all)", "watch and serve one namespace only"),
    Variable("IDENTITY", "host-pid-random", "this process's name in Leases and claims"),
    Variable("LEASE_DURATION", "15", "seconds a shard or member Lease is valid; takeover after it"),
    Variable("REGION", DEFAULT_REGION, "the region this deployment serves (a DNS label); new runs' default"),
    Variable(
        "SHARDS", "16", "shard Leases of the region: its runs are spread over the live replicas by them"
    ),
    Variable(
        "LEASE_NAMESPACE",
        "(the Pod's, else NAMESPACE, else default)",
        "namespace of the region's shard and member Leases",
    ),
    Variable("WORKERS", "8", "runs worked on at once by this process (`0`: webhook or dispatcher only)"),
    Variable("OPERATOR_VERSION", __version__, "version stamped into checkpoints"),
    Variable(
        "TRANSITIONS_PER_WRITE",
        "16",
        "most transitions one status write carries (commits are at semantic boundaries; `1`: one each)",
    ),
    Variable("EVENTS", "notable", "`notable` or `all`: which transitions get a Kubernetes Event"),
    Variable("DISPATCHER", "on", "`on` or `off`: whether this process dispatches intents"),
    Variable(
        "FIRST_CLAIM",
        "on",
        "`on` or `off`: intents this process creates are sent by its own dispatcher without a claim write",
    ),
    Variable("DISPATCH_TIMEOUT", "5", "seconds before a dispatch's answer is an unknown outcome"),
    Variable("METRICS_PORT", "(off)", "port of the Prometheus metrics endpoint"),
    Variable(
        "LOG_LEVEL",
        "INFO",
        "`DEBUG`, `INFO`, `WARNING` or `ERROR` (the webhook's line per admission review only at `DEBUG`: "
        "the API server's audit log records each)",
    ),
    Variable("LOG_FORMAT", "text", "`text` or `json` (one JSON object a line; the chart sets `json`)"),
    Variable("WATCH_TIMEOUT", "300", "seconds of one watch request before it is renewed"),
    Variable("LIST_CHUNK", "200", "page size of list requests (bounds the start-up memory peak)"),
    Variable("WEBHOOK_PORT", "(off)", "port of the admission webhook (stamps and approvals)"),
    Variable("WEBHOOK_HOST", "127.0.0.1", "address the admission webhook listens on"),
    Variable(
        "WEBHOOK_SERVICE",
        "(off: a URL)",
        "in a cluster: the Service in front of the webhook (in LEASE_NAMESPACE); its certificate is shared",
    ),
    Variable("WEBHOOK_SERVICE_PORT", "443", "the port of WEBHOOK_SERVICE"),
    Variable(
        "WEBHOOK_CERT_SECRET",
        "(WEBHOOK_SERVICE-tls)",
        "Secret holding the webhook's CA and serving certificate (made and renewed by the operator)",
    ),
    Variable(
        "WEBHOOK_CERT_ISSUER",
        "operator",
        "who issues WEBHOOK_CERT_SECRET: `operator` (made, renewed) or `cert-manager` (only read)",
    ),
    Variable(
        "WEBHOOK_CONFIGURATION",
        "durable-agents[-NAMESPACE]",
        "name of the Mutating/ValidatingWebhookConfigurations the operator keeps current",
    ),
    Variable("HEALTH_PORT", "(off)", "port of /healthz (alive) and /readyz (webhook serving, caches synced)"),
    Variable("SEALING_KEYS_DIR", "(required)", "directory of sealing and stamping keys (a mounted Secret)"),
    Variable("SEALING_ACTIVE_KEY", "(required)", "key ID that seals and stamps new values"),
    Variable("RESEAL_INTERVAL", "10m", "how often the key rotation pass runs (also once at start-up)"),
    Variable("RESEAL_WRITES_PER_SECOND", "20", "most writes per second of the key rotation pass"),
    Variable("TRACEMALLOC", "0", "`1`: SIGUSR1 also logs where live memory was allocated"),
    Variable("STUCK_CHECK_SECONDS", "10", "seconds between passes of the stuck-run check over owned runs"),
    Variable("STUCK_AFTER", "24h", "how long a wait without expiry may last before the run is Stuck"),
    *(
        Variable(
            f"STUCK_{state.upper()}_AFTER",
            "10m",
            f"how long a run may stay {state} unadvanced (NotAdvancing)",
        )
        for state in ("pending", "ready", "resume_validation", "cancel_requested")
    ),
    Variable("STUCK_UNOWNED_AFTER", "10m", "how long a run nobody alive owns waits before it is Stuck"),
    Variable(
        "STUCK_UNANSWERED_AFTER",
        "10m",
        "how long an action's outcome may stay unknown, its queries unanswered",
    ),
    Variable("NOTIFY_TIMEOUT_SECONDS", "10", "seconds one notification attempt may take, answer included"),
    Variable("NOTIFY_BACKOFF_SECONDS", "1", "seconds before a notification's second attempt (then doubled)"),
    Variable("NOTIFY_BACKOFF_MAX_SECONDS", "60", "the longest pause between two attempts of a notification"),
    Variable("NOTIFY_GIVE_UP_AFTER", "15m", "how long a notification is retried before it is abandoned"),
    Variable("TEST_KILL_AT", "(off)", "`before:N`/`after:N`: SIGKILL at the Nth write", FAULTS),
    Variable("TEST_STOP_AT", "(off)", "`before:N`/`after:N`: SIGSTOP at the Nth write", FAULTS),
    Variable(
        "TEST_OOM_AT",
        "(off)",
        "`before:N`/`after:N`: exhaust memory (the OOM killer) at the Nth write, once per container",
        FAULTS,
    ),
    Variable("TEST_STOP_BEFORE_SEND", "0", "`1`: SIGSTOP before the first effect request", FAULTS),
    Variable("TEST_COMMIT_DELAY", "0", "seconds each run commit waits first", FAULTS),
    Variable(
        "TEST_HOLD_INTERPRETER",
        "(off)",
        "`PREFIX:SECONDS`: the first commit of a run named PREFIX... holds the interpreter lock",
        FAULTS,
    ),
    Variable("TEST_INTERNAL_ERROR", "(off)", "run-name prefix: its commits raise an error", FAULTS),
    Variable("TEST_SCHEDULE_MINUTE", "60", "seconds one AgentSchedule minute lasts (a faster clock)", FAULTS),
    Variable("BIN_DIR", "(built)", "where the control-plane binaries are", TEST_KIT),
    Variable("CACHE", "~/.cache/durable-agents", "cache of built binaries", TEST_KIT),
    Variable("TEST_KUBECONFIG", "(local plane)", "run the suites on this cluster", TEST_KIT),
    Variable("CHAOS_SIZE", "ci", "`ci` or `full`: size of the recovery suite", TEST_KIT),
    Variable("CHAOS_SEED", "(random)", "seed of the recovery suite's choices", TEST_KIT),
    Variable("CHAOS_OUT", "(none)", "where the recovery suite writes its JSON", TEST_KIT),
    Variable("CHAOS_TUNE", "(none)", "overrides of the recovery suite's sizes", TEST_KIT),
    Variable("FUZZ_EXAMPLES", "100", "documents the admission fuzzing test generates", TEST_KIT),
    Variable("FUZZ_OUT", "(none)", "where the admission fuzzing test writes its JSON", TEST_KIT),
)
KNOWN = frozenset(v.name for v in VARIABLES)


class ConfigError(Exception):
    """A variable the operator cannot start with; the message names it."""


POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def pod_namespace() -> str | None:
    """The namespace of the operator's Pod, when it runs in one."""
    try:
        return POD_NAMESPACE_FILE.read_text().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class OperatorConfig:
    namespace: str | None = None
    identity: str = field(default_factory=new_identity)
    lease_duration: int = 15
    workers: int = 8
    operator_version: str = __version__
    all_events: bool = False
    transitions_per_write: int = 16
    dispatcher: bool = True
    first_claim: bool = True
    dispatch_timeout: float = 5.0
    metrics_port: int | None = None
    log_level: str = "INFO"
    log_format: str = "text"
    watch_timeout: int = 300
    list_chunk: int = 200
    webhook_port: int | None = None
    webhook_host: str = "127.0.0.1"
    webhook_service: str | None = None
    webhook_service_port: int = 443
    webhook_cert_secret: str | None = None
    webhook_cert_issuer: str = "operator"
    webhook_configuration: str | None = None
    health_port: int | None = None
    keyring: Keyring = field(repr=False, kw_only=True)
    reseal_interval: float = 600.0
    reseal_writes_per_second: float = 20.0
    tracemalloc: bool = False
    stuck_check_seconds: float = 10.0
    stuck_after: float = 86400.0
    # Per eligible state: seconds without advancing before NotAdvancing; and the unowned bound.
    stuck_bounds: tuple[tuple[str, float], ...] = ()
    stuck_unowned_after: float = 600.0
    stuck_unanswered_after: float = 600.0
    notify_timeout: float = 10.0
    notify_backoff: float = 1.0
    notify_backoff_max: float = 60.0
    notify_give_up: float = 900.0
    region: str = DEFAULT_REGION
    shards: int = 16
    lease_namespace: str = "default"
    faults: FaultPoints = field(default_factory=lambda: FaultPoints([]), repr=False)
    schedule_minute: float = 60.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env
        unknown = sorted(k for k in env if k.startswith(PREFIX) and k not in KNOWN)
        if unknown:
            raise ConfigError(
                f"{', '.join(unknown)}: unknown variable{'s' if len(unknown) > 1 else ''}"
                " (a typo? docs/operate/configuration.md lists every variable)"
            )
        read = _Reader(env)
        if read.text("WEBHOOK_SERVICE") and read.port("WEBHOOK_PORT") is None:
            raise ConfigError(
                f"{PREFIX}WEBHOOK_SERVICE needs {PREFIX}WEBHOOK_PORT (the port the webhook serves on)"
            )
        return cls(
            namespace=read.text("NAMESPACE"),
            identity=read.text("IDENTITY") or new_identity(),
            lease_duration=read.number("LEASE_DURATION", int, 15, minimum=1),
            workers=read.number("WORKERS", int, 8, minimum=0),
            operator_version=read.text("OPERATOR_VERSION") or __version__,
            all_events=read.choice("EVENTS", ("notable", "all"), "notable") == "all",
            transitions_per_write=read.number("TRANSITIONS_PER_WRITE", int, 16, minimum=1),
            dispatcher=read.choice("DISPATCHER", ("on", "off"), "on") == "on",
            first_claim=read.choice("FIRST_CLAIM", ("on", "off"), "on") == "on",
            dispatch_timeout=read.number("DISPATCH_TIMEOUT", float, 5.0, minimum=0.1),
            metrics_port=read.port("METRICS_PORT"),
            log_level=read.choice("LOG_LEVEL", ("DEBUG", "INFO", "WARNING", "ERROR"), "INFO"),
            log_format=read.choice("LOG_FORMAT", ("text", "json"), "text"),
            watch_timeout=read.number("WATCH_TIMEOUT", int, 300, minimum=1),
            list_chunk=read.number("LIST_CHUNK", int, 200, minimum=1),
            webhook_port=read.port("WEBHOOK_PORT"),
            webhook_host=read.text("WEBHOOK_HOST") or "127.0.0.1",
            webhook_service=read.text("WEBHOOK_SERVICE"),
            webhook_service_port=read.port("WEBHOOK_SERVICE_PORT") or 443,
            webhook_cert_secret=read.text("WEBHOOK_CERT_SECRET"),
            webhook_cert_issuer=read.choice("WEBHOOK_CERT_ISSUER", ("operator", "cert-manager"), "operator"),
            webhook_configuration=read.text("WEBHOOK_CONFIGURATION"),
            health_port=read.port("HEALTH_PORT"),
            keyring=read.keyring(),
            reseal_interval=read.duration("RESEAL_INTERVAL", 600.0),
            reseal_writes_per_second=read.number("RESEAL_WRITES_PER_SECOND", float, 20.0, minimum=0.1),
            tracemalloc=read.choice("TRACEMALLOC", ("0", "1"), "0") == "1",
            stuck_check_seconds=read.number("STUCK_CHECK_SECONDS", float, 10.0, minimum=0.1),
            stuck_after=read.duration("STUCK_AFTER", 86400.0),
            stuck_bounds=tuple(
                (state, read.duration(f"STUCK_{state.upper()}_AFTER", 600.0))
                for state in ("pending", "ready", "resume_validation", "cancel_requested")
            ),
            stuck_unowned_after=read.duration("STUCK_UNOWNED_AFTER", 600.0),
            stuck_unanswered_after=read.duration("STUCK_UNANSWERED_AFTER", 600.0),
            notify_timeout=read.number("NOTIFY_TIMEOUT_SECONDS", float, 10.0, minimum=0.1),
            notify_backoff=read.number("NOTIFY_BACKOFF_SECONDS", float, 1.0, minimum=0.01),
            notify_backoff_max=read.number("NOTIFY_BACKOFF_MAX_SECONDS", float, 60.0, minimum=0.01),
            notify_give_up=read.duration("NOTIFY_GIVE_UP_AFTER", 900.0),
            faults=read.faults(),
            schedule_minute=read.number("TEST_SCHEDULE_MINUTE", float, 60.0, minimum=1.0),
            region=read.region("REGION"),
            shards=read.number("SHARDS", int, 16, minimum=1),
            lease_namespace=read.text("LEASE_NAMESPACE")
            or pod_namespace()
            or read.text("NAMESPACE")
            or "default",
        )


class _Reader:
    """Parses one variable at a time; every error names the variable and what it expects."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def text(self, suffix: str) -> str | None:
        return self.env.get(PREFIX + suffix) or None

    def _fail(self, suffix: str, expected: str) -> ConfigError:
        return ConfigError(f"{PREFIX}{suffix}={self.env[PREFIX + suffix]!r}: expected {expected}")

    def number(self, suffix: str, kind: Callable[[str], T], default: T, *, minimum: float) -> T:
        raw = self.text(suffix)
        if raw is None:
            return default
        what = "a whole number" if kind is int else "a number"
        try:
            value = kind(raw)
        except ValueError:
            raise self._fail(suffix, f"{what} >= {minimum:g}") from None
        if not value >= minimum:  # type: ignore[operator]
            raise self._fail(suffix, f"{what} >= {minimum:g}")
        return value

    def duration(self, suffix: str, default: float) -> float:
        raw = self.text(suffix)
        if raw is None:
            return default
        try:
            seconds = parse_duration(raw).total_seconds()
        except InvalidDuration:
            raise self._fail(suffix, "a duration of at least 1s, e.g. 90s, 10m, 1h") from None
        if seconds < 1:
            raise self._fail(suffix, "a duration of at least 1s, e.g. 90s, 10m, 1h")
        return seconds

    def port(self, suffix: str) -> int | None:
        raw = self.text(suffix)
        if raw is None:
            return None
        if not raw.isdigit() or not 0 < int(raw) < 65536:
            raise self._fail(suffix, "a port number from 1 to 65535")
        return int(raw)

    def choice(self, suffix: str, allowed: tuple[str, ...], default: str) -> str:
        raw = self.text(suffix) or default
        if raw not in allowed:
            raise self._fail(suffix, " or ".join(repr(a) for a in allowed))
        return raw

    def region(self, suffix: str) -> str:
        raw = self.text(suffix)
        if raw is None:
            return DEFAULT_REGION
        if region_problem(raw) is not None:
            raise self._fail(suffix, REGION_EXPECTED)
        return raw

    def keyring(self) -> Keyring:
        keys_dir = self.text("SEALING_KEYS_DIR")
        active = self.text("SEALING_ACTIVE_KEY")
        if keys_dir is None or active is None:
            missing = [
                PREFIX + s
                for s, v in (("SEALING_KEYS_DIR", keys_dir), ("SEALING_ACTIVE_KEY", active))
                if not v
            ]
            raise ConfigError(
                f"{' and '.join(missing)} required: the operator seals sensitive values and stamps what it "
                "trusts (approvals, controls, checkpoints) with these keys (a mounted Secret)"
            )
        try:
            return load_keyring(Path(keys_dir), active)
        except KeyringError as err:
            raise ConfigError(f"{PREFIX}SEALING_KEYS_DIR={keys_dir}: {err}") from None

    def faults(self) -> FaultPoints:
        triggers = []
        actions: tuple[tuple[str, signal.Signals | None], ...] = (
            ("TEST_KILL_AT", signal.SIGKILL),
            ("TEST_STOP_AT", signal.SIGSTOP),
            ("TEST_OOM_AT", None),
        )
        for suffix, sig in actions:
            raw = self.text(suffix)
            if raw is not None:
                try:
                    triggers.append(Trigger.parse(raw, sig))
                except ValueError:
                    raise self._fail(suffix, "before:N or after:N with N >= 1") from None
        delay = self.number("TEST_COMMIT_DELAY", float, 0.0, minimum=0.0)
        stop_before_send = self.choice("TEST_STOP_BEFORE_SEND", ("0", "1"), "0") == "1"
        hold = None
        if (raw := self.text("TEST_HOLD_INTERPRETER")) is not None:
            try:
                hold = Hold.parse(raw)
            except ValueError:
                raise self._fail("TEST_HOLD_INTERPRETER", "PREFIX:SECONDS with SECONDS >= 1") from None
        return FaultPoints(triggers, delay, stop_before_send, hold)
