"""An approver sees what they approve (``kubectl agentrun status --reveal``), nobody else does,
and nothing is stored.

The operator runs with its admission webhook; the people hold the chart's roles (viewer, editor,
approver), each a real user with a client certificate. The reveal is a server-side dry-run patch:
the webhook checks the approver verb and answers with the run's sealed values encrypted to a key
the plugin made for that one request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.labels import REVEAL_ANNOTATION, REVEALED_ANNOTATION
from durable_agents.core.disclosure import new_reader_key, open_as_reader
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import bind
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

REPO = Path(__file__).resolve().parents[1]
USER_ROLES = REPO / "charts/durable-agents/files/user-roles.yaml"
ROLES = ("viewer", "editor", "approver")
QUESTION = "Pay invoice INV-7731 of ACME Widgets GmbH? (reveal-question-5f2a)"
MEMO = "reveal-memo-9c41"
IBAN = "DE89370400440532013000"


def allows(kube: KubeEnv, namespace: str, who: str, verb: str) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": who,
            "groups": ["system:authenticated"],
            "resourceAttributes": {
                "namespace": namespace,
                "verb": verb,
                "group": GROUP,
                "resource": "agentruns",
            },
        },
    }
    return bool(client.AuthorizationV1Api(kube.api).create_subject_access_review(review).status.allowed)


@pytest.fixture
def kubeconfigs(kube: KubeEnv, plane: LocalControlPlane, namespace: str) -> Iterator[dict[str, Path]]:
    """Role -> the kubeconfig of a user holding exactly the chart's role here (one RoleBinding).
    The ClusterRoles carry the chart's rules without its aggregation labels (the built-in roles
    of other tests stay as they are), and are deleted afterwards."""
    rules = yaml.safe_load(USER_ROLES.read_text())["roles"]
    rbac = client.RbacAuthorizationV1Api(kube.api)
    names = {role: f"{namespace}-reveal-{role}" for role in (*ROLES, "policy-user")}
    try:
        for role, name in names.items():
            rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules[role]["rules"]})
            # The editor's run names the payments policy: the editor also holds policy-user.
            bind(
                kube,
                namespace,
                "editor" if role == "policy-user" else role,
                name,
                cluster_role=True,
                name=role,
            )
        wanted = (("viewer", "get"), ("editor", "patch"), ("approver", "approve"))
        eventually(
            lambda: all(allows(kube, namespace, who, verb) for who, verb in wanted),
            Within.COMMIT,
            "the roles' grants to be in effect",
        )
        yield {role: Path(plane.write_user_kubeconfig(role, [])) for role in ROLES}
    finally:
        for name in names.values():
            try:
                rbac.delete_cluster_role(name)
            except client.ApiException as err:
                if err.status != 404:
                    raise


def policy(runs: Runs) -> None:
    spec = {
        "version": "v1",
        "tiers": {"http.post": "consequential"},
        "approvalRequiredTiers": ["consequential"],
        "approvers": {"verb": "approve", "resource": "agentruns"},
        "approvalExpiry": "1h",
    }
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentPolicy", "metadata": {"name": "payments"}}
    runs.custom.create_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", {**body, "spec": spec}
    )


def invoice(url: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": "invoice"},
        "spec": {
            "taskType": "payment",
            "objective": "pay the invoice",
            "policyRef": {"name": "payments"},
            "serviceAccountName": "default",
            "steps": [
                {"name": "confirm", "ask": {"question": QUESTION, "expiresIn": "1h"}},
                {
                    "name": "pay",
                    "effect": {
                        "effect": "http.post",
                        "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
                        "arguments": {"amount": 7731, "iban": IBAN, "memo": MEMO},
                    },
                },
                {"name": "done", "complete": {"result": "paid"}},
            ],
        },
    }


def plugin(kubeconfig: Path, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl agentrun ARGS`` as the user of ``kubeconfig`` (its own process, as kubectl runs it)."""
    argv = [sys.executable, "-m", "durable_agents.kubectl.main", *args, "-n", namespace]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def user_api(kubeconfig: Path) -> client.CustomObjectsApi:
    from kubernetes import config

    return client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))


def assert_nothing_in_clear(stored: dict[str, Any]) -> None:
    text = json.dumps(stored)
    for secret in (QUESTION, MEMO, IBAN):
        assert secret not in text, f"{secret!r} is stored in clear"
    annotations = stored["metadata"].get("annotations") or {}
    assert REVEAL_ANNOTATION not in annotations
    assert REVEALED_ANNOTATION not in annotations


