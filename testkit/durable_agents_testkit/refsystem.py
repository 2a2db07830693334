"""The reference authoritative system: a small HTTP service that stands in for a payment, ticket
or e-mail system: it owns the truth about which effects happened.

It owns the *ground truth* about external effects in tests and the demo: every application of an
effect is recorded under its idempotency key, so a test can count how often each key was applied
and assert that the list of duplicates stays empty. It also injects the failures that make an
outcome ambiguous for the caller (slow replies, dropped connections, errors after applying).

It deliberately does **not** deduplicate. Every ``POST /effects`` that reaches the apply step is
applied (counted) again, even for a key it has seen before; that is what makes it an instrument.
Never sending a second application for a key that was already applied is the operator's job
(dispatch with compare-and-swap, reconcile through ``GET /effects?key=...`` before retrying).

HTTP API (JSON everywhere):

``POST /effects``
    Header ``Idempotency-Key`` (required, else 400); body: any JSON value (an empty body is
    ``null``). Applies the effect and answers 201 ``{"key", "applied": <count for key>,
    "receipt"}``. The receipt is derived from the key only (``rcpt-<sha256(key)[:16]>``), so it is
    the same for every application of a key.
``GET /effects?key=<url-encoded key>``
    The reconciliation query, and the canonical form for keys containing ``/``, ``:``, ``?`` and
    so on. 200 ``{"key", "applied", "receipt", "body": <last body>, "lastAppliedAt"}`` if the key
    was applied at least once, 404 ``{"key", "applied": 0}`` if never. ``GET /effects/{key}``
    (the key percent-encoded as one path segment) answers the same. Without ``key``: 400.
``GET /counts``
    ``{"applications": {key: n}, "total": N, "duplicates": [keys with n > 1]}``.
``GET /records``
    ``{"records": [{"key", "body", "appliedAt", "seq"}, ...]}``, the application log in order.
``POST /faults``
    ``{"mode": "slow" | "drop_after_apply" | "error_after_apply" | "error_before_apply" |
    "none", "times": N (default 1), "delay": seconds (slow only, default 5), "match": substring
    the key must contain (optional)}``. Faults queue up; each ``POST /effects`` (with a valid key
    and body) consumes one unit of the first pending fault whose ``match`` it satisfies. ``slow``
    applies, then sleeps ``delay`` before answering; ``drop_after_apply`` applies, then closes
    the connection without any HTTP response; ``error_after_apply`` applies, then answers 500;
    ``error_before_apply`` answers 500 without applying; ``reject`` answers 422
    without applying (a definite failure); ``none`` consumes a unit and behaves
    normally (to let a request through ahead of a queued fault). Answers 201 ``{"queued",
    "pending"}``. ``GET /faults`` lists pending faults, ``DELETE /faults`` clears them.
``POST /reset``
    Clears applications, records and faults.

All state changes happen synchronously inside one event loop, so concurrent requests never see a
half-applied effect. For synchronous test code, :class:`ReferenceSystemThread` runs the service
on its own loop in a daemon thread and offers control methods that need no HTTP.

Only loopback addresses are served unless ``allow_non_loopback`` is set explicitly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import hashlib
import json
import math
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeAlias

from aiohttp import web

from durable_agents_testkit.loopback import LoopThread, RunningApp, is_loopback, refuse_non_loopback

__all__ = [
    "IDEMPOTENCY_KEY_HEADER",
    "ApplicationRecord",
    "Fault",
    "FaultMode",
    "ReferenceSystem",
    "ReferenceSystemThread",
    "RunningReferenceSystem",
    "main",
    "make_app",
    "receipt_for",
    "serve",
]

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
DEFAULT_SLOW_DELAY = 5.0

JsonValue: TypeAlias = Any
"""Any value :func:`json.loads` can produce."""


class FaultMode(enum.StrEnum):
    SLOW = "slow"
    DROP_AFTER_APPLY = "drop_after_apply"
    ERROR_AFTER_APPLY = "error_after_apply"
    ERROR_BEFORE_APPLY = "error_before_apply"
    REJECT = "reject"
    NONE = "none"


def checked_fault_options(times: object, delay: object) -> float:
    """A queued fault's ``times`` (a positive integer) and ``delay`` (seconds), checked; the delay
    as a float. Shared by the test kit's servers that queue faults."""
    if isinstance(times, bool) or not isinstance(times, int) or times < 1:
        raise ValueError(f"times must be a positive integer, got {times!r}")
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not math.isfinite(delay) or delay < 0:
        raise ValueError(f"delay must be a non-negative number of seconds, got {delay!r}")
    return float(delay)


