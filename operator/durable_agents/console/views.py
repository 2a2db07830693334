"""The pages and the actions. Each handler makes the API calls with the request's own client
(:mod:`.authority`) in a thread, and renders a Jinja2 template (autoescaped: a run's objective, a
model's words and an answer are text, never markup). A refusal of the API server is shown as its
message, with the status it came with; no credentials: the sign-in page."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import jinja2
from aiohttp import web
from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.console import cluster, timeline
from durable_agents.console.authority import (
    Authority,
    BearerAuthority,
    LocalAuthority,
    NotSignedIn,
    set_session_cookie,
)
from durable_agents.console.security import csrf_token
from durable_agents.core.sealed_values import is_sealed
from durable_agents.kubectl import list as kubectl_list
from durable_agents.kubectl import revealed as kubectl_revealed
from durable_agents.kubectl.main import (
    MODEL_SAYS,
    _evidence_lines,
    _model_value,
    _pinned_lines,
    _quorum_lines,
)

AUTHORITY: Final = web.AppKey("authority", Authority)
TEMPLATES: Final = web.AppKey("templates", jinja2.Environment)
T = TypeVar("T")


def render(request: web.Request, template: str, code: int = 200, /, **context: Any) -> web.Response:
    authority = request.app[AUTHORITY]
    page = request.app[TEMPLATES].get_template(template)
    body = page.render(csrf=csrf_token(request), mode=authority.mode, **context)
    return web.Response(text=body, status=code, content_type="text/html", charset="utf-8")


def sign_in_page(request: web.Request, said: str, status: int = 401) -> web.Response:
    return render(
        request, "signin.html", status, said=said, paste=isinstance(request.app[AUTHORITY], BearerAuthority)
    )


async def as_user(request: web.Request, call: Callable[[client.ApiClient], T]) -> T:
    """``call(api)`` in a thread with the request's own API client."""
    authority = request.app[AUTHORITY]
    api = authority.api_client(request)
    try:
        return await asyncio.to_thread(call, api)
    finally:
        authority.release(api)


def refusal_page(request: web.Request, err: cluster.Refused, user: str = "") -> web.Response:
    if err.status == 401:
        return sign_in_page(request, str(err))
    return render(request, "refused.html", err.status if err.status >= 400 else 403, said=str(err), user=user)


# -- signing in -----------------------------------------------------------------------------------


async def sign_in(request: web.Request) -> web.Response:
    """Local: the one-time token from the printed URL buys a session cookie, once."""
    authority = request.app[AUTHORITY]
    if not isinstance(authority, LocalAuthority):
        return sign_in_page(request, "", 200)
    session = authority.spend(request.query.get("token", ""))
    if session is None:
        return sign_in_page(
            request,
            "This sign-in link is wrong or was used already."
            " Run kubectl agentrun console again for a new one.",
        )
    response = web.Response(status=303, headers={"Location": "/inbox"})
    set_session_cookie(response, session, secure=authority.secure_cookies)
    return response


async def sign_in_with_token(request: web.Request) -> web.Response:
    """In-cluster: a pasted token, checked with the API server before a session holds it."""
    authority = request.app[AUTHORITY]
    if not isinstance(authority, BearerAuthority):
        return sign_in_page(request, "Open the URL that kubectl agentrun console printed.")
    token = str((await request.post()).get("token", "")).strip()
    if not token:
        return sign_in_page(request, "Paste a token.", 400)
    api = authority.client_for_token(token)
    try:
        await asyncio.to_thread(cluster.whoami, api)
    except ApiException:
        return sign_in_page(request, "The API server did not accept this token (expired or wrong).")
    finally:
        api.close()
    response = web.Response(status=303, headers={"Location": "/inbox"})
    set_session_cookie(response, authority.sessions.new(token), secure=authority.secure_cookies)
    return response


async def sign_out(request: web.Request) -> web.Response:
    request.app[AUTHORITY].sessions.end(request)
    return sign_in_page(request, "Signed out.", 200)


# -- the list -------------------------------------------------------------------------------------


def list_query(request: web.Request) -> cluster.ListQuery:
    q = request.query
    everywhere = q.get("all") == "1"
    return cluster.ListQuery(
        namespace=None if everywhere else (q.get("namespace") or request.app[AUTHORITY].default_namespace),
        states=tuple(s for s in q.getall("state", []) if s),
        region=q.get("region") or None,
        waiting_longer_than=q.get("longer", "").strip(),
        stuck=q.get("stuck") == "1",
        escalated=q.get("escalated") == "1",
    )


