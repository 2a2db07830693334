"""A lean list-then-watch of AgentRuns straight into its subscribers (client-go's reflector and
informer, without the cache: each subscriber keeps what it needs).

One per kind and process: the manager makes the AgentRun one and every part that needs AgentRun
events subscribes to it before it starts (the run worker, the dispatcher, retention, the stuck
check, the census), so the API server serves one AgentRun watch per operator process.

kopf stays the operator's framework (start-up and clean-up, the admission webhooks, and the
ActionRecord, AgentPolicy and Lease watches). Only this one hot stream bypasses it: a py-spy profile
of a cold start with 3,000 runs put about 60 % of the operator's CPU in kopf's per-event processing
(cause detection, diffs, deep copies), which a handler that only enqueues the run never uses.

It behaves as a reflector does: list in pages (each object delivered with event type None), then
watch from the list's resourceVersion with bookmarks. A watch that ends (the server's timeout) is
resumed from the last resourceVersion seen; 410 Gone (compacted history) lists again; any other
error (the API server restarting, a dropped connection) backs off and retries, and never ends the
operator. Events reach every subscriber on the event loop, in the order the API server sent them
and in the order the subscribers subscribed; a subscriber that raises is logged and the others
still get the event.

What is delivered is the object as the API server sent it, less what no subscriber reads and
every one would otherwise hold while the run is queued or kept (:func:`lean`): its managed fields
(server-side apply's bookkeeping, about half of a parked run's bytes), and with its namespace
interned, one string for all the runs of a namespace (issue 38: 100,000 runs on one replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.shell.ground import fast_json
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ground.lifecycle import Background

log = logging.getLogger(__name__)

Deliver = Callable[[str | None, dict[str, Any]], None]


def lean(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as delivered: without ``metadata.managedFields`` (no subscriber reads them; a write
    never sends them back, so the server keeps them), its namespace interned. Changed in place."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        namespace = meta.get("namespace")
        if isinstance(namespace, str):
            meta["namespace"] = sys.intern(namespace)
    return obj


MIN_BACKOFF = 0.2
MAX_BACKOFF = 10.0


class Expired(Exception):
    """The resourceVersion to resume from is no longer in the API server's history: list again."""


class WatchError(Exception):
    """The watch stream reported an error other than 410 Gone."""


class RunReflector(Background):
    def __init__(
        self,
        kube: Kube,
        deliver: Deliver | None = None,
        *,
        namespace: str | None = None,
        plural: str = "agentruns",
        page_size: int = 200,
        watch_timeout: int = 300,
    ) -> None:
        self.kube = kube
        self.subscribers: list[Deliver] = [deliver] if deliver is not None else []
        self.namespace = namespace
        self.plural = plural
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.synced = asyncio.Event()  # set once the first full list has been delivered
        self.lists = 0  # full lists done (1 at start, +1 per 410 Gone)
        self._version: str | None = None
        self._response: Any = None

    def subscribe(self, deliver: Deliver) -> None:
        """Deliver every event to ``deliver`` too (subscribe before the reflector starts: the first
        list is delivered once)."""
        self.subscribers.append(deliver)

    def deliver(self, event_type: str | None, body: dict[str, Any]) -> None:
        for subscriber in self.subscribers:
            try:
                subscriber(event_type, body)
            except Exception:  # one consumer's bug must not starve the others of the event
                log.exception("%s: a subscriber failed on an event", self.plural)

    def _unblock(self) -> None:
        # The stream is read on a thread blocked in recv(): shutting the socket down wakes it.
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    def _list_call(self) -> Callable[..., Any]:
        custom = self.kube.custom
        if self.namespace:
            return functools.partial(
                custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, self.plural
            )
        return functools.partial(custom.list_cluster_custom_object, GROUP, VERSION, self.plural)

    async def run(self) -> None:
        backoff = MIN_BACKOFF
        while True:  # until cancelled (stop): the socket of a watch in progress is shut down
            try:
                if self._version is None:
                    self._version = await self._list()
                    self.lists += 1
                    self.synced.set()
                await self._watch(self._version)
                backoff = MIN_BACKOFF
            except Expired as gone:
                log.info(
                    "%s: resourceVersion %s expired (%s); listing again", self.plural, self._version, gone
                )
                self._version = None
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the API server restarting, a dropped connection, a 5xx
                log.warning(
                    "%s watch failed (%s: %s); again in %.1fs", self.plural, type(err).__name__, err, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    async def _list(self) -> str:
        """Every object, page by page; the next page is asked for before this one is delivered, so
        the API server reads and encodes it while the subscribers take this one (a cold start over
        10,000 runs waited on the API server twice as long as it worked)."""
        call = self._list_call()
        pending = asyncio.ensure_future(self._page(call, None))
        try:
            while True:
                page = await pending
                meta = page.get("metadata") or {}
                token = meta.get("continue")
                if token:
                    pending = asyncio.ensure_future(self._page(call, token))
                for item in page.get("items") or []:
                    self.deliver(None, lean(item))
                if not token:
                    return str(meta["resourceVersion"])
                await asyncio.sleep(0)  # let the workers start on the runs delivered so far
        finally:
            if not pending.done():
                pending.cancel()

    async def _page(self, call: Callable[..., Any], token: str | None) -> dict[str, Any]:
        try:
            response = await self.kube.call(
                call, limit=self.page_size, _continue=token, _preload_content=False
            )
        except ApiException as err:
            if err.status == 410:  # the continue token outlived the snapshot it pages through
                raise Expired("list continuation expired") from err
            raise
        page: dict[str, Any] = fast_json.loads(response.data)
        return page

    async def _watch(self, version: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            response = await self.kube.call(
                self._list_call(),
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout,
                _preload_content=False,
                _request_timeout=(10, self.watch_timeout + 30),
            )
        except ApiException as err:
            if err.status == 410:
                raise Expired(err.reason) from err
            raise
        self._response = response
        try:
            # Read on a thread of its own: it blocks for the whole watch, not for one request.
            await loop.run_in_executor(None, self._stream, response, loop)
        except asyncio.CancelledError:
            self._unblock()  # the thread is blocked in recv(): wake it, or it outlives the stop
            raise
        finally:
            self._response = None
            response.release_conn()

    def _stream(self, response: Any, loop: asyncio.AbstractEventLoop) -> None:
        for line in iter_resp_lines(response):
            if not line:
                continue
            event = fast_json.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Expired(obj.get("message", "410 Gone"))
                raise WatchError(f"{obj.get('code')}: {obj.get('message')}")
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self._version = version
            if kind != "BOOKMARK":
                loop.call_soon_threadsafe(self.deliver, kind, lean(obj))
