"""The plumbing the test kit's loopback servers share (the reference system, the reference model
server and the reference MCP server).

- :func:`is_loopback` / :func:`refuse_non_loopback`: these servers listen on loopback addresses
  only, unless a caller explicitly allows another address.
- :func:`http_url`: ``http://host:port/path``, with an IPv6 host in brackets.
- :class:`RunningApp`: an aiohttp application listening on a host and port (``port=0`` picks a
  free port; :attr:`RunningApp.port` is the real one), as an async context manager.
- :class:`LoopThread`: a service on its own event loop in a daemon thread, for synchronous code:
  :meth:`LoopThread.call` and :meth:`LoopThread.run` execute on that loop and wait for the result,
  so control methods built on them are safe to call from any thread and need no HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import threading
from collections.abc import Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager
from types import MappingProxyType
from typing import Any, Final, Generic, Self, TypeVar, cast

from aiohttp import web

__all__ = [
    "LOOPBACK",
    "RUNNER_OPTIONS",
    "LoopThread",
    "RunningApp",
    "http_url",
    "is_loopback",
    "refuse_non_loopback",
]

LOOPBACK: Final = "127.0.0.1"

# handler_cancellation: a client that gives up on a slow reply cancels the handler (an injected
# sleep; the effect was already applied), so stopping never waits for injected delays.
# shutdown_timeout bounds how long stopping waits for the requests still running.
RUNNER_OPTIONS: Final[Mapping[str, Any]] = MappingProxyType(
    {"handler_cancellation": True, "shutdown_timeout": 1.0}
)

_T = TypeVar("_T")
_S = TypeVar("_S")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback IP address (a name is not resolved)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refuse_non_loopback(host: str, allow: bool = False) -> None:
    """Raise ValueError for a non-loopback ``host``, unless ``allow`` is set."""
    if not allow and not is_loopback(host):
        raise ValueError(f"refusing to listen on non-loopback address {host!r}")


def http_url(host: str, port: int, path: str = "") -> str:
    """``http://host:port`` followed by ``path``; an IPv6 address goes in brackets."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"


class RunningApp:
    """An aiohttp application listening on a socket; ``port=0`` picks a free port and :attr:`port`
    is the real one while it runs. ``runner_options`` go to :class:`aiohttp.web.AppRunner`, over
    :data:`RUNNER_OPTIONS`. ``name`` says what is not running in errors."""

    def __init__(
        self,
        app: web.Application,
        host: str = LOOPBACK,
        port: int = 0,
        *,
        allow_non_loopback: bool = False,
        name: str = "the server",
        **runner_options: Any,
    ) -> None:
        refuse_non_loopback(host, allow_non_loopback)
        self.host = host
        self._name = name
        self._requested_port = port
        self._port: int | None = None
        self._runner = web.AppRunner(app, **{**RUNNER_OPTIONS, **runner_options})

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{self._name} is not running")
        return self._port

    @property
    def url(self) -> str:
        """``http://host:port``, without a trailing slash."""
        return http_url(self.host, self.port)

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._requested_port)
        try:
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            raise
        self._port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        await self._runner.cleanup()
        self._port = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


class LoopThread(Generic[_S]):
    """A service on its own event loop in a daemon thread, for synchronous code.

    ``serve`` makes the async context manager that runs the service: :meth:`start` enters it on
    the thread's loop (and raises what entering raised, or TimeoutError), :meth:`stop` leaves it
    and ends the thread. What entering it returned is :attr:`_served` for subclasses while it
    runs. :meth:`call` and :meth:`run` execute on the loop and wait for the result, so they are
    safe from any thread (and from an event loop running elsewhere: they block only briefly).
    ``name`` names the thread and says what is not running in errors.
    """

    def __init__(self, name: str, serve: Callable[[], AbstractAsyncContextManager[_S]]) -> None:
        self._name = name
        self._serve = serve
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._up = False
        self._value: _S | None = None
        self._error: BaseException | None = None

    @property
    def _served(self) -> _S:
        """What entering ``serve()`` returned; RuntimeError when the service is not running."""
        if not self._up:
            raise RuntimeError(f"{self._name} is not running")
        return cast(_S, self._value)  # set together with _up

    def start(self, timeout: float = 10.0) -> Self:
        if self._thread is not None:
            raise RuntimeError(f"{self._name} is already started")
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()
        ready = self._ready.wait(timeout)
        error, self._error = self._error, None
        if not ready or error is not None:
            self.stop(timeout)
            raise error if error is not None else TimeoutError(f"{self._name} did not start in time")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Leave ``serve()`` and end the thread; nothing to do if not started (or stopped)."""
        thread, loop = self._thread, self._loop
        if thread is None:
            return
        if loop is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._request_stop)
        thread.join(timeout)
        self._thread = self._loop = self._task = self._stopping = None
        self._up, self._value = False, None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float = 10.0) -> _T:
        """Run ``coro`` on the service's loop and wait for its result."""
        loop = self._loop
        if loop is None or not self._up:
            coro.close()
            raise RuntimeError(f"{self._name} is not running")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    def call(self, fn: Callable[[], _T], timeout: float = 10.0) -> _T:
        """Call ``fn`` on the service's loop (the only place that may touch its state)."""

        async def call() -> _T:
            return fn()

        return self.run(call(), timeout)

    def _main(self) -> None:
        try:
            asyncio.run(self._serving())
        except BaseException as exc:  # reported to start() (CancelledError: stopped while starting)
            self._error = exc
        finally:
            self._up = False
            self._ready.set()

    async def _serving(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._stopping = asyncio.Event()
        async with self._serve() as served:
            self._value, self._up = served, True
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                self._up = False

    def _request_stop(self) -> None:
        """On the loop: a running service leaves ``serve()`` normally; one still starting (start()
        timed out) is cancelled."""
        if self._up and self._stopping is not None:
            self._stopping.set()
        elif self._task is not None:
            self._task.cancel()
