"""The console's pure parts and its guard rails, without a cluster: the timeline's segments, the
templates' escaping, the response headers, the CSRF check and the sign-in pages (the in-cluster
authority with no token: nothing reaches an API server). The flows against the real API server
and operator are in e2e/test_console.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from durable_agents.console import cluster, timeline
from durable_agents.console.app import make_app, templates
from durable_agents.console.authority import CSRF_COOKIE, BearerAuthority
from durable_agents.console.views import run_context

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
XSS = "</title><script>alert(1)</script>\"'><img src=x onerror=alert(2)>"


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def run(**status: Any) -> dict[str, Any]:
    history = [
        {
            "stateVersion": 1,
            "event": "accepted",
            "from": "pending",
            "to": "ready",
            "at": at(1),
            "holder": "op-a",
        },
        {
            "stateVersion": 2,
            "event": "approval_requested",
            "from": "ready",
            "to": "waiting_approval",
            "at": at(2),
        },
        {
            "stateVersion": 3,
            "event": "approval_decided",
            "from": "waiting_approval",
            "to": "ready",
            "at": at(602),
            "detail": "approve req-1 by alice",
            "holder": "op-b",
        },
        {"stateVersion": 4, "event": "completed", "from": "ready", "to": "completed", "at": at(603)},
    ]
    return {
        "metadata": {"name": "r", "namespace": "ns", "creationTimestamp": at(0), "resourceVersion": "7"},
        "spec": {"objective": XSS},
        "status": {"state": "completed", "stateVersion": 4, "history": history, **status},
    }


def test_the_timeline_highlights_the_wait_and_says_who_ended_it() -> None:
    segments = timeline.segments(run(), T0 + timedelta(hours=1))
    assert [s.state for s in segments] == ["pending", "ready", "waiting_approval", "ready", "completed"]
    wait = segments[2]
    assert wait.waiting
    assert wait.kind == "wait"
    assert wait.seconds(T0) == 600
    assert wait.ended_by == "approval_decided (approve req-1 by alice) committed by op-b"
    assert segments[-1].end == segments[-1].start, "an ended run's last state does not run on to now"
    assert abs(sum(s.width for s in segments) - timeline.WIDTH) < 1e-6
    assert all(s.width >= timeline.MIN_WIDTH * 0.99 for s in segments), "a short stretch stays visible"
    assert wait.width > timeline.WIDTH / 2, "the long wait takes most of the picture"
    assert [round(s.x + s.width, 6) for s in segments[:-1]] == [round(s.x, 6) for s in segments[1:]]


def test_a_run_still_waiting_runs_on_to_now_and_one_without_history_is_one_segment() -> None:
    waiting = run()
    waiting["status"]["history"] = waiting["status"]["history"][:2]
    last = timeline.segments(waiting, T0 + timedelta(seconds=62))[-1]
    assert (last.state, last.end, last.ended_by) == ("waiting_approval", None, "")
    assert timeline.span(last.seconds(T0 + timedelta(seconds=62))) == "1m00s"
    fresh = {"metadata": {"name": "r", "creationTimestamp": at(0)}, "status": {}}
    assert [s.state for s in timeline.segments(fresh, T0)] == ["pending"]


def test_the_run_page_renders_every_value_of_the_run_as_text() -> None:
    request = {
        "requestId": "req-1",
        "digest": "sha256:" + "a" * 64,
        "step": "pay",
        "effect": "http.post",
        "tier": "consequential",
        "arguments": "sealed:v1:x",
        "evidence": [],
        "policyReason": XSS,
        "approverRole": "approve on agentruns",
        "expiresAt": at(3600),
        "allowedDecisions": ["approve", "reject"],
        "proposal": {"tool": "refund", "callId": XSS, "turn": 1, "reason": "sealed:v1:y"},
    }
    page_run = run(state="waiting_approval", approvalRequest=request, waitingFor=f"approval:{XSS}")
    read = {
        "user": XSS,
        "run": page_run,
        "actions": [],
        "ledger_refused": None,
        "why": cluster.why(page_run, []),
        "possible": {"decide", "reveal", "cancel"},
    }
    revealed = {
        "approvalRequest": {
            "arguments": {"memo": XSS},
            "proposal": {"reason": {"writtenBy": "model", "text": XSS}},
        },
        "values": {"answers/q": XSS},
    }
    page = templates().get_template("run.html")
    out = page.render(csrf="t0k", mode="local", said=XSS, refused=XSS, **run_context(read, revealed))
    assert "<script>" not in out
    assert "<img" not in out
    assert "onerror=alert(2)>" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert 'name="digest" value="sha256:' + "a" * 64 + '"' in out, (
        "the decision is pinned to the digest shown"
    )
    assert "model says (written by the model, not authority):" in out
    assert ' style="' not in out, "an inline style (the CSP allows none)"
    assert "<script" not in out.replace('<script src="/static/console.js" defer></script>', "")


def test_the_actions_offered_are_those_the_state_admits_and_the_user_may() -> None:
    waiting = run(
        state="waiting_approval", approvalRequest={"approverVerb": "sign", "approverResource": "payments"}
    )
    everything = cluster.possible(waiting, lambda verb, resource: True)
    assert everything == {"cancel", "escalate", "reconcile", "decide", "reveal"}
    asked: list[tuple[str, str]] = []
    only_cancel = cluster.possible(
        waiting, lambda verb, resource: asked.append((verb, resource)) or verb in ("patch", "cancel")
    )
    assert only_cancel == {"cancel"}
    assert ("sign", "payments") in asked, "the decision's verb is the policy's"
    assert cluster.possible(waiting, lambda verb, resource: verb != "patch") == set(), (
        "every action is a patch"
    )
    assert cluster.possible(run(), lambda verb, resource: True) == {"reveal"}, "an ended run takes no control"
    unknown = run(state="waiting_external", waitingFor="action:act-1")
    assert "settle" in cluster.possible(unknown, lambda verb, resource: True)
    settle = cluster.possible(unknown, lambda verb, resource: verb in ("patch", "reconcile"))
    assert "settle" not in settle, "saying what happened needs the policy's approver verb"
    assert "reconcile" in settle


@pytest.fixture
async def client() -> Any:
    authority = BearerAuthority("https://127.0.0.1:1", None, "ns", insecure_cookies=True)
    async with TestClient(TestServer(make_app(authority))) as test_client:
        yield test_client


async def test_every_page_carries_the_security_headers_and_no_token_gets_the_sign_in_page(
    client: TestClient,
) -> None:
    answer = await client.get("/runs")
    assert answer.status == 401
    text = await answer.text()
    assert "Sign in" in text
    assert "Traceback" not in text
    csp = answer.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert answer.headers["Cache-Control"] == "no-store"
    cookie = answer.cookies[CSRF_COOKIE]
    assert cookie["httponly"]
    assert cookie["samesite"] == "Strict"
    script = await client.get("/static/console.js")
    assert script.status == 200
    assert "Content-Security-Policy" in script.headers


async def test_a_post_without_the_csrf_token_or_from_another_origin_is_refused(client: TestClient) -> None:
    token = (await client.get("/sign-in")).cookies[CSRF_COOKIE].value
    forged = await client.post("/runs/ns/r/do/cancel", data={"reason": "x"})
    assert forged.status == 403
    assert "CSRF" in await forged.text()
    wrong = await client.post("/runs/ns/r/do/cancel", data={"csrf": "not-it"})
    assert wrong.status == 403
    elsewhere = await client.post(
        "/runs/ns/r/do/cancel", data={"csrf": token}, headers={"Origin": "https://evil.example"}
    )
    assert elsewhere.status == 403
    # With the token, the POST reaches the handler: no credentials, the sign-in page.
    signed_out = await client.post("/runs/ns/r/do/cancel", data={"csrf": token})
    assert signed_out.status == 401
    assert "Sign in" in await signed_out.text()