def list_rows(runs: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    rows = []
    for run in runs:
        meta, status = run["metadata"], run.get("status") or {}
        rows.append(
            {
                "namespace": meta.get("namespace", ""),
                "name": meta["name"],
                "state": kubectl_list.state_of(run),
                "waiting_for": status.get("waitingFor") or "-",
                "age": kubectl_list.human_duration(now - (kubectl_list.in_state_since(run) or now)),
                "region": kubectl_list.region_of(run),
                "stuck": kubectl_list.stuck_reason(run),
                "objective": (run.get("spec") or {}).get("objective") or "",
            }
        )
    return rows


async def runs_page(request: web.Request) -> web.Response:
    query = list_query(request)
    try:
        user, (runs, version) = await as_user(
            request, lambda api: (cluster.whoami(api), cluster.list_runs(api, query))
        )
    except NotSignedIn as err:
        return sign_in_page(request, str(err))
    except cluster.Refused as err:
        return refusal_page(request, err)
    except ApiException as err:
        return refusal_page(request, cluster.refused(err, "the list"))
    return render(
        request,
        "runs.html",
        user=user,
        query=query,
        states=kubectl_list.STATES,
        rows=list_rows(runs, datetime.now(UTC)),
        version=version,
        live=f"/events/runs?{request.query_string}",
    )


# -- a run ----------------------------------------------------------------------------------------


def shown(value: Any) -> str:
    """A value as the page prints it: "(sealed)", a string as it is, anything else as JSON (the
    template escapes it: text, never markup)."""
    if value is None:
        return "-"
    if is_sealed(value):
        return "(sealed)"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, indent=2)


def model_words(value: Any) -> str:
    """The model's words as the plugin prints them: quoted, every control character escaped."""
    if isinstance(value, Mapping) and isinstance(value.get("text"), str):
        value = value["text"]
    return _model_value(value)


def read_run(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    """Everything a run's page shows, read as the user: the run, its ledger, what they may do."""
    run = cluster.get_run(api, ns, name)
    actions, ledger_refused = cluster.actions_of(api, ns, name)
    answers: dict[tuple[str, str], bool] = {}

    def allowed(verb: str, resource: str) -> bool:
        if (verb, resource) not in answers:
            answers[verb, resource] = cluster.may(api, ns, name, verb, resource)
        return answers[verb, resource]

    return {
        "user": cluster.whoami(api),
        "run": run,
        "actions": actions,
        "ledger_refused": ledger_refused,
        "why": cluster.why(run, actions),
        "possible": cluster.possible(run, allowed),
    }


def run_context(read: dict[str, Any], revealed: dict[str, Any] | None) -> dict[str, Any]:
    run, now = read["run"], datetime.now(UTC)
    status = run.get("status") or {}
    meta = run["metadata"]
    request = status.get("approvalRequest")
    return {
        **read,
        "meta": meta,
        "spec": run.get("spec") or {},
        "status": status,
        "approval": request,
        "segments": timeline.segments(run, now),
        "span": lambda s: timeline.span(s.seconds(now)),
        "width": timeline.WIDTH,
        "checkpoint": status.get("checkpoint") or {},
        "evidence": [
            line.split("evidence:", 1)[1].strip()
            for line in (_evidence_lines(request, status.get("checkpoint") or {}) if request else [])
        ],
        "conditions": status.get("conditions") or [],
        "revealed": revealed,
        "controls": read["possible"] - {"reveal", "decide", "settle"},
        "quorum": [line.strip() for line in _quorum_lines(request or {})],
        "pinned": [line.strip() for line in (_pinned_lines(run, request) if request else [])],
        "question_only": [
            line.strip()
            for line in (
                kubectl_revealed.question_lines(revealed)
                if revealed is not None and kubectl_revealed.question_only(revealed)
                else []
            )
        ],
        "shown": shown,
        "model_words": model_words,
        "model_says": MODEL_SAYS,
        "page_url": f"/runs/{meta['namespace']}/{meta['name']}",
        "live": f"/events/runs/{meta['namespace']}/{meta['name']}?version={meta.get('resourceVersion', '')}",
    }


async def run_page(
    request: web.Request, *, said: str = "", refused: str = "", revealed: bool = False, status: int = 200
) -> web.Response:
    ns, name = request.match_info["namespace"], request.match_info["name"]
    opened: dict[str, Any] | None = None
    try:
        read = await as_user(request, lambda api: read_run(api, ns, name))
    except NotSignedIn as err:
        return sign_in_page(request, str(err))
    except cluster.Refused as err:
        return refusal_page(request, err)
    except ApiException as err:
        return refusal_page(request, cluster.refused(err, "the read"))
    if revealed:
        try:
            run, opened = await as_user(request, lambda api: cluster.reveal(api, ns, name))
            read["run"] = {**read["run"], "status": run.get("status") or read["run"].get("status")}
        except cluster.Refused as err:
            refused, status = str(err), err.status
    return render(request, "run.html", status, said=said, refused=refused, **run_context(read, opened))


async def run_view(request: web.Request) -> web.Response:
    return await run_page(request)


async def reveal_view(request: web.Request) -> web.Response:
    """The arguments and the model's words, for an approver: in this response only."""
    return await run_page(request, revealed=True)


async def action_view(request: web.Request) -> web.Response:
    ns, name, action = (
        request.match_info["namespace"],
        request.match_info["name"],
        request.match_info["action"],
    )
    form = {k: v for k, v in (await request.post()).items() if isinstance(v, str)}
    try:
        said = await as_user(request, lambda api: cluster.act(api, ns, name, action, form))
    except NotSignedIn as err:
        return sign_in_page(request, str(err))
    except cluster.Refused as err:
        if err.status == 401:
            return sign_in_page(request, str(err))
        return await run_page(request, refused=str(err), status=err.status if err.status >= 400 else 403)
    return await run_page(request, said=said)


async def home(request: web.Request) -> web.Response:
    return web.Response(status=303, headers={"Location": "/inbox"})
