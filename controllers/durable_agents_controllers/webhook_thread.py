"""The admission webhook served on its own thread, with its own event loop (issue 30).

kopf serves admission reviews on the operator's event loop, where the run worker decides batches
of transitions: for a run of the largest admitted size, each one validates and verifies the whole
run, so a unit of work holds the loop for a long time, and a review waited for it (3.2 s seen,
against the API server's 10 s timeout and failurePolicy Fail). Here the HTTP server, the parsing
and limits of a review and kopf's dispatch to our handlers all run on a loop of their own, so an
answer waits for nothing the worker does but its share of the interpreter.

What the handlers touch is safe from this thread: the keyring and stamps are pure, the API calls
(SubjectAccessReviews, reads) go through :class:`~durable_agents.shell.ground.kube.Kube`'s thread pool
from whichever loop awaits them, and the policy cache is only read. What belongs to the operator's
loop (a policy read into the cache) is handed to it: :func:`on_loop`. No review enqueues a run. kopf's
per-object memos are not shared across the two loops: the handlers keep none.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import copy
import functools
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Coroutine
from typing import Any, TypeVar

import aiohttp.web
import kopf
from kopf._core.engines.admission import AmbiguousResourceError, UnknownResourceError, WebhookError

log = logging.getLogger(__name__)
T = TypeVar("T")
STOP_WITHIN = 10.0  # seconds for the thread's server to close its connections at shutdown


class OwnLoop:
    """A daemon thread running an event loop until stopped."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this thread's loop; awaited from another loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=STOP_WITHIN)


async def on_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop`` (the operator's), awaited from whichever loop calls this."""
    if asyncio.get_running_loop() is loop:
        return await coro
    future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, loop)
    return await asyncio.wrap_future(future)


class _NoMemos:
    """kopf's memo store for admission handlers, keeping nothing: kopf's own (one per object) is
    the operator loop's, and our handlers use no memo."""

    async def recall_memo(self, raw_body: Any, *, memobase: Any = None, ephemeral: bool = False) -> Any:
        del raw_body, ephemeral
        return copy.copy(memobase)  # what kopf gives a new object


class ThreadedWebhookServer(kopf.WebhookServer):
    """kopf's webhook server with the serving moved to a thread of its own. The certificate files
    are still watched from the operator's loop: a renewal restarts the server on the thread."""

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        fn = functools.partial(fn, memories=_NoMemos())
        own = OwnLoop("admission-webhook")
        try:
            while True:
                cadata, context = self._build_ssl()
                port = self.port or self._allocate_free_port()
                runner = await own.run(self._listen(fn, context, port))
                try:
                    schema = "http" if context is None else "https"
                    host = self.host or self.DEFAULT_HOST or self._get_accessible_addr(self.addr)
                    config: dict[str, Any] = {"url": self._build_url(schema, host, port, self.path or "")}
                    if cadata is not None:
                        config["caBundle"] = base64.b64encode(cadata).decode("ascii")
                    yield config
                    await self._files_changed()
                    log.debug("webhook: restarting with the renewed certificate files")
                finally:
                    await own.run(runner.cleanup())
        finally:
            own.stop()

    async def _files_changed(self) -> None:
        waited: Awaitable[None] = self._WebhookServer__sleep_forever_or_until_ssl_files_change()  # type: ignore[attr-defined]
        await waited

    @staticmethod
    async def _answer(fn: Any, review: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:
        """kopf's ``_serve`` for a review already parsed: a review of a large run is about 1 MB of
        JSON (the object twice), not decoded and parsed a second time."""
        headers = dict(request.headers)
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        try:
            response = await fn(
                review, webhook=request.match_info.get("id"), sslpeer=sslpeer, headers=headers
            )
        except AmbiguousResourceError as err:
            raise aiohttp.web.HTTPConflict(reason=str(err) or None) from err
        except UnknownResourceError as err:
            raise aiohttp.web.HTTPNotFound(reason=str(err) or None) from err
        except WebhookError as err:
            raise aiohttp.web.HTTPBadRequest(reason=str(err) or None) from err
        return aiohttp.web.json_response(response)

    async def _listen(self, fn: Any, context: Any, port: int) -> aiohttp.web.AppRunner:
        """On the webhook's loop: kopf's application, listening (as kopf's own ``__call__``)."""

        async def serve(request: aiohttp.web.Request) -> aiohttp.web.Response:
            return await self._serve(fn, request)

        path = self.path.rstrip("/") if self.path else ""
        app = aiohttp.web.Application()
        app.add_routes([aiohttp.web.post(f"{path}/{{id:.*}}", serve)])
        runner = aiohttp.web.AppRunner(app, handle_signals=False)
        await runner.setup()
        addr = self.addr or None  # None is aiohttp's "any interface"
        site = aiohttp.web.TCPSite(
            runner, addr, port, ssl_context=context, reuse_port=True, reuse_address=True
        )
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        return runner