@dataclass
class Fault:
    """A queued fault; ``times`` counts the upcoming matching requests it still applies to."""

    mode: FaultMode
    times: int = 1
    delay: float = DEFAULT_SLOW_DELAY
    match: str | None = None

    def __post_init__(self) -> None:
        self.mode = FaultMode(self.mode)
        self.delay = checked_fault_options(self.times, self.delay)
        if self.match is not None and not isinstance(self.match, str):
            raise ValueError(f"match must be a string or null, got {self.match!r}")

    def matches(self, key: str) -> bool:
        return self.match is None or self.match in key

    def to_json(self) -> dict[str, JsonValue]:
        return {"mode": self.mode.value, "times": self.times, "delay": self.delay, "match": self.match}


@dataclass(frozen=True)
class ApplicationRecord:
    """One application of an effect. ``seq`` numbers applications from 1, across all keys."""

    key: str
    body: JsonValue
    applied_at: datetime
    seq: int
    traceparent: str | None = None  # the request's W3C trace context, if it sent one

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "key": self.key,
            "body": self.body,
            "appliedAt": self.applied_at.isoformat().replace("+00:00", "Z"),
            "seq": self.seq,
        }


def receipt_for(key: str) -> str:
    """The receipt id of a key: stable, so every application of a key yields the same receipt."""
    return "rcpt-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


@dataclass
class ReferenceSystem:
    """The state of the reference system. Not thread-safe: use it from its event loop only
    (:class:`ReferenceSystemThread` marshals calls onto the loop)."""

    records: list[ApplicationRecord] = field(default_factory=list)
    applications: dict[str, int] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    _last: dict[str, ApplicationRecord] = field(default_factory=dict, repr=False)

    def apply(self, key: str, body: JsonValue, traceparent: str | None = None) -> ApplicationRecord:
        """Apply an effect, always: there is deliberately no deduplication here."""
        record = ApplicationRecord(
            key=key,
            body=body,
            applied_at=datetime.now(UTC),
            seq=len(self.records) + 1,
            traceparent=traceparent,
        )
        self.records.append(record)
        self.applications[key] = self.applications.get(key, 0) + 1
        self._last[key] = record
        return record

    def applied(self, key: str) -> int:
        return self.applications.get(key, 0)

    def last(self, key: str) -> ApplicationRecord | None:
        return self._last.get(key)

    def counts(self) -> dict[str, int]:
        return dict(self.applications)

    def total(self) -> int:
        return len(self.records)

    def duplicates(self) -> list[str]:
        return sorted(key for key, n in self.applications.items() if n > 1)

    def inject(
        self,
        mode: FaultMode | str,
        times: int = 1,
        delay: float = DEFAULT_SLOW_DELAY,
        match: str | None = None,
    ) -> Fault:
        fault = Fault(mode=FaultMode(mode), times=times, delay=delay, match=match)
        self.faults.append(fault)
        return fault

    def pending_faults(self) -> list[Fault]:
        return [Fault(f.mode, f.times, f.delay, f.match) for f in self.faults]

    def clear_faults(self) -> None:
        self.faults.clear()

    def take_fault(self, key: str) -> Fault | None:
        """Consume one unit of the first pending fault matching ``key``; return a copy of it."""
        for index, fault in enumerate(self.faults):
            if fault.matches(key):
                fault.times -= 1
                if fault.times == 0:
                    del self.faults[index]
                return Fault(fault.mode, 1, fault.delay, fault.match)
        return None

    def reset(self) -> None:
        self.records.clear()
        self.applications.clear()
        self.faults.clear()
        self._last.clear()

    def counts_json(self) -> dict[str, JsonValue]:
        return {"applications": self.counts(), "total": self.total(), "duplicates": self.duplicates()}

    def lookup_json(self, key: str) -> tuple[int, dict[str, JsonValue]]:
        """The reconciliation answer for ``key``: (HTTP status, JSON body)."""
        record = self.last(key)
        if record is None:
            return 404, {"key": key, "applied": 0}
        return 200, {
            "key": key,
            "applied": self.applied(key),
            "receipt": receipt_for(key),
            "body": record.body,
            "lastAppliedAt": record.to_json()["appliedAt"],
        }


