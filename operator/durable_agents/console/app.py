"""The console's aiohttp application: routes, templates, static files, the security middleware."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import jinja2
from aiohttp import web

from durable_agents.console import inbox, live, views
from durable_agents.console.authority import Authority
from durable_agents.console.security import SECURE_COOKIES_KEY, protect

HERE: Final = Path(__file__).resolve().parent


def templates() -> jinja2.Environment:
    """Every template autoescaped (HTML and the inline SVG alike); a missing field of a run renders empty."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.ChainableUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def make_app(authority: Authority) -> web.Application:
    app = web.Application(middlewares=[protect], client_max_size=64 * 1024)
    app[views.AUTHORITY] = authority
    app[views.TEMPLATES] = templates()
    app[SECURE_COOKIES_KEY] = authority.secure_cookies
    run = "/runs/{namespace}/{name}"
    app.add_routes(
        [
            web.get("/", views.home),
            web.get("/sign-in", views.sign_in),
            web.post("/sign-in", views.sign_in_with_token),
            web.post("/sign-out", views.sign_out),
            web.get("/inbox", inbox.inbox_page),
            web.get("/runs", views.runs_page),
            web.get(run, views.run_view),
            web.post(f"{run}/reveal", views.reveal_view),
            web.post(run + "/do/{action}", views.action_view),
            web.get("/events/runs", live.runs_events),
            web.get(f"/events{run}", live.run_events),
            web.static("/static", HERE / "static", append_version=True),
        ]
    )
    return app
