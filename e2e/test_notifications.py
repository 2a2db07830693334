"""Issue 33, item 5: notifications. A policy's ``spec.notifications`` names receivers that are told
that a run waits for an answer or an approval, ended, or is stuck: at least once, with an event ID
to deduplicate by, never delaying the run, never with a sealed value.

Real API server, the operator as a separate process, and a receiver written here (loopback
``http.server``) that counts what it accepts by event ID. It first holds every request (a receiver
that hangs) while the run is answered, approved and completes; then, opened, it answers the
CloudEvents target 500, a redirect, a huge body and one dropped connection before it accepts.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_structured
from cloudevents.core.formats.json import JSONFormat
from e2e.test_destinations import refused

from durable_agents.api.v1alpha1 import GROUP, VERSION, NotificationTarget
from durable_agents.core.notifications import NOTIFIED_ANNOTATION, STAMP_SEPARATOR, delivery_key
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless
from durable_agents_testkit.scrape import free_port, metric, scrape, scrape_when

POLICY = "notify"
# What the CloudEvents target answers once opened, in order, before it accepts: each a failed attempt.
SCRIPT = ("500", "redirect", "huge", "drop")
HUGE = 8 * 1024 * 1024


@dataclass
class Receiver:
    """A loopback receiver: every request kept (path, headers, body), and what was accepted."""

    gate: threading.Event = field(default_factory=threading.Event)  # closed: every request hangs
    script: list[str] = field(default_factory=lambda: list(SCRIPT))
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    accepted: list[tuple[str, str]] = field(default_factory=list)  # (path, event ID or slack text)
    answered: list[str] = field(default_factory=list)  # what each request got, in order
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length)
        with self.lock:
            self.requests.append((handler.path, dict(handler.headers.items()), body))
        if not self.gate.is_set():
            self.gate.wait(30)  # hangs: the operator's attempt times out long before
            self._answer(handler, 503, "held")
            return
        if handler.path == "/ok/broken":  # never accepts
            self._answer(handler, 500, "500")
            return
        with self.lock:
            step = self.script.pop(0) if handler.path == "/ok/ce" and self.script else "accept"
        if step == "500":
            self._answer(handler, 500, step)
        elif step == "redirect":
            handler.send_response(302)
            handler.send_header("Location", f"{self.url}/elsewhere/redirected")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            self.answered.append(step)
        elif step == "huge":
            self._huge(handler)
        elif step == "drop":
            self.answered.append(step)
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)  # no answer at all
        else:
            self._accept(handler, body)

    def _answer(self, handler: BaseHTTPRequestHandler, status: int, what: str) -> None:
        self.answered.append(what)
        try:
            handler.send_response(status)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        except OSError:
            pass  # the operator gave up on it already

    def _huge(self, handler: BaseHTTPRequestHandler) -> None:
        self.answered.append("huge")
        try:
            handler.send_response(200)
            handler.send_header("Content-Length", str(HUGE))
            handler.end_headers()
            chunk = b"x" * 65536
            for _ in range(HUGE // len(chunk)):
                handler.wfile.write(chunk)
        except OSError:
            pass  # the operator stopped reading past its limit

    def _accept(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        if handler.path == "/ok/ce":
            headers = {k.lower(): v for k, v in handler.headers.items()}
            event = from_structured(HTTPMessage(headers, body), JSONFormat())
            seen = event.get_id()
        else:
            seen = json.loads(body)["text"]
        with self.lock:
            self.accepted.append((handler.path, seen))
        self._answer(handler, 200, "accepted")

    def ids(self, path: str = "/ok/ce") -> list[str]:
        with self.lock:
            return [seen for where, seen in self.accepted if where == path]

    def paths(self) -> list[str]:
        with self.lock:
            return [path for path, _, _ in self.requests]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            state.handle(self)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    state.gate.set()
    server.shutdown()
    server.server_close()


def policy(url: str, allowed: list[str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "version": "1",
        "tiers": {"http.post": "consequential"},
        "approvalRequiredTiers": ["consequential"],
        "approvalExpiry": "1h",
        "notifications": [
            {"name": "ce", "url": f"{url}/ok/ce"},
            {"name": "chat", "url": f"{url}/ok/slack", "format": "slack", "events": ["approvalRequested"]},
            {"name": "outside", "url": f"{url}/elsewhere/hook"},
        ],
    }
    if allowed is not None:
        spec["destinations"] = {"notifications": allowed}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": POLICY},
        "spec": spec,
    }


def paying_run(refsystem: ReferenceSystemThread, question: str, memo: str) -> dict[str, Any]:
    pay = {"effect": "http.post", "target": {"url": f"{refsystem.url}/effects"}, "arguments": {"memo": memo}}
    return {
        "taskType": "e2e",
        "objective": "pay, after a question and an approval",
        "policyRef": {"name": POLICY},
        "steps": [
            {"name": "confirm", "ask": {"question": question}},
            {"name": "pay", "effect": pay},
            {"name": "done", "complete": {}},
        ],
    }


def test_notifications_are_delivered_at_least_once_never_delaying_the_run_never_sealed(
    runs: Runs,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    refsystem: ReferenceSystemThread,
    receiver: Receiver,
) -> None:
    runs.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentpolicies", policy(receiver.url, [f"{receiver.url}/ok"])
    )
    port = free_port()
    start_operator(
        "notify",
        2,
        DURABLE_AGENTS_METRICS_PORT=str(port),
        DURABLE_AGENTS_NOTIFY_TIMEOUT_SECONDS="1",
        DURABLE_AGENTS_NOTIFY_BACKOFF_SECONDS="0.1",
        DURABLE_AGENTS_NOTIFY_BACKOFF_MAX_SECONDS="0.5",
    )
    marker = f"zs{uuid.uuid4().hex[:12]}"
    question, memo = f"{marker}-question", f"{marker}-memo"
    name = runs.create(paying_run(refsystem, question, memo))  # sealed as the webhook would

    # The receiver hangs on everything: the run is answered, approved and completes regardless.
    asked = runs.wait_state(name, "waiting_input")
    uid = asked["metadata"]["uid"]
    # A second attempt comes only after the first timed out: the receiver hangs, the run waits on.
    eventually(lambda: receiver.paths().count("/ok/ce") >= 2, Within.COMMIT, "an attempt after a timeout")
    runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    request = runs.wait_state(name, "waiting_approval")["status"]["approvalRequest"]
    runs.patch_spec(
        name, {"approvals": {request["requestId"]: {"digest": request["digest"], "decision": "approve"}}}
    )
    done = runs.wait_state(name, "completed")
    assert receiver.accepted == [], "nothing could have been delivered: the receiver held every request"
    assert_history_is_gapless(done)
    assert list(refsystem.counts().values()) == [1]  # applied once

    # Opened: the CloudEvents target fails 500, redirect, huge body, dropped connection, then accepts.
    receiver.gate.set()
    expected = {f"{uid}.input.confirm", f"{uid}.approval.{request['requestId']}", f"{uid}.ended.completed"}
    eventually(lambda: set(receiver.ids()) >= expected, Within.RUN, f"the receiver to accept {expected}")
    assert set(receiver.ids()) == expected
    assert len(set(receiver.ids())) == 3  # deduplicated by ID: each event counted once
    assert receiver.script == [], f"not every failure was served: {receiver.script}"
    assert {"500", "redirect", "huge", "drop", "held"} <= set(receiver.answered)
    text = scrape_when(port, {'durable_agents_notification_deliveries_total{outcome="delivered"}': 4})
    assert metric(text, 'durable_agents_commit_conflicts_total{resource="agentruns"}', default=0) == 0
    counted = {
        outcome: metric(text, f'durable_agents_notification_deliveries_total{{outcome="{outcome}"}}')
        for outcome in ("timeout", "http_error", "redirect", "too_large", "connection_error", "refused")
    }
    assert min(counted.values()) >= 1, counted

    # The Slack-compatible target: the approval, its shape, the pinned command.
    (slack,) = set(receiver.ids("/ok/slack"))
    pinned = f"--request {request['requestId']} --digest {request['digest']}"
    command = f"kubectl agentrun approve {name} -n {namespace} {pinned}"
    assert command in slack
    slack_body = next(
        json.loads(b) for p, _, b in receiver.requests if p == "/ok/slack" and command in b.decode()
    )
    assert set(slack_body) == {"text", "blocks"}
    assert slack_body["blocks"][0]["type"] == "section"
    assert slack_body["blocks"][0]["text"] == {"type": "mrkdwn", "text": slack_body["text"]}

    # The CloudEvent: its attributes and data, the command to decide pinned.
    approval = next(
        json.loads(b)
        for p, _, b in receiver.requests
        if p == "/ok/ce" and json.loads(b)["id"] == f"{uid}.approval.{request['requestId']}"
    )
    assert approval["type"] == "io.durable-agents.approval.requested"
    assert approval["source"].endswith(f"/namespaces/{namespace}/agentruns/{name}")
    assert approval["data"]["digest"] == request["digest"]
    assert approval["data"]["action"] == {"kind": "effect", "name": "http.post"}
    assert approval["data"]["commands"]["approve"] == command

    # The second line: the target outside the allowlist, and the redirect's target, got nothing.
    assert not [p for p in receiver.paths() if p.startswith("/elsewhere")], receiver.paths()
    eventually(
        lambda: any(
            e.reason == "NotificationRefused" and "spec.notifications[2].url" in e.message
            for e in runs.events(name)
        ),
        Within.COMMIT,
        "a NotificationRefused Event naming the field",
    )

    # No sealed value, in clear or sealed, in any body sent.
    stored = runs.get(name)["spec"]
    sealed = [
        json.dumps(stored["steps"][0]["ask"]["question"]),
        json.dumps(stored["steps"][1]["effect"]["arguments"]),
    ]
    bodies = [body.decode() for _, _, body in receiver.requests]
    assert not [b for b in bodies if marker in b], "a sealed value in clear in a notification"
    assert not [b for b in bodies for s in sealed if s.strip('"') in b], (
        "a sealed value's ciphertext in a notification"
    )

    # What was delivered is recorded on the run (its end: still due, so kept).
    eventually(
        lambda: (runs.get(name)["metadata"].get("annotations") or {}).get(NOTIFIED_ANNOTATION),
        Within.COMMIT,
        "the run's record of done deliveries",
    )


def test_a_restarted_operator_sends_what_was_missed_and_not_what_was_sent(
    runs: Runs,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    receiver: Receiver,
) -> None:
    """A record of deliveries someone else wrote is ignored. One shard (``SHARDS=1``): the pass
    that sends the second run's notice holds the first run's shard too, so it has judged the first
    run by then: a re-send would have been started."""
    receiver.script.clear()
    body = policy(receiver.url, None)
    body["spec"]["notifications"] = [
        {"name": "ce", "url": f"{receiver.url}/ok/ce", "events": ["inputRequested"]}
    ]
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", body)
    fast = {"DURABLE_AGENTS_SHARDS": "1", "DURABLE_AGENTS_NOTIFY_TIMEOUT_SECONDS": "1"}
    ask = {"taskType": "e2e", "objective": "ask", "policyRef": {"name": POLICY}}
    ask["steps"] = [{"name": "confirm", "ask": {"question": "go?"}}, {"name": "done", "complete": {}}]

    one = runs.create(ask)
    uid = runs.get(one)["metadata"]["uid"]
    # Someone with patch on the run writes a record of the delivery before any operator runs, to
    # silence it: without the operator's stamp it is ignored.
    target = NotificationTarget.model_validate(body["spec"]["notifications"][0])
    forged = {NOTIFIED_ANNOTATION: delivery_key(target, f"{uid}.input.confirm")}
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentruns", one, {"metadata": {"annotations": forged}}
    )
    first = start_operator("first", 2, **fast)
    runs.wait_state(one, "waiting_input")
    eventually(lambda: "/ok/ce" in receiver.paths(), Within.COMMIT, "an attempt the receiver holds")
    first.kill()  # before anything was delivered

    receiver.gate.set()
    second = start_operator("second", 2, **fast)
    eventually(lambda: f"{uid}.input.confirm" in receiver.ids(), Within.TAKEOVER, "the missed notice sent")
    eventually(  # the operator's record (stamped), in place of the forged one
        lambda: STAMP_SEPARATOR in (runs.get(one)["metadata"].get("annotations") or {})[NOTIFIED_ANNOTATION],
        Within.COMMIT,
        "the delivery recorded on the run",
    )
    second.kill()

    start_operator("third", 2, **fast)
    two = runs.create(ask)
    uid_two = runs.wait_state(two, "waiting_input")["metadata"]["uid"]
    eventually(lambda: f"{uid_two}.input.confirm" in receiver.ids(), Within.TAKEOVER, "the new run's notice")
    assert receiver.ids().count(f"{uid}.input.confirm") == 1, receiver.ids()
    assert runs.state(one) == "waiting_input"  # still due: only the record kept it from a re-send


def test_a_stuck_run_is_told_and_a_receiver_that_never_accepts_is_given_up_on_without_touching_the_run(
    runs: Runs,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    refsystem: ReferenceSystemThread,
    receiver: Receiver,
) -> None:
    """Nobody holds the policy's approver verb (``sign-off``): the run waits for an approval and is
    Stuck ``NoApprover``. One target accepts both events; the other answers 500 until abandoned."""
    receiver.gate.set()
    receiver.script.clear()
    body = policy(receiver.url, None)
    body["spec"]["approvers"] = {"verb": "sign-off"}
    broken = {"name": "broken", "url": f"{receiver.url}/ok/broken", "events": ["approvalRequested"]}
    body["spec"]["notifications"] = [
        {"name": "ce", "url": f"{receiver.url}/ok/ce", "events": ["approvalRequested", "runStuck"]},
        broken,
    ]
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", body)
    port = free_port()
    start_operator(
        "stuck",
        2,
        DURABLE_AGENTS_METRICS_PORT=str(port),
        DURABLE_AGENTS_STUCK_CHECK_SECONDS="1",
        DURABLE_AGENTS_NOTIFY_BACKOFF_SECONDS="0.1",
        DURABLE_AGENTS_NOTIFY_BACKOFF_MAX_SECONDS="0.5",
        DURABLE_AGENTS_NOTIFY_GIVE_UP_AFTER="2s",
    )
    spec = paying_run(refsystem, "unused", "unused")
    spec["steps"] = spec["steps"][1:]  # pay, done
    name = runs.create(spec)
    run = runs.wait_state(name, "waiting_approval")
    uid, request = run["metadata"]["uid"], run["status"]["approvalRequest"]["requestId"]

    def stuck_id() -> str | None:
        return next((i for i in receiver.ids() if i.startswith(f"{uid}.stuck.NoApprover.")), None)

    eventually(stuck_id, Within.COMMIT, "the runStuck notice")
    assert f"{uid}.approval.{request}" in receiver.ids()
    eventually(
        lambda: any(
            e.reason == "NotificationAbandoned" and "broken" in e.message and "500" in e.message
            for e in runs.events(name)
        ),
        Within.COMMIT,
        "a NotificationAbandoned Event naming the target and its answer",
    )
    scrape_when(port, {'durable_agents_notification_deliveries_total{outcome="abandoned"}': 1})
    # Abandoned is done: recorded with the delivered ones, so never retried after a restart.
    gave_up = delivery_key(NotificationTarget.model_validate(broken), f"{uid}.approval.{request}")
    eventually(
        lambda: (
            gave_up in ((runs.get(name)["metadata"].get("annotations") or {}).get(NOTIFIED_ANNOTATION) or "")
        ),
        Within.COMMIT,
        "the abandoned delivery recorded",
    )
    assert runs.state(name) == "waiting_approval"  # the run is untouched by it
    assert refsystem.counts() == {}


def test_acting_on_a_notice_at_once_makes_no_commit_conflict(
    runs: Runs,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    refsystem: ReferenceSystemThread,
    receiver: Receiver,
) -> None:
    """A person who answers and approves the moment each notice arrives: the notifier's record is
    a write to the run too, and written then it would make the worker's commit conflict (409)."""
    receiver.gate.set()
    receiver.script.clear()
    body = policy(receiver.url, None)
    body["spec"]["notifications"] = body["spec"]["notifications"][:1]
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", body)
    port = free_port()
    start_operator("quick", 2, DURABLE_AGENTS_METRICS_PORT=str(port))

    def accepted(event_id: str) -> None:
        eventually(lambda: event_id in receiver.ids(), Within.COMMIT, f"the receiver to accept {event_id}")

    for _ in range(3):
        name = runs.create(paying_run(refsystem, "go?", "memo"))
        uid = runs.wait_state(name, "waiting_input")["metadata"]["uid"]
        runs.patch_spec(name, {"answers": {"confirm": "yes"}})  # at once: the notice is on its way
        request = runs.wait_state(name, "waiting_approval")["status"]["approvalRequest"]
        decision = {request["requestId"]: {"digest": request["digest"], "decision": "approve"}}
        runs.patch_spec(name, {"approvals": decision})
        runs.wait_state(name, "completed")
        for event in ("input.confirm", f"approval.{request['requestId']}", "ended.completed"):
            accepted(f"{uid}.{event}")
    text = scrape(port)
    assert metric(text, 'durable_agents_commit_conflicts_total{resource="agentruns"}', default=0) == 0


@pytest.mark.local_plane("webhook")
def test_a_notification_target_outside_the_allowlist_is_refused_at_admission_naming_the_field(
    runs: Runs, namespace: str, start_operator: Callable[..., OperatorProcess], receiver: Receiver
) -> None:
    start_operator("webhook", 2, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    runs.await_webhook()
    body = policy(receiver.url, [f"{receiver.url}/ok"])
    message = refused(
        lambda: runs.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", body)
    )
    assert "spec.notifications[2].url" in message, message
    assert "spec.destinations.notifications" in message, message
    body["spec"]["notifications"] = body["spec"]["notifications"][:2]  # the allowed ones: admitted
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", body)
    assert receiver.requests == []
