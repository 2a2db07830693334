"""The responder role reads and answers the question a run waits on, and nothing else.

A run pays an invoice (an effect whose arguments are sealed and need approval), then asks a
question. The people are real users with client certificates holding the chart's roles, each
with ONE RoleBinding: editor (who starts the run, with policy-user), approver, and responder. The
responder's ``status --reveal`` shows the question and names what it withheld (the effect's
arguments, the action's arguments and outcome) and the verb that shows it, never their values; a
run that waits on no question reveals nothing to them, with a message that says so; the responder
cannot approve or cancel, and answers the question, which the run acts on. The same for a
model's question (``askHuman``): shown as the model's words, its turns withheld, and the answer
reaches the model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.test_agent import agent_namespace, agent_spec  # noqa: F401 (a fixture)
from e2e.test_reveal import IBAN, MEMO, USER_ROLES, allows, assert_nothing_in_clear, plugin, policy, user_api
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.labels import REVEAL_ANNOTATION, REVEALED_ANNOTATION
from durable_agents.core.disclosure import new_reader_key, open_as_reader
from durable_agents_testkit.agent_sample import API_KEY, sample_of, script
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import bind
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

PEOPLE = ("editor", "approver", "responder")
QUESTION = "Send the receipt of INV-7731 to ACME's accounts team? (responder-question-3e81)"
ANSWER = "yes, to accounts@acme.example (responder-answer-71d0)"


@pytest.fixture
def kubeconfigs(kube: KubeEnv, plane: LocalControlPlane, namespace: str) -> Iterator[dict[str, Path]]:
    """Person -> the kubeconfig of a user holding exactly the chart's role of that name here (the
    editor also holds policy-user: its run names the payments policy). The ClusterRoles carry the
    chart's rules and are deleted afterwards."""
    rules = yaml.safe_load(USER_ROLES.read_text())["roles"]
    rbac = client.RbacAuthorizationV1Api(kube.api)
    names = {role: f"{namespace}-responder-{role}" for role in (*PEOPLE, "policy-user")}
    try:
        for role, name in names.items():
            rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules[role]["rules"]})
            who = "editor" if role == "policy-user" else role
            bind(kube, namespace, who, name, cluster_role=True, name=role)
        wanted = (("editor", "create"), ("approver", "approve"), ("responder", "answer"))
        eventually(
            lambda: all(allows(kube, namespace, who, verb) for who, verb in wanted),
            Within.COMMIT,
            "the roles' grants to be in effect",
        )
        yield {role: Path(plane.write_user_kubeconfig(role, [])) for role in PEOPLE}
    finally:
        for name in names.values():
            try:
                rbac.delete_cluster_role(name)
            except client.ApiException as err:
                if err.status != 404:
                    raise


def pay_then_ask(url: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": "invoice"},
        "spec": {
            "taskType": "payment",
            "objective": "pay the invoice, then ask where its receipt goes",
            "policyRef": {"name": "payments"},
            "serviceAccountName": "default",
            "steps": [
                {
                    "name": "pay",
                    "effect": {
                        "effect": "http.post",
                        "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
                        "arguments": {"amount": 7731, "iban": IBAN, "memo": MEMO},
                    },
                },
                {"name": "receipt", "ask": {"question": QUESTION, "expiresIn": "1h"}},
                {"name": "done", "complete": {"result": "paid"}},
            ],
        },
    }


def revealed_as(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    """The reveal document the webhook answers this user with (a dry run, opened here)."""
    private, public = new_reader_key(entropy=os.urandom)
    request = {"metadata": {"annotations": {REVEAL_ANNOTATION: public}}}
    answer = user_api(kubeconfig).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentruns", name, request, dry_run="All"
    )
    sealed = answer["metadata"]["annotations"][REVEALED_ANNOTATION]
    document: dict[str, Any] = open_as_reader(private, sealed, f"{namespace}/{name}")
    return document


