"""The console in a real browser (Debian's headless chromium, driven by Playwright), against the
real API server, the operator with its admission webhook, and users with client certificates,
each running their own ``kubectl agentrun console`` (their kubeconfig, a one-time sign-in link).

- An approver opens the model's run, reveals the proposed call (equal to what the model proposed),
  reads the model's words marked as the model's, approves: the reference system records one
  application, and the API server's audit log and the decision's stamp name the approver.
- Who lacks a verb sees no button for it, and a crafted POST (with a valid CSRF token) is refused
  by the API server (RBAC, or the webhook's SubjectAccessReview); a forged POST without the CSRF
  token is refused by the console; a wrong or spent sign-in link gets the sign-in page; a URL for
  another namespace shows the API server's refusal.
- HTML and script in a run's objective, a model's words and an answer are shown as text: the DOM
  holds no element made from them and no script ran.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from e2e.test_agent import agent_namespace, agent_spec  # noqa: F401 (a fixture)
from e2e.test_reconcile import key_of, payment, people, stuck  # noqa: F401 (fixtures)
from e2e.test_reconcile import policy as reconcile_policy
from e2e.test_reveal import MEMO, QUESTION, invoice, kubeconfigs, policy, user_api  # noqa: F401 (a fixture)
from kubernetes import client
from playwright.sync_api import expect

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.console.authority import CSRF_COOKIE
from durable_agents_testkit.agent_sample import API_KEY, sample_of, script
from durable_agents_testkit.audit import audit_offset, read_audit
from durable_agents_testkit.browser import SCREENSHOTS, Console, chromium, start_console
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.cutproxy import CutProxy
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import bind, grant, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

XSS = '</title><script>window.__pwned=1</script>"\'><img src=x onerror="window.__pwned=2"><b>bold</b>'
MODEL_SAYS = "model says (written by the model, not authority):"


@pytest.fixture
def model() -> Iterator[ModelServerThread]:
    """The sample's reference model, whose words when it proposes the refund carry markup."""
    scripted = script()
    scripted["rules"][1]["content"] = f"The limits allow it. {XSS}"
    with ModelServerThread(scripted, api_key=API_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as started:
        yield started


@pytest.fixture
def consoles(kubeconfigs: dict[str, Path], namespace: str) -> Iterator[Callable[[str], Console]]:  # noqa: F811
    """role -> that user's console (started on first use); stopped afterwards, its log checked."""
    started: dict[str, Console] = {}

    def of(role: str) -> Console:
        if role not in started:
            started[role] = start_console(kubeconfigs[role], namespace)
        return started[role]

    yield of
    for role, console in started.items():
        log = console.stop()
        assert "Traceback" not in log, f"{role}'s console: {log}"
        secret = console.sign_in_url.split("token=", 1)[1]
        printed = [line for line in console.log if secret in line]
        assert len(printed) == 1, f"the token was logged: {printed}"
        assert printed[0].startswith("Console ("), printed


def signed_in(browser: Any, console: Console) -> Any:
    """A fresh browser context (its own cookies) signed in with the console's one-time link."""
    page = browser.new_context().new_page()
    page.on("dialog", lambda dialog: pytest.fail(f"a dialog opened: {dialog.message}"))
    problems: list[str] = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.problems = problems
    answer = page.goto(console.sign_in_url)
    assert answer is not None
    assert answer.ok, answer.text()
    assert page.url.endswith("/inbox"), page.url
    return page


def await_selector(page: Any, selector: str) -> None:
    """Wait for ``selector``; failing, say what the page shows instead."""
    try:
        page.wait_for_selector(selector, timeout=60_000)
    except Exception as err:
        raise AssertionError(
            f"{selector} never showed on {page.url}: {page.inner_text('body')[:3000]}"
        ) from err


def no_markup_ran(page: Any) -> None:
    """Nothing injected became an element, and no script ran (the escaping, not only the CSP)."""
    assert page.evaluate("window.__pwned") is None, "an injected script ran"
    assert page.locator("main script, main img, main b").count() == 0, "injected markup became elements"
    assert not [p for p in page.problems if "Content Security Policy" in p], page.problems


def screenshot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / name), full_page=True)


def post(page: Any, path: str, fields: dict[str, str]) -> dict[str, Any]:
    """A crafted POST from the page (same origin, its cookies): status and text of the answer."""
    result: dict[str, Any] = page.evaluate(
        """async ([path, fields]) => {
            const body = new FormData();
            for (const [k, v] of Object.entries(fields)) body.append(k, v);
            const answer = await fetch(path, {method: "POST", body, credentials: "same-origin"});
            return {status: answer.status, text: await answer.text()};
        }""",
        [path, fields],
    )
    return result


