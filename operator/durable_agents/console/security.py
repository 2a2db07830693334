"""What every response carries and every POST must show.

- Headers: a Content-Security-Policy that allows only this origin's own script and style (no
  inline script, no third party), no framing, no referrer to other sites, no caching of pages (a
  revealed value lives in one response only).
- CSRF: a double-submit token. A random cookie (HttpOnly, SameSite=Strict) and the same value in
  every form (rendered by the server); a POST whose form field does not equal the cookie, or whose
  Origin is another site, is refused before anything reaches the API server.
- Access log: method, path (never the query: the one-time sign-in token travels there), status.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from durable_agents.console.authority import CSRF_COOKIE

LOG: Final = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CSRF_FIELD: Final = "csrf"
CSRF_KEY: Final = web.RequestKey("csrf", str)
SECURE_COOKIES_KEY: Final = web.AppKey("secure_cookies", bool)

CSP: Final = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ]
)
HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # no-referrer would make the Origin of our own POSTs "null"
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class CsrfRefused(web.HTTPForbidden):
    """A POST without the form's CSRF token (or from another origin)."""


def csrf_token(request: web.Request) -> str:
    return request[CSRF_KEY]


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:  # not sent by every browser for a same-origin form; SameSite does the rest
        return True
    return origin in (f"{request.scheme}://{request.host}", f"https://{request.host}")


@web.middleware
async def protect(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The CSRF check of a POST, then the handler, then the headers of every response."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    request[CSRF_KEY] = cookie or secrets.token_urlsafe(32)
    if request.method == "POST":
        form = await request.post()
        sent = form.get(CSRF_FIELD)
        if (
            not cookie
            or not isinstance(sent, str)
            or not hmac.compare_digest(sent.encode(), cookie.encode())
            or not _same_origin(request)
        ):
            raise CsrfRefused(
                text="refused: this form's CSRF token is missing or wrong (reload the page and try again)"
            )
    try:
        response = await handler(request)
    except web.HTTPException as err:
        response = err
    except Exception as err:
        # Only the kind of failure and where: a message or a trace could carry a revealed value.
        LOG.error("console: %s on %s %s (a bug)", type(err).__name__, request.method, request.path)
        response = web.HTTPInternalServerError(text="The console failed on this page (a bug; see its log).")
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    if not cookie and not response.prepared:
        secure = request.app[SECURE_COOKIES_KEY]
        response.set_cookie(
            CSRF_COOKIE, request[CSRF_KEY], httponly=True, samesite="Strict", path="/", secure=secure
        )
    if isinstance(response, web.HTTPException) and response.status >= 400:
        raise response
    return response


class AccessLogger(AbstractAccessLogger):
    """One line per request: method, path, status. No query string, no header, no body."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info("%s %s %s %.3fs", request.method, request.path, response.status, time)