@pytest.mark.local_plane("users", "webhook")
def test_a_responder_reads_and_answers_the_question_and_nothing_else(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    kubeconfigs: dict[str, Path],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    op = start_operator("responder", 2, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()
    ns, responder = runs.namespace, kubeconfigs["responder"]
    user_api(kubeconfigs["editor"]).create_namespaced_custom_object(
        GROUP, VERSION, ns, "agentruns", pay_then_ask(refsystem.url)
    )
    runs.wait_state("invoice", "waiting_approval")

    # Waiting on an approval, not a question: the responder is told so, and sees nothing sealed.
    nothing = plugin(responder, ns, "status", "invoice", "--reveal")
    assert nothing.returncode != 0
    assert "agentrun " + ns + "/invoice waits on no question" in nothing.stderr, nothing.stderr
    assert "(state 'waiting_approval', waiting for approval:" in nothing.stderr, nothing.stderr
    assert "need verb 'approve' on agentruns" in nothing.stderr
    # It may neither approve nor cancel (the webhook's SubjectAccessReview refuses both).
    request = runs.get("invoice")["status"]["approvalRequest"]
    pinned = ("--request", request["requestId"], "--digest", request["digest"])
    approve = plugin(responder, ns, "approve", "invoice", *pinned)
    assert approve.returncode != 0
    assert "user 'responder' may not approve agentruns/invoice" in approve.stderr, approve.stderr
    cancel = plugin(responder, ns, "cancel", "invoice")
    assert cancel.returncode != 0
    assert "user 'responder' may not cancel agentruns/invoice" in cancel.stderr, cancel.stderr
    for refused in (nothing, approve, cancel):
        assert MEMO not in refused.stdout + refused.stderr
        assert IBAN not in refused.stdout + refused.stderr
    stored = runs.get("invoice")
    assert stored["status"]["state"] == "waiting_approval", "nothing was decided"
    assert not stored["spec"].get("cancellations"), "no cancellation was stored"
    assert refsystem.counts() == {}

    approved = plugin(kubeconfigs["approver"], ns, "approve", "invoice", *pinned)
    assert approved.returncode == 0, approved.stderr
    runs.wait_state("invoice", "waiting_input", timeout=60)
    assert list(refsystem.counts().values()) == [1]

    # Now the run holds a sealed question, a sealed effect argument, and an ActionRecord with
    # sealed arguments and outcome: the responder's reveal shows the question only.
    shown = plugin(responder, ns, "status", "invoice", "--reveal")
    assert shown.returncode == 0, shown.stderr
    assert f"Question:    {QUESTION}" in shown.stdout, shown.stdout
    assert "only the question this run waits on" in shown.stdout
    assert "withheld: spec value steps/pay/arguments (verb 'approve' on agentruns shows it)" in shown.stdout
    assert "withheld: its actions' arguments and outcomes (ActionRecords), if any" in shown.stdout
    assert MEMO not in shown.stdout
    assert IBAN not in shown.stdout
    assert "  action " not in shown.stdout
    document = revealed_as(responder, ns, "invoice")
    assert set(document) == {"run", "scope", "pendingInput", "answers", "withheld"}, document
    assert document["scope"] == "question"
    asked = document["pendingInput"]
    assert (asked["requestId"], asked["key"], asked["question"]) == ("receipt", "receipt", QUESTION)
    assert asked["askedBy"] == "the run's spec"
    assert document["answers"] == {}
    text = json.dumps(document)
    assert MEMO not in text
    assert IBAN not in text
    assert "7731" not in text.replace("INV-7731", ""), "the amount is an effect argument"
    # The approver's reveal of the same run holds what the responder's withheld.
    everything = revealed_as(kubeconfigs["approver"], ns, "invoice")
    assert everything["values"]["steps/pay/arguments"]["memo"] == MEMO
    assert [action["arguments"]["iban"] for action in everything["actions"]] == [IBAN]

    # The responder answers; the run acts on the answer and completes.
    answered = plugin(responder, ns, "answer", "invoice", ANSWER)
    assert answered.returncode == 0, answered.stderr
    assert "answered as spec.answers['receipt']" in answered.stdout
    runs.wait_state("invoice", "completed", timeout=60)
    assert list(refsystem.counts().values()) == [1], "the effect was applied once"
    assert ANSWER not in json.dumps(runs.get("invoice")), "the answer is stored sealed"
    assert_nothing_in_clear(runs.get("invoice"))
    after = plugin(responder, ns, "status", "invoice", "--reveal")
    assert after.returncode != 0
    assert "waits on no question (state 'completed'" in after.stderr, after.stderr


# The sample's model (config/samples/reference-model/refunds-script.yaml) reads the limits and
# proposes the refund; then, here, it asks a person, and answers only once told the marker.
MODEL_QUESTION = "Tell the customer by e-mail? \u202e(responder-model-question-5b9c)"
MARKER = "responder-model-answer-e2d4"
REFUND = script()["rules"][1]["toolCalls"][0]["arguments"]


def asking_script() -> dict[str, Any]:
    read, refund, _ = script()["rules"]
    asked = {"called": ["refund"], "notCalled": ["ask_owner"]}
    ask = {"name": "ask_owner", "arguments": {"question": MODEL_QUESTION}}
    told = {"called": ["ask_owner"], "lastToolResultContains": MARKER}
    return {
        "model": "scripted-refunds",
        "rules": [
            read,
            refund,
            {"when": asked, "content": "Should I tell the customer?", "toolCalls": [ask]},
            {"when": told, "content": f"Refunded; the owner said: {MARKER}."},
        ],
    }


@pytest.mark.local_plane("users", "webhook")
def test_a_responder_reads_and_answers_a_models_question_and_nothing_else(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,  # noqa: F811
    kubeconfigs: dict[str, Path],
    refsystem: ReferenceSystemThread,
) -> None:
    op = start_operator("responder-model", DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()
    ns, name, responder = agent_namespace, "refund", kubeconfigs["responder"]
    with ModelServerThread(asking_script(), api_key=API_KEY) as model:
        spec = agent_spec(model, refsystem)
        ask = {"name": "ask_owner", "description": "Ask the shop owner.", "askHuman": {"expiresIn": "1h"}}
        spec["agent"]["tools"].append(ask)
        body = {**sample_of("AgentRun"), "spec": spec}
        user_api(kubeconfigs["editor"]).create_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", body)
        runs.wait_state(name, "waiting_approval", timeout=Within.TAKEOVER)
        with pytest.raises(client.ApiException) as refused:  # the model's proposal is not a question
            revealed_as(responder, ns, name)
        assert refused.value.status == 409, refused.value.body
        assert "waits on no question" in str(refused.value.body)
        assert REFUND["orderId"] not in str(refused.value.body)
        request = runs.get(name)["status"]["approvalRequest"]
        pinned = ("--request", request["requestId"], "--digest", request["digest"])
        approved = plugin(kubeconfigs["approver"], ns, "approve", name, *pinned)
        assert approved.returncode == 0, approved.stderr
        runs.wait_state(name, "waiting_input", timeout=Within.RUN)

        document = revealed_as(responder, ns, name)
        assert document["pendingInput"]["question"] == MODEL_QUESTION
        assert document["pendingInput"]["askedBy"] == "model"
        assert "the model's 3 turns (arguments, reasons, results)" in document["withheld"]["what"]
        text = json.dumps(document)
        for secret in (REFUND["orderId"], "The limit is 200 EUR", "maxAmount", "Should I tell"):
            assert secret not in text, f"the responder sees {secret!r}"
        shown = plugin(responder, ns, "status", name, "--reveal")
        assert shown.returncode == 0, shown.stderr
        question = next(line for line in shown.stdout.splitlines() if line.startswith("Question:"))
        assert question.startswith("Question:    asked by the model (its words, not authority): ")
        assert "\\u202e(responder-model-question-5b9c)" in question, (
            "the model's control character is escaped"
        )
        assert REFUND["orderId"] not in shown.stdout
        assert "withheld: the model's 3 turns (arguments, reasons, results)" in shown.stdout

        answered = plugin(responder, ns, "answer", name, f"yes, tell them ({MARKER})")
        assert answered.returncode == 0, answered.stderr
        runs.wait_state(name, "completed", timeout=Within.RUN)
    # The model was told the answer: only then does its script answer (and the run complete).
    final = revealed_as(kubeconfigs["approver"], ns, name)["answer"]
    assert final == {"writtenBy": "model", "text": f"Refunded; the owner said: {MARKER}."}
    assert list(refsystem.counts().values()) == [1]
    assert not op.logged("Traceback")