# -- HTTP ------------------------------------------------------------------------------------------

SYSTEM_KEY: web.AppKey[ReferenceSystem] = web.AppKey("refsystem", ReferenceSystem)


def _error(status: int, message: str, **extra: JsonValue) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


async def _post_effect(request: web.Request) -> web.StreamResponse:
    system = request.app[SYSTEM_KEY]
    key = request.headers.get(IDEMPOTENCY_KEY_HEADER, "")
    if not key:
        return _error(400, f"missing {IDEMPOTENCY_KEY_HEADER} header")
    raw = await request.read()
    body: JsonValue = None
    if raw.strip():
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "body is not JSON", key=key)

    # From here to apply() there is no await: taking the fault and applying is atomic.
    fault = system.take_fault(key)
    mode = fault.mode if fault is not None else FaultMode.NONE
    if mode is FaultMode.ERROR_BEFORE_APPLY:
        return _error(500, "injected fault: error before apply", key=key)
    if mode is FaultMode.REJECT:
        return _error(422, "injected fault: rejected, not applied", key=key)
    system.apply(key, body, request.headers.get("traceparent"))
    answer = {"key": key, "applied": system.applied(key), "receipt": receipt_for(key)}

    if mode is FaultMode.ERROR_AFTER_APPLY:
        return _error(500, "injected fault: error after apply", key=key)
    if mode is FaultMode.DROP_AFTER_APPLY:
        # Close the connection without writing anything: the client sees a server disconnect.
        # aiohttp then fails to write the response below (a ConnectionError it handles quietly).
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=500)
    if mode is FaultMode.SLOW and fault is not None:
        await asyncio.sleep(fault.delay)
    return web.json_response(answer, status=201)


async def _get_effect_query(request: web.Request) -> web.Response:
    key = request.query.get("key")
    if not key:
        return _error(400, "missing key query parameter")
    status, answer = request.app[SYSTEM_KEY].lookup_json(key)
    return web.json_response(answer, status=status)


async def _get_effect_path(request: web.Request) -> web.Response:
    status, answer = request.app[SYSTEM_KEY].lookup_json(request.match_info["key"])
    return web.json_response(answer, status=status)


async def _get_counts(request: web.Request) -> web.Response:
    return web.json_response(request.app[SYSTEM_KEY].counts_json())


async def _get_records(request: web.Request) -> web.Response:
    return web.json_response({"records": [r.to_json() for r in request.app[SYSTEM_KEY].records]})


async def _post_fault(request: web.Request) -> web.Response:
    system = request.app[SYSTEM_KEY]
    try:
        spec = await request.json()
    except ValueError:
        return _error(400, "body is not JSON")
    if not isinstance(spec, dict):
        return _error(400, "body must be a JSON object")
    unknown = set(spec) - {"mode", "times", "delay", "match"}
    if unknown:
        return _error(400, f"unknown fields: {sorted(unknown)}")
    if "mode" not in spec:
        return _error(400, "mode is required")
    try:
        fault = system.inject(
            FaultMode(spec["mode"]),
            times=spec.get("times", 1),
            delay=spec.get("delay", DEFAULT_SLOW_DELAY),
            match=spec.get("match"),
        )
    except ValueError as exc:
        return _error(400, str(exc))
    return web.json_response(
        {"queued": fault.to_json(), "pending": [f.to_json() for f in system.faults]}, status=201
    )


async def _get_faults(request: web.Request) -> web.Response:
    return web.json_response({"pending": [f.to_json() for f in request.app[SYSTEM_KEY].faults]})


async def _delete_faults(request: web.Request) -> web.Response:
    request.app[SYSTEM_KEY].clear_faults()
    return web.json_response({"pending": []})


async def _post_reset(request: web.Request) -> web.Response:
    request.app[SYSTEM_KEY].reset()
    return web.json_response({"reset": True})


