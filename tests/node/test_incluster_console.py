"""The console installed by the chart (``console.enabled=true``) on the node test bed, driven by a
real browser (Debian's headless chromium through Playwright) from the host, through the console's
Service (its ClusterIP: the machine routes the node's Service range to it, kube-proxy carries it).

The console's ServiceAccount holds no rights on runs (SubjectAccessReviews as that account, with
its groups: get, list, watch, patch and approve on agentruns all refused) and its Pod has no token.
An approver signs in with a bearer token (a ServiceAccount token from the TokenRequest API, bound
to the chart's approver ClusterRole in the run's namespace), sent as ``Authorization: Bearer`` on
every request as oauth2-proxy's ``--pass-authorization-header`` does: the inbox lists the run's
request pinned to its digest, the run's page reveals the arguments equal to the run's proposed
call, the approval is sent pinned; the change is applied once; the API server's audit log names
the approver's ServiceAccount for the approval, and the console's own account made no request."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests.node.test_incluster import (  # noqa: F401 (fixtures)
    OPERATOR_NS,
    RELEASE,
    REPO,
    applied_once,
    env,
    install,
    kubectl,
    operator_image,
    patch_spec,
    start_rollout,
)

from durable_agents_testkit.audit import audit_offset, read_audit
from durable_agents_testkit.browser import chromium
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.demo import prepare_namespace
from durable_agents_testkit.eventually import eventually
from durable_agents_testkit.localcluster.node import NodeTestBed
from durable_agents_testkit.operator_rights import opt_in
from durable_agents_testkit.runs import Runs

CONSOLE = f"{RELEASE}-durable-agents-console"
CONSOLE_SA = f"system:serviceaccount:{OPERATOR_NS}:{CONSOLE}"
APPROVER_ROLE = f"{RELEASE}-durable-agents-approver"  # the chart's ClusterRole (files/user-roles.yaml)
RUN_VERBS = ("get", "list", "watch", "patch", "approve")


@pytest.fixture(scope="module")
def installed_with_console(node_bed: NodeTestBed, env: KubeEnv, operator_image: str) -> Iterator[None]:  # noqa: F811
    """The chart with the console (plain HTTP from the host to its Service: cookies without Secure)."""
    install(node_bed, "--set", "console.enabled=true", "--set", "console.insecureCookies=true")
    yield
    helm = [str(node_bed.bin_dir / "helm"), "--kubeconfig", str(node_bed.kubeconfig_path)]
    subprocess.run(
        [*helm, "uninstall", RELEASE, "--namespace", OPERATOR_NS, "--wait"],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture
def console_ns(env: KubeEnv, installed_with_console: None) -> Iterator[str]:  # noqa: F811
    ns = f"console-{uuid.uuid4().hex[:6]}"
    prepare_namespace(env, ns)
    opt_in(env, ns, RELEASE, OPERATOR_NS)
    kubectl(env, "-n", ns, "apply", "-f", str(REPO / "config/samples/agentpolicy-default.yaml"))
    Runs(env, ns).await_webhook()
    yield ns
    client.CoreV1Api(env.api).delete_namespace(ns)


def account_may(kube: KubeEnv, account: str, verb: str, namespace: str | None) -> bool:
    """May the ServiceAccount ``account`` (``system:serviceaccount:NS:NAME``, with the groups the
    API server gives it) ``verb`` agentruns in ``namespace`` (None: cluster-wide)?"""
    home = account.split(":")[2]
    review = {
        "spec": {
            "user": account,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{home}", "system:authenticated"],
            "resourceAttributes": {
                "group": "durable-agents.io",
                "resource": "agentruns",
                "verb": verb,
                **({"namespace": namespace} if namespace else {}),
            },
        }
    }
    answer = client.AuthorizationV1Api(kube.api).create_subject_access_review(review)
    return bool(answer.status.allowed)


def approver_token(kube: KubeEnv, ns: str) -> tuple[str, str]:
    """A ServiceAccount ``approver`` bound to the chart's approver role here: (its user, a token)."""
    core = client.CoreV1Api(kube.api)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "approver"}})
    client.RbacAuthorizationV1Api(kube.api).create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "approver"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": APPROVER_ROLE,
            },
            "subjects": [{"kind": "ServiceAccount", "name": "approver", "namespace": ns}],
        },
    )
    requested = core.create_namespaced_service_account_token(
        "approver", ns, {"spec": {"expirationSeconds": 600}}
    )
    return f"system:serviceaccount:{ns}:approver", str(requested.status.token)


def await_selector(page: Any, selector: str) -> None:
    try:
        page.wait_for_selector(selector, timeout=60_000)
    except Exception as err:
        raise AssertionError(
            f"{selector} never showed on {page.url}: {page.inner_text('body')[:3000]}"
        ) from err