@pytest.mark.browser
@pytest.mark.local_plane("users", "webhook")
def test_an_approver_reveals_and_approves_the_models_call_in_the_console_as_themselves(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,  # noqa: F811
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    kubeconfigs: dict[str, Path],  # noqa: F811
    plane: LocalControlPlane,
    browser: Any,
    consoles: Callable[[str], Console],
) -> None:
    op = start_operator("console", DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()
    ns, name = agent_namespace, "refund"
    objective = f"Refund order A-1042. {XSS}"
    spec = {**agent_spec(model, refsystem), "objective": objective}
    user_api(kubeconfigs["editor"]).create_namespaced_custom_object(
        GROUP, VERSION, ns, "agentruns", {**sample_of("AgentRun"), "spec": spec}
    )
    run = runs.wait_state(name, "waiting_approval", timeout=Within.TAKEOVER)
    request = run["status"]["approvalRequest"]
    proposed = script()["rules"][1]["toolCalls"][0]["arguments"]
    offset = audit_offset(plane.audit_log_path)

    console = consoles("approver")
    page = signed_in(browser, console)
    assert page.inner_text("#user") == "approver"
    # The inbox: this request, pinned to its digest, decidable here.
    item = page.locator(f"#item-{ns}-{name}")
    assert item.locator(".digest").inner_text() == request["digest"]
    assert item.locator(".do-approve").count() == 1
    screenshot(page, "console-inbox.png")
    page.goto(f"{console.base}/runs?state=waiting_approval")
    assert page.locator("td.objective").inner_text() == objective
    no_markup_ran(page)
    page.click(f"a[href='/runs/{ns}/{name}']")
    await_selector(page, "#approval")
    assert page.inner_text("#objective") == objective
    assert page.inner_text("#arguments") == "(sealed)"
    assert page.inner_text("#digest") == request["digest"]
    assert page.locator("#do-approve").count() == 1
    assert page.locator("#do-cancel").count() == 0, "the approver holds no cancel verb"
    assert page.locator("svg.timeline .seg-wait").count() >= 1, "the wait is not in the picture"

    page.click("#do-reveal")
    await_selector(page, "#revealed")
    assert json.loads(page.inner_text("#arguments")) == proposed
    words = page.inner_text("#proposal-words")
    assert words.startswith(MODEL_SAYS), words
    assert json.dumps(f"The limits allow it. {XSS}") in words, words
    no_markup_ran(page)
    screenshot(page, "console-run-revealed.png")

    page.click("#do-approve")
    await_selector(page, "#said")
    assert "approve sent for request" in page.inner_text("#said")
    assert page.locator("#revealed").count() == 0, "a revealed value outlived its response"
    runs.wait_state(name, "completed", timeout=Within.RUN)
    assert list(refsystem.counts().values()) == [1], refsystem.counts()
    # The page follows its watch: it shows the run completed without a reload.
    expect(page.locator("#state")).to_have_text(re.compile(r"^completed"), timeout=60_000)
    screenshot(page, "console-run.png")

    decision = runs.get(name)["spec"]["approvals"][request["requestId"]]
    assert decision["approver"]["username"] == "approver", decision
    patches = [
        e
        for e in read_audit(plane.audit_log_path, offset=offset, mentions=ns)
        if (e.verb, e.resource, e.subresource, e.name) == ("patch", "agentruns", "", name)
    ]
    assert {e.user for e in patches} == {"approver"}, [(e.user, e.code) for e in patches]
    assert any(e.code == 200 for e in patches)
    assert not op.logged("Traceback")
    said = "\n".join(console.log)
    for secret in ("The limits allow it", proposed["orderId"]):  # the model's words, the sealed arguments
        assert secret not in said, f"the console logged {secret!r}"


@pytest.mark.browser
@pytest.mark.local_plane("users", "webhook")
def test_the_console_shows_only_what_the_api_server_allows_and_refuses_what_it_refuses(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    kubeconfigs: dict[str, Path],  # noqa: F811
    browser: Any,
    consoles: Callable[[str], Console],
) -> None:
    policy(runs)
    op = start_operator("console-refusals", 2, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()
    ns, url = runs.namespace, f"/runs/{runs.namespace}/invoice"
    user_api(kubeconfigs["editor"]).create_namespaced_custom_object(
        GROUP, VERSION, ns, "agentruns", invoice(refsystem.url)
    )
    runs.wait_state("invoice", "waiting_input")

    # The editor answers in the console, with markup in the answer: the question is in their inbox.
    editor = signed_in(browser, consoles("editor"))
    assert editor.locator(f"#item-{ns}-invoice").inner_text().split("\t")[1] == "question"
    editor.goto(consoles("editor").base + url)
    assert editor.locator("#do-approve").count() == 0, "the editor holds no approve verb"
    # Who may answer is shown the question it waits on, and nothing else (the webhook's scope).
    editor.click("#do-reveal")
    await_selector(editor, "#revealed")
    assert editor.inner_text("#question") == QUESTION
    assert "withheld" in editor.inner_text("#revealed")
    assert MEMO not in editor.inner_text("main")
    # The form is pinned to the question it shows: one pinned to another question is refused.
    key = runs.get("invoice")["status"]["waitingFor"].removeprefix("input:")
    assert editor.locator("input[name=question]").get_attribute("value") == key
    csrf = editor.locator("input[name=csrf]").first.get_attribute("value")
    stale = post(editor, f"{url}/do/answer", {"csrf": csrf, "text": "late", "question": key + ".0"})
    assert stale["status"] == 403, stale
    assert "does not wait on question" in stale["text"], stale
    assert not runs.get("invoice")["spec"].get("answers"), "nothing written"
    editor.fill("#answer-text", XSS)
    editor.click("#do-answer")
    await_selector(editor, "#said")
    run = runs.wait_state("invoice", "waiting_approval")
    request = run["status"]["approvalRequest"]

    # A crafted approve (valid CSRF token) is refused by the operator's webhook, as the API server's answer.
    editor.goto(consoles("editor").base + url)
    assert editor.locator("#do-approve").count() == 0
    csrf = editor.locator("input[name=csrf]").first.get_attribute("value")
    fields = {"csrf": csrf, "request": request["requestId"], "digest": request["digest"]}
    crafted = post(editor, f"{url}/do/approve", fields)
    assert crafted["status"] == 403, crafted
    assert "may not approve" in crafted["text"] or "forbidden" in crafted["text"].lower(), crafted["text"]

    # The viewer sees no control at all, and nothing waits for them; a crafted cancel is refused by RBAC.
    viewer = signed_in(browser, consoles("viewer"))
    assert "nothing waits for you" in viewer.inner_text("main")
    assert viewer.locator("#inbox").count() == 0
    viewer.goto(consoles("viewer").base + url)
    assert viewer.locator("main form button").count() == 0, viewer.inner_text("main")
    csrf = viewer.locator("input[name=csrf]").first.get_attribute("value")
    crafted = post(viewer, f"{url}/do/cancel", {"csrf": csrf, "reason": "crafted"})
    assert crafted["status"] == 403, crafted
    assert "forbidden" in crafted["text"].lower(), crafted["text"]
    # Without the CSRF token: refused by the console, before the API server.
    forged = post(viewer, f"{url}/do/cancel", {"reason": "forged"})
    assert forged["status"] == 403, forged
    assert "CSRF" in forged["text"], forged
    stored = runs.get("invoice")
    assert not stored["spec"].get("cancellations"), stored["spec"]
    assert not stored["spec"].get("approvals"), stored["spec"]

    # Another namespace through a crafted URL: the API server's refusal, shown.
    answer = viewer.goto(consoles("viewer").base + "/runs/kube-system/anything")
    assert answer is not None
    assert answer.status == 403
    assert "forbidden" in viewer.inner_text("#refused").lower()
    answer = viewer.goto(consoles("viewer").base + "/runs?namespace=kube-system")
    assert answer is not None
    assert answer.status == 403
    assert "may not list" in viewer.inner_text("#refused")

    # The approver reveals: the answer is text.
    approver = signed_in(browser, consoles("approver"))
    approver.goto(consoles("approver").base + url)
    approver.click("#do-reveal")
    await_selector(approver, "#revealed")
    assert XSS in approver.inner_text("#revealed"), approver.inner_text("#revealed")
    no_markup_ran(approver)
    # ... and approves from the inbox, pinned to the row's digest: one application.
    approver.goto(consoles("approver").base + "/inbox")
    row = approver.locator(f"#item-{ns}-invoice")
    assert row.locator(".digest").inner_text() == request["digest"]
    row.locator(".do-approve").click()
    await_selector(approver, "#said")
    runs.wait_state("invoice", "completed", timeout=Within.RUN)
    assert list(refsystem.counts().values()) == [1], refsystem.counts()

    # A spent link, a wrong one, no session: the sign-in page, no stack trace.
    stranger = browser.new_context().new_page()
    for target in (consoles("approver").sign_in_url, consoles("approver").base + "/sign-in?token=wrong"):
        answer = stranger.goto(target)
        assert answer is not None
        assert answer.status == 401
        assert "wrong or was used already" in stranger.inner_text("#said")
    answer = stranger.goto(consoles("approver").base + url)
    assert answer is not None
    assert answer.status == 401
    assert "Traceback" not in stranger.content()
    assert not op.logged("Traceback")


@pytest.mark.local_plane("users")
def test_in_cluster_the_console_acts_with_each_requests_bearer_token(
    kube: KubeEnv,
    plane: LocalControlPlane,
    runs: Runs,
    kubeconfigs: dict[str, Path],  # noqa: F811 (the chart's roles, as ClusterRoles here)
    tmp_path: Path,
) -> None:
    """``python -m durable_agents.console --in-cluster``: no credentials of its own; an auth proxy's
    Authorization header, X-Forwarded-Access-Token, or a pasted token is who acts."""
    ns = runs.namespace
    client.CoreV1Api(kube.api).create_namespaced_service_account(ns, {"metadata": {"name": "alice"}})
    bind(
        kube, ns, service_account("alice", ns), f"{ns}-reveal-viewer", cluster_role=True, name="alice-viewer"
    )
    token = (
        client.CoreV1Api(kube.api)
        .create_namespaced_service_account_token("alice", ns, {"spec": {"expirationSeconds": 600}})
        .status.token
    )
    alice = f"system:serviceaccount:{ns}:alice"
    runs.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        "agentruns",
        {**invoice("http://127.0.0.1:1"), "spec": {**invoice("")["spec"], "objective": XSS}},
    )
    log = tmp_path / "console.log"
    offset = audit_offset(plane.audit_log_path)
    process, base = in_cluster_console(plane, plane.server_url, ns, log)
    try:
        for headers in ({"Authorization": f"Bearer {token}"}, {"X-Forwarded-Access-Token": token}):
            page = requests.get(f"{base}/runs", headers=headers, timeout=30)
            assert page.status_code == 200, page.text
            assert f'acting as <strong id="user">{alice}</strong>' in page.text
            assert "&lt;script&gt;" in page.text
            assert "<script>window" not in page.text
            shown = requests.get(f"{base}/runs/{ns}/invoice", headers=headers, timeout=30)
            assert shown.status_code == 200, shown.text
            assert 'id="do-' not in shown.text, "a viewer is offered an action"
        for headers in ({}, {"Authorization": "Bearer not-a-token"}):
            refused = requests.get(f"{base}/runs", headers=headers, timeout=30)
            assert refused.status_code == 401, refused.text
            assert 'name="token"' in refused.text, "no sign-in form"
            assert "Traceback" not in refused.text
        # A pasted token: checked with the API server, then held for the session.
        session = requests.Session()
        session.get(f"{base}/sign-in", timeout=30)
        signed = session.post(
            f"{base}/sign-in", data={"token": token, "csrf": session.cookies[CSRF_COOKIE]}, timeout=30
        )
        assert signed.status_code == 200, signed.text
        assert signed.url.endswith("/inbox")
        assert f">{alice}<" in session.get(f"{base}/runs", timeout=30).text
        assert (
            session.post(
                f"{base}/sign-in", data={"token": "wrong", "csrf": session.cookies[CSRF_COOKIE]}, timeout=30
            ).status_code
            == 401
        )
    finally:
        process.terminate()
        process.wait(timeout=20)
    said = log.read_text()
    assert token not in said, "the token was logged"
    assert "Traceback" not in said, said
    users = {
        e.user
        for e in read_audit(plane.audit_log_path, offset=offset, mentions=ns)
        if e.resource == "agentruns"
    }
    assert users == {alice}, f"the console's reads were made as {users}"


def in_cluster_console(
    plane: LocalControlPlane, api_server: str, ns: str, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m durable_agents.console --in-cluster`` on loopback, serving; (process, its URL)."""
    port = free_port()
    argv = [sys.executable, "-m", "durable_agents.console", "--in-cluster", "--api-server", api_server]
    argv += ["--ca-file", str(plane.pki_paths.ca_cert), "--port", str(port), "--insecure-cookies", "-n", ns]
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    eventually(lambda: _answers(f"{base}/sign-in"), Within.TAKEOVER, "the in-cluster console to serve")
    return process, base


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


@pytest.mark.local_plane("users")
def test_a_page_says_when_the_api_server_is_gone_and_when_it_is_back_and_when_its_run_is_deleted(
    kube: KubeEnv, plane: LocalControlPlane, runs: Runs, tmp_path: Path
) -> None:
    """The event stream of a run's page (what console.js shows): the API server behind a proxy that
    is cut and restored (``down``, then ``up``), then the run deleted (``deleted``)."""
    ns = runs.namespace
    client.CoreV1Api(kube.api).create_namespaced_service_account(ns, {"metadata": {"name": "bob"}})
    grant(kube, ns, service_account("bob", ns), rule(GROUP, "agentruns", "get", "list", "watch"), name="bob")
    token = (
        client.CoreV1Api(kube.api)
        .create_namespaced_service_account_token("bob", ns, {"spec": {"expirationSeconds": 600}})
        .status.token
    )
    runs.custom.create_namespaced_custom_object(
        GROUP, VERSION, ns, "agentruns", invoice("http://127.0.0.1:1")
    )
    with CutProxy(plane.ports.apiserver) as proxy:
        process, base = in_cluster_console(
            plane, f"https://127.0.0.1:{proxy.port}", ns, tmp_path / "console.log"
        )
        events: queue.Queue[str] = queue.Queue()
        version = runs.get("invoice")["metadata"]["resourceVersion"]  # as the page passes it
        stream = requests.get(
            f"{base}/events/runs/{ns}/invoice?version={version}",
            headers={"Authorization": f"Bearer {token}"},
            stream=True,
            timeout=(10, 120),
        )
        assert stream.status_code == 200, stream.text

        def read() -> None:
            with contextlib.suppress(Exception):  # the stream closed under it at the end
                for line in stream.iter_lines(decode_unicode=True):
                    if line.startswith("event: "):
                        events.put(line.removeprefix("event: "))

        def next_event(wanted: str, why: str) -> None:
            seen = []
            try:
                while (event := events.get(timeout=60)) != wanted:
                    seen.append(event)
            except queue.Empty:
                raise AssertionError(f"no {wanted!r} event ({why}) within 60s; saw {seen}") from None

        threading.Thread(target=read, daemon=True).start()
        try:
            touched = {"metadata": {"labels": {"touched": "1"}}}  # any change: the page fetches itself again
            runs.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", "invoice", touched)
            next_event("change", "the run changed")
            proxy.cut()
            next_event("down", "the API server went away")
            proxy.restore()
            next_event("up", "the API server came back")
            runs.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", "invoice")
            next_event("deleted", "the run was deleted")
        finally:
            stream.close()
            process.terminate()
            process.wait(timeout=20)


@pytest.mark.local_plane("users", "webhook")
def test_an_approver_says_in_the_console_that_an_unknown_action_happened(
    plane: LocalControlPlane,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],  # noqa: F811 (a fixture: alice approves, bob edits)
    refsystem: ReferenceSystemThread,
) -> None:
    """The ledger on a run's page: an action whose answer was lost is settled by who may approve
    (``kubectl agentrun reconcile --applied``, the plugin's function), as themselves; the editor is
    offered nothing. Plain HTTP with the session a one-time link bought (no browser)."""
    reconcile_policy(runs)
    webhook_operator()
    refsystem.inject("drop_after_apply", times=1)  # applied, and the answer is lost
    run = runs.create(payment(refsystem.url))
    action, _ = stuck(runs, run)
    page_url = f"/runs/{runs.namespace}/{run}"
    sessions = {}
    for who, group_name in (("alice", "approvers"), ("bob", "editors")):
        console = start_console(plane.write_user_kubeconfig(who, [group_name]), runs.namespace)
        session = requests.Session()
        assert session.get(console.sign_in_url, timeout=30).url.endswith("/inbox")
        sessions[who] = (console, session)
    try:
        bob_console, bob = sessions["bob"]
        assert "It happened" not in bob.get(bob_console.base + page_url, timeout=30).text
        alice_console, alice = sessions["alice"]
        page = alice.get(alice_console.base + page_url, timeout=30).text
        assert f'name="record" value="{action}"' in page, page
        form = {
            "csrf": alice.cookies[CSRF_COOKIE],
            "record": action,
            "applied": "true",
            "reason": "in the statement",
        }
        said = alice.post(f"{alice_console.base}{page_url}/do/settle", data=form, timeout=60)
        assert said.status_code == 200, said.text
        assert f"action {action} attempt 1 reconciled as applied" in said.text
    finally:
        for console, _ in sessions.values():
            console.stop()
    assert runs.get(run)["spec"]["reconciliations"][action]["reconciler"]["username"] == "alice"
    runs.wait_state(run, "completed", timeout=Within.RUN)
    assert refsystem.counts() == {key_of(runs, run): 1}, "reconciled as applied: never sent again"
