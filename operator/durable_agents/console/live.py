"""Server-sent events: one watch per page, made with the user's credentials, relayed to the page.

The page's script (static/console.js) listens: ``change`` (the run or the list changed: it fetches
the page again), ``deleted`` (the run is gone), ``refused`` (the user may not watch: the page stays as it is),
``down`` (the API server cannot be reached or
refused the watch: the page says so) and ``up`` (it answers again: the page fetches itself again).
No object's content travels on the stream, only that something changed. The watch runs in a
thread (the Kubernetes client blocks), in bounded stretches, so it ends soon after the page does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any, Final

from aiohttp import web
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.console.authority import NotSignedIn
from durable_agents.console.views import AUTHORITY, list_query
from durable_agents.kubectl.errors import api_message

STRETCH_SECONDS: Final = 10
PING_SECONDS: Final = 15.0
BACKOFF_SECONDS: Final = (0.5, 1.0, 2.0, 4.0)

Say = Callable[[str, dict[str, Any]], None]


def _relay(
    api: client.ApiClient,
    namespace: str | None,
    name: str | None,
    version: str,
    say: Say,
    done: threading.Event,
) -> None:
    """Watch until ``done``: each stretch starts where the last ended; a lost API server is said
    (``down``) and tried again with backoff, then said again when it answers (``up``)."""
    custom = client.CustomObjectsApi(api)
    selector = f"metadata.name={name}" if name else None
    failures = 0
    while not done.is_set():
        try:
            if not version:
                listed = (
                    custom.list_cluster_custom_object(GROUP, VERSION, "agentruns", field_selector=selector)
                    if namespace is None
                    else custom.list_namespaced_custom_object(
                        GROUP, VERSION, namespace, "agentruns", field_selector=selector
                    )
                )
                version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
            if failures:
                say("up", {})
                failures = 0
            lister = (
                (custom.list_cluster_custom_object, (GROUP, VERSION, "agentruns"))
                if namespace is None
                else (custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, "agentruns"))
            )
            watcher = watch.Watch()
            for event in watcher.stream(
                lister[0],
                *lister[1],
                field_selector=selector,
                resource_version=version,
                timeout_seconds=STRETCH_SECONDS,
                allow_watch_bookmarks=False,
            ):
                obj = event.get("object") or {}
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                meta = obj.get("metadata") or {}
                what = "deleted" if event.get("type") == "DELETED" and name else "change"
                say(what, {"name": meta.get("name"), "namespace": meta.get("namespace")})
                if done.is_set():
                    watcher.stop()
        except ApiException as err:
            if err.status == 410:  # expired: list again from now
                version = ""
                continue
            if err.status in (401, 403):  # not a lost API server: this user may not watch here
                say("refused", {"message": f"this page does not follow changes: {api_message(err)}"})
                return
            failures += 1
            say("down", {"message": f"the API server refused the watch: {err.status} {api_message(err)}"})
        except Exception as err:  # the connection: refused, reset, timed out
            failures += 1
            say("down", {"message": f"the API server cannot be reached ({type(err).__name__}); trying again"})
        if failures:
            done.wait(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS)) - 1])


def _finish(worker: asyncio.Future[None]) -> None:
    if not worker.done():
        worker.set_result(None)


async def stream(request: web.Request, namespace: str | None, name: str | None) -> web.StreamResponse:
    authority = request.app[AUTHORITY]
    try:
        api = authority.api_client(request)
    except NotSignedIn:
        return web.Response(status=401, text="not signed in")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    await response.prepare(request)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
    done = threading.Event()

    def say(event: str, data: dict[str, Any]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (event, data))

    # Its own thread, not the executor's: a page can stay open for hours, and the executor's few
    # threads serve every page's API calls.
    worker: asyncio.Future[None] = loop.create_future()

    def relay() -> None:
        try:
            _relay(api, namespace, name, request.query.get("version", ""), say, done)
        finally:
            loop.call_soon_threadsafe(_finish, worker)

    threading.Thread(target=relay, name="console-watch", daemon=True).start()
    try:
        await response.write(b"retry: 2000\n\n")
        while True:
            try:
                event, data = await asyncio.wait_for(queue.get(), PING_SECONDS)
            except TimeoutError:
                await response.write(b": ping\n\n")
                continue
            await response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        done.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(worker), STRETCH_SECONDS + 5)
        authority.release(api)
    return response


async def runs_events(request: web.Request) -> web.StreamResponse:
    return await stream(request, list_query(request).namespace, None)


async def run_events(request: web.Request) -> web.StreamResponse:
    return await stream(request, request.match_info["namespace"], request.match_info["name"])