def test_the_console_holds_no_rights_and_no_token_in_cluster(
    env: KubeEnv,  # noqa: F811 (the fixture)
    console_ns: str,
) -> None:
    for namespace in (console_ns, None):
        for verb in RUN_VERBS:
            assert not account_may(env, CONSOLE_SA, verb, namespace), (
                f"the console's account may {verb} agentruns ({namespace})"
            )
    pods = (
        client.CoreV1Api(env.api)
        .list_namespaced_pod(OPERATOR_NS, label_selector="app.kubernetes.io/component=console")
        .items
    )
    assert len(pods) == 1, [p.metadata.name for p in pods]
    (pod,) = pods
    assert pod.spec.service_account_name == CONSOLE
    assert pod.spec.automount_service_account_token is False
    projected = [v for v in pod.spec.volumes or () if v.projected is not None]
    assert not projected, f"a token volume is mounted: {projected}"
    mounts = [m.mount_path for m in pod.spec.containers[0].volume_mounts or ()]
    assert "/var/run/secrets/kubernetes.io/serviceaccount" not in mounts, mounts
    bindings = client.RbacAuthorizationV1Api(env.api)
    subjects = [
        (b.metadata.name, s.name)
        for b in [
            *bindings.list_cluster_role_binding().items,
            *bindings.list_role_binding_for_all_namespaces().items,
        ]
        for s in b.subjects or ()
        if s.kind == "ServiceAccount" and s.name == CONSOLE
    ]
    assert not subjects, f"the console's account is bound: {subjects}"


def console_url(kube: KubeEnv) -> str:
    service = client.CoreV1Api(kube.api).read_namespaced_service(CONSOLE, OPERATOR_NS)
    return f"http://{service.spec.cluster_ip}"


@pytest.mark.browser
def test_an_approver_approves_through_the_in_cluster_console_with_a_bearer_token(
    node_bed: NodeTestBed,
    env: KubeEnv,  # noqa: F811 (the fixture)
    console_ns: str,
) -> None:
    ns = console_ns
    runs, name = start_rollout(env, ns)
    patch_spec(env, ns, name, {"events": {"maintenance-window-open": "opened by the test"}})
    request = runs.wait_state(name, "waiting_approval", timeout=60)["status"]["approvalRequest"]
    sample = yaml.safe_load((REPO / "config/samples/agentrun-rollout.yaml").read_text())
    proposed = next(s for s in sample["spec"]["steps"] if "effect" in s)["effect"]["arguments"]
    user, token = approver_token(env, ns)
    # The same review that refuses the console's account grants the approver's (not refusing all).
    assert all(account_may(env, user, verb, ns) for verb in RUN_VERBS), "the approver's binding"
    assert node_bed.plane is not None
    audit = node_bed.plane.audit_log_path
    offset = audit_offset(audit)
    base = console_url(env)

    with chromium() as browser:
        # As an auth proxy in front of it passes the signed-in user's token (oauth2-proxy's
        # --pass-authorization-header): on every request, the page's and the forms'.
        context = browser.new_context(extra_http_headers={"Authorization": f"Bearer {token}"})
        page = context.new_page()
        page.on("dialog", lambda dialog: pytest.fail(f"a dialog opened: {dialog.message}"))
        shown = eventually(
            lambda: _reached(page, f"{base}/inbox?namespace={ns}"), 60, f"the console's Service at {base}"
        )
        assert shown.ok, shown.text()
        assert page.inner_text("#user") == user
        item = page.locator(f"#item-{ns}-{name}")
        assert item.locator(".digest").inner_text() == request["digest"]
        assert item.locator(".do-approve").count() == 1
        item.locator(f"a[href='/runs/{ns}/{name}']").first.click()
        await_selector(page, "#approval")
        assert page.inner_text("#digest") == request["digest"]
        assert page.inner_text("#request-id") == request["requestId"]
        assert page.locator("#do-approve").count() == 1
        assert page.locator("#do-cancel").count() == 0, "the approver holds no cancel verb"
        page.click("#do-reveal")
        await_selector(page, "#revealed")
        assert json.loads(page.inner_text("#arguments")) == proposed
        page.click("#do-approve")
        await_selector(page, "#said")
        assert "approve sent for request" in page.inner_text("#said"), page.inner_text("#said")
        context.close()

    runs.wait_state(name, "completed", timeout=90)
    applied_once(env, ns)
    decision = runs.get(name)["spec"]["approvals"][request["requestId"]]
    assert decision["approver"]["username"] == user, decision  # stamped by the in-cluster webhook
    entries = list(read_audit(audit, offset=offset))
    patches = [
        e
        for e in entries
        if (e.verb, e.resource, e.subresource, e.name) == ("patch", "agentruns", "", name)
        and e.namespace == ns
    ]
    assert {e.user for e in patches} == {user}, [(e.user, e.code) for e in patches]
    assert any(e.code == 200 for e in patches), [(e.user, e.code) for e in patches]
    by_console = [(e.verb, e.resource) for e in entries if e.user == CONSOLE_SA]
    assert not by_console, f"the console's own account made requests: {by_console}"
    console_log = kubectl(env, "-n", OPERATOR_NS, "logs", f"deployment/{CONSOLE}")
    assert token not in console_log, "the console logged the token"
    assert "Traceback" not in console_log, console_log


def _reached(page: Any, url: str) -> Any:
    """The page's answer, or None while the Service does not answer yet."""
    try:
        return page.goto(url, timeout=10_000)
    except Exception:  # connection refused or reset while kube-proxy catches up
        return None
