"""The inbox page: what waits for the signed-in user to decide or answer, now.

The entries are :func:`durable_agents.kubectl.inbox.inbox`'s, as ``kubectl agentrun inbox`` prints
them (the same SelfSubjectAccessReviews, four-eyes, quorum, oldest first), read with the user's
own client. Each approval carries approve and reject forms pinned to the request ID and digest on
screen (:func:`durable_agents.kubectl.decide.decide` sends nothing when the pending request is
another one); a question links to its run, where it is answered.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.console import cluster
from durable_agents.console.authority import NotSignedIn
from durable_agents.console.views import AUTHORITY, as_user, refusal_page, render, sign_in_page
from durable_agents.core.inbox import InboxEntry
from durable_agents.kubectl import inbox as kubectl_inbox
from durable_agents.kubectl.list import human_duration


def _row(entry: InboxEntry, now: datetime) -> dict[str, Any]:
    expires = entry.expires_at
    return {
        "entry": entry,
        "age": human_duration(now - (entry.waiting_since or now)),
        "expires": "-"
        if expires is None
        else ("expired" if expires <= now else f"in {human_duration(expires - now)}"),
        "expires_at": expires.isoformat() if expires is not None else "",
        "decisions": [
            word
            for word in (
                c.split()[2] for c in [entry.command, *entry.extra_commands] if c.startswith("kubectl ")
            )
            if word in ("approve", "reject")
        ],
    }


def _read(api: client.ApiClient, namespace: str | None) -> dict[str, Any]:
    me = kubectl_inbox.whoami(api)
    found, listed = kubectl_inbox.inbox(api, namespace, me)
    return {
        "user": me or "(unknown)",
        "found": found,
        "notes": kubectl_inbox._notes(listed, namespace, found),
        "version": listed.resource_version or "",
        "watchable": namespace is not None or listed.cluster_wide,
    }


async def inbox_page(request: web.Request) -> web.Response:
    everywhere = request.query.get("all") == "1"
    namespace = (
        None if everywhere else (request.query.get("namespace") or request.app[AUTHORITY].default_namespace)
    )
    try:
        read = await as_user(request, lambda api: _read(api, namespace))
    except NotSignedIn as err:
        return sign_in_page(request, str(err))
    except kubectl_inbox.InboxError as err:
        return refusal_page(request, cluster.Refused(str(err)))
    except ApiException as err:
        return refusal_page(request, cluster.refused(err, "the inbox"))
    now = datetime.now(UTC)
    where = "all=1" if namespace is None else f"namespace={namespace}"
    return render(
        request,
        "inbox.html",
        user=read["user"],
        namespace=namespace,
        rows=[_row(entry, now) for entry in read["found"]],
        notes=read["notes"],
        live=f"/events/runs?{where}&version={read['version']}" if read["watchable"] else "",
    )