@pytest.mark.local_plane("users", "webhook")
def test_an_approver_sees_what_they_approve_and_nobody_else_does(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    kubeconfigs: dict[str, Path],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    op = start_operator("reveal", 2, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()  # the editor's run is written raw: the webhook stamps and seals it
    ns = runs.namespace
    user_api(kubeconfigs["editor"]).create_namespaced_custom_object(
        GROUP, VERSION, ns, "agentruns", invoice(refsystem.url)
    )
    runs.wait_state("invoice", "waiting_input")
    assert_nothing_in_clear(runs.get("invoice"))

    # Without --reveal, the question is sealed for everyone.
    shown = plugin(kubeconfigs["approver"], ns, "status", "invoice")
    assert shown.returncode == 0, shown.stderr
    assert "Question:    (sealed)" in shown.stdout
    assert QUESTION not in shown.stdout

    # The approver reveals it.
    revealed = plugin(kubeconfigs["approver"], ns, "status", "invoice", "--reveal")
    assert revealed.returncode == 0, revealed.stderr
    assert f"Question:    {QUESTION}" in revealed.stdout
    assert "steps/pay/arguments: " in revealed.stdout
    assert MEMO in revealed.stdout

    # A viewer may not even send the dry-run patch. An editor may, and holds "answer" but not
    # "approve": it sees the question it may answer, never the effect's arguments
    # (e2e/test_responder.py checks that scope as the responder role).
    viewer = plugin(kubeconfigs["viewer"], ns, "status", "invoice", "--reveal")
    assert viewer.returncode != 0
    assert "refused to reveal" in viewer.stderr
    assert "forbidden" in viewer.stderr.lower()
    assert QUESTION not in viewer.stdout + viewer.stderr
    editor = plugin(kubeconfigs["editor"], ns, "status", "invoice", "--reveal")
    assert editor.returncode == 0, editor.stderr
    assert f"Question:    {QUESTION}" in editor.stdout
    assert "withheld: spec value steps/pay/arguments (verb 'approve' on agentruns shows it)" in editor.stdout
    for refused in (viewer, editor):
        assert MEMO not in refused.stdout + refused.stderr
        assert IBAN not in refused.stdout + refused.stderr

    # A reveal request that is not a dry run is refused, whoever sends it.
    _, public = new_reader_key(entropy=os.urandom)
    request = {"metadata": {"annotations": {REVEAL_ANNOTATION: public}}}
    approver = user_api(kubeconfigs["approver"])
    with pytest.raises(client.ApiException) as err:
        approver.patch_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", "invoice", request)
    assert err.value.status == 400, err.value.body
    assert "kubectl agentrun status NAME --reveal" in str(err.value.body)
    # What the API server answers (and an audit log of the response records) is ciphertext.
    private, public = new_reader_key(entropy=os.urandom)
    request = {"metadata": {"annotations": {REVEAL_ANNOTATION: public}}}
    answer = approver.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "agentruns", "invoice", request, dry_run="All"
    )
    sealed = answer["metadata"]["annotations"][REVEALED_ANNOTATION]
    assert REVEAL_ANNOTATION not in answer["metadata"]["annotations"]
    assert QUESTION not in sealed
    document = open_as_reader(private, sealed, f"{ns}/invoice")
    assert document["pendingInput"] == {"requestId": "confirm", "question": QUESTION}
    assert document["scope"] == "all"
    assert document["values"]["steps/pay/arguments"]["memo"] == MEMO
    # A revealed annotation written by hand is never stored either.
    runs.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        "agentruns",
        "invoice",
        {"metadata": {"annotations": {REVEALED_ANNOTATION: sealed}}},
    )
    assert_nothing_in_clear(runs.get("invoice"))

    # Answered, the run asks for approval: the approver sees the arguments they approve.
    user_api(kubeconfigs["editor"]).patch_namespaced_custom_object(
        GROUP, VERSION, ns, "agentruns", "invoice", {"spec": {"answers": {"confirm": "yes, pay it"}}}
    )
    runs.wait_state("invoice", "waiting_approval")
    assert_nothing_in_clear(runs.get("invoice"))
    shown = plugin(kubeconfigs["viewer"], ns, "status", "invoice")
    assert "  arguments:   (sealed)" in shown.stdout, shown.stdout + shown.stderr
    revealed = plugin(kubeconfigs["approver"], ns, "status", "invoice", "--reveal")
    assert revealed.returncode == 0, revealed.stderr
    arguments = next(line for line in revealed.stdout.splitlines() if line.startswith("  arguments:"))
    assert MEMO in arguments
    assert IBAN in arguments
    assert "answers/confirm: yes, pay it" in revealed.stdout

    # Approved and done: the ledger's arguments and outcome are revealed too, and stored sealed.
    request = runs.get("invoice")["status"]["approvalRequest"]  # the request the approver reviewed
    pinned = ("--request", request["requestId"], "--digest", request["digest"])
    approved = plugin(kubeconfigs["approver"], ns, "approve", "invoice", *pinned)
    assert approved.returncode == 0, approved.stderr
    runs.wait_state("invoice", "completed", timeout=60)
    assert list(refsystem.counts().values()) == [1]
    revealed = plugin(kubeconfigs["approver"], ns, "status", "invoice", "--reveal")
    assert revealed.returncode == 0, revealed.stderr
    lines = revealed.stdout.splitlines()
    action = next(i for i, line in enumerate(lines) if line.startswith("  action "))
    assert "http.post" in lines[action]
    assert MEMO in lines[action + 1]
    assert lines[action + 2].startswith("    outcome:")
    assert "(sealed)" not in lines[action + 2]
    assert "not revealed" not in revealed.stdout
    records = runs.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "actionrecords")["items"]
    assert records
    assert all(MEMO not in json.dumps(r) for r in records)
    assert_nothing_in_clear(runs.get("invoice"))