def make_app(system: ReferenceSystem | None = None) -> web.Application:
    """The aiohttp application serving ``system`` (a fresh one if not given)."""
    app = web.Application()
    app[SYSTEM_KEY] = system if system is not None else ReferenceSystem()
    app.router.add_post("/effects", _post_effect)
    app.router.add_get("/effects", _get_effect_query)
    app.router.add_get("/effects/{key}", _get_effect_path)
    app.router.add_get("/counts", _get_counts)
    app.router.add_get("/records", _get_records)
    app.router.add_post("/faults", _post_fault)
    app.router.add_get("/faults", _get_faults)
    app.router.add_delete("/faults", _delete_faults)
    app.router.add_post("/reset", _post_reset)
    return app


class RunningReferenceSystem(RunningApp):
    """The service listening on a socket. ``port=0`` picks a free port; ``.port`` is the real one."""

    def __init__(
        self,
        system: ReferenceSystem | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        allow_non_loopback: bool = False,
        shutdown_timeout: float = 1.0,
    ) -> None:
        self.system = system if system is not None else ReferenceSystem()
        # handler_cancellation: a client that gives up on a slow reply cancels the sleep (the
        # effect was already applied), so stopping never waits for injected delays.
        super().__init__(
            make_app(self.system),
            host,
            port,
            allow_non_loopback=allow_non_loopback,
            name="the reference system",
            handler_cancellation=True,
            shutdown_timeout=shutdown_timeout,
        )


@contextlib.asynccontextmanager
async def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    system: ReferenceSystem | None = None,
    *,
    allow_non_loopback: bool = False,
) -> AsyncIterator[RunningReferenceSystem]:
    """Serve the reference system for the duration of the ``async with`` block."""
    running = RunningReferenceSystem(system, host, port, allow_non_loopback=allow_non_loopback)
    async with running:
        yield running


class ReferenceSystemThread(LoopThread[RunningReferenceSystem]):
    """The service on its own event loop in a daemon thread, for synchronous test code.

    The control methods (``counts``, ``inject``, ``reset``, ...) run on the service's loop and
    wait for the result, so they are safe to call from any thread and need no HTTP.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, allow_non_loopback: bool = False) -> None:
        refuse_non_loopback(host, allow_non_loopback)
        self.system = ReferenceSystem()
        super().__init__(
            "the reference system",
            lambda: RunningReferenceSystem(self.system, host, port, allow_non_loopback=allow_non_loopback),
        )

    @property
    def url(self) -> str:
        return self._served.url

    @property
    def port(self) -> int:
        return self._served.port

    def counts(self) -> dict[str, int]:
        """Applications per key."""
        return self.call(self.system.counts)

    def applied(self, key: str) -> int:
        return self.call(lambda: self.system.applied(key))

    def duplicates(self) -> list[str]:
        return self.call(self.system.duplicates)

    def total(self) -> int:
        return self.call(self.system.total)

    def records(self) -> list[ApplicationRecord]:
        return self.call(lambda: list(self.system.records))

    def inject(
        self,
        mode: FaultMode | str,
        times: int = 1,
        delay: float = DEFAULT_SLOW_DELAY,
        match: str | None = None,
    ) -> Fault:
        return self.call(lambda: self.system.inject(mode, times=times, delay=delay, match=match))

    def pending_faults(self) -> list[Fault]:
        return self.call(self.system.pending_faults)

    def clear_faults(self) -> None:
        self.call(self.system.clear_faults)

    def reset(self) -> None:
        self.call(self.system.reset)


# -- standalone ------------------------------------------------------------------------------------


async def _run_forever(host: str, port: int, allow_non_loopback: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    async with serve(host, port, allow_non_loopback=allow_non_loopback) as running:
        print(f"reference system listening on {running.url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m durable_agents_testkit.refsystem",
        description="The reference authoritative system: records effects by idempotency key and "
        "never deduplicates.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback only by default)")
    parser.add_argument("--port", type=int, default=8099, help="port to listen on; 0 picks a free one")
    parser.add_argument(
        "--allow-non-loopback", action="store_true", help="allow listening on a non-loopback address"
    )
    args = parser.parse_args(argv)
    if not args.allow_non_loopback and not is_loopback(args.host):
        parser.error(f"refusing to listen on non-loopback address {args.host!r}")
    asyncio.run(_run_forever(args.host, args.port, args.allow_non_loopback))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
