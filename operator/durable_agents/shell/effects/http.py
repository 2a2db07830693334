"""``http.post``: a POST carrying an ``Idempotency-Key`` header, reconciled by a query endpoint.

target: ``{"url": "...", "queryUrl": "..."}``; the query is ``GET queryUrl?key=<key>`` (200:
applied, 404: not applied). 2xx is applied; 4xx other than 408/409/425/429 is a definite failure;
5xx, timeouts and dropped connections are unknown. What the ActionRecord keeps of an answer
(sealed): its status and its body, at most BODY_MAX_BYTES of it (the model planner gives it to the
model as the call's result). A target that is no http(s) URL (missing,
unparseable, no host) is a definite ``InvalidTarget`` failure: nothing was sent, so nothing is unknown.
A redirect is never followed (it could lead outside the policy's ``spec.destinations``): a 3xx
answer to the POST is unknown (the receiver may have applied it), reconciled by the query.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from durable_agents.api.v1alpha1 import ActionTier
from durable_agents.core.digest import canonical_json
from durable_agents.shell.effects.base import (
    Action,
    Applied,
    DispatchResult,
    EffectContext,
    Failed,
    NotApplied,
    QueryResult,
    Unknown,
)
from durable_agents.shell.ground import tracing

_RETRYABLE_4XX = frozenset({408, 409, 425, 429})


BODY_MAX_BYTES = 16 * 1024
"""The most of a response body the ActionRecord keeps (read no further): the model planner gives
it to the model as the call's result, and the record must stay small (docs/reference/limits.md)."""


def _outcome(status: int, body: Body) -> dict[str, Any]:
    """The response as the ActionRecord keeps it: the status, what identifies the effect (a
    receipt) at the top, and the body (JSON when it is, else text), cut to BODY_MAX_BYTES with
    ``bodyTruncated`` saying so."""
    out: dict[str, Any] = {"status": status}
    if isinstance(body.value, dict):
        for key in ("receipt", "id", "key"):
            if key in body.value:
                out[key] = body.value[key]
    if body.value is not None:
        out["body"] = body.value
    if body.truncated:
        out["bodyTruncated"] = True
    return out


@dataclass(frozen=True)
class Body:
    """A response body as read: JSON (whole), text (maybe cut), or None (empty)."""

    value: Any
    truncated: bool = False


def target_problem(url: object, field: str = "target.url") -> str | None:
    """Why ``url`` cannot be posted to (a definite client-side error), or None when it can."""
    if not isinstance(url, str) or not url:
        return f"http.post needs {field} (a string)"
    try:
        parsed = urlsplit(url)
        parsed.port  # noqa: B018 (raises ValueError when out of range or not a number)
    except ValueError as err:
        return f"{field} {url[:200]!r} is not a URL: {err}"
    if parsed.scheme not in ("http", "https"):
        return f"{field} {url[:200]!r} is not an http(s) URL"
    if not parsed.hostname:
        return f"{field} {url[:200]!r} names no host"
    return None


async def _body(resp: aiohttp.ClientResponse) -> Body:
    """At most BODY_MAX_BYTES of the body (a larger one is neither read whole nor kept whole)."""
    raw = await resp.content.read(BODY_MAX_BYTES + 1)
    truncated = len(raw) > BODY_MAX_BYTES
    raw = raw[:BODY_MAX_BYTES]
    if not raw.strip():
        return Body(None, truncated)
    if not truncated:
        try:
            value = json.loads(raw)
            canonical_json(value)  # it must seal: a number beyond 2^53, or nesting too deep, goes as text
            return Body(value)
        except (ValueError, RecursionError):
            pass
    return Body(raw.decode("utf-8", errors="ignore"), truncated)


def _headers(key: str) -> dict[str, str]:
    # The W3C traceparent of the dispatch's span: the receiver may join the run's trace.
    return {"Idempotency-Key": key, **tracing.traceparent()}


class HttpPost:
    name = "http.post"
    tier = ActionTier.CONSEQUENTIAL
    reversible = False
    compensation: str | None = None

    async def dispatch(self, ctx: EffectContext, action: Action) -> DispatchResult:
        url = action.target.get("url")
        problem = target_problem(url)
        if problem is not None or not isinstance(url, str):
            return Failed("InvalidTarget", problem or "http.post needs target.url")
        timeout = aiohttp.ClientTimeout(total=ctx.timeout)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(
                    url, json=action.arguments, headers=_headers(action.key), allow_redirects=False
                ) as resp,
            ):
                body = await _body(resp)
                if 200 <= resp.status < 300:
                    return Applied(_outcome(resp.status, body))
                if 400 <= resp.status < 500 and resp.status not in _RETRYABLE_4XX:
                    return Failed(f"HTTP{resp.status}", f"POST {url} answered {resp.status}")
                return Unknown(
                    f"HTTP{resp.status}", f"POST {url} answered {resp.status}: it may have applied"
                )
        except TimeoutError:
            return Unknown("Timeout", f"POST {url} did not answer within {ctx.timeout}s")
        except aiohttp.InvalidURL as err:  # refused before anything was sent
            return Failed("InvalidTarget", f"POST {url}: {err}")
        except (aiohttp.ClientError, asyncio.IncompleteReadError, ConnectionError) as err:
            return Unknown("ConnectionError", f"POST {url}: {type(err).__name__}: {err}")

    async def query(self, ctx: EffectContext, action: Action) -> QueryResult:
        url = action.target.get("queryUrl") or action.target.get("url")
        if target_problem(action.target.get("url")) is not None:
            return NotApplied()  # a POST to no valid URL was never sent: it did not apply
        if not isinstance(url, str) or target_problem(url, "target.queryUrl") is not None:
            return Unknown("InvalidTarget", "http.post needs a valid target.queryUrl to reconcile")
        timeout = aiohttp.ClientTimeout(total=ctx.timeout)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(url, params={"key": action.key}, allow_redirects=False) as resp,
            ):
                body = await _body(resp)
                if resp.status == 200:
                    return Applied(_outcome(resp.status, body))
                if resp.status == 404:
                    return NotApplied()
                return Unknown(f"HTTP{resp.status}", f"GET {url} answered {resp.status}")
        except TimeoutError:
            return Unknown("Timeout", f"GET {url} did not answer within {ctx.timeout}s")
        except (aiohttp.ClientError, ConnectionError) as err:
            return Unknown("ConnectionError", f"GET {url}: {type(err).__name__}: {err}")
