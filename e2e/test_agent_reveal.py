"""An approver of a model's call sees what they approve: the proposed call, the evidence it rests
on and the model's stated reason, marked as written by the model; nobody else sees any of it.

The sample model run (config/samples/agentrun-model.yaml, driven by the reference model server's
script) waits for approval of the refund the model proposed. Its arguments, the model's words and
what its read returned are sealed per turn (``agent/turns/<index>/<field>``); ``kubectl agentrun
status --reveal`` opens them for a user holding the approve verb, as for a scripted run
(e2e/test_reveal.py, whose users and roles this test borrows, as it borrows the model run's
set-up from e2e/test_agent.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e.test_agent import agent_namespace, agent_spec, model  # noqa: F401 (fixtures)
from e2e.test_reveal import kubeconfigs, plugin, user_api  # noqa: F401 (a fixture)
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.labels import REVEAL_ANNOTATION, REVEALED_ANNOTATION
from durable_agents.core.disclosure import new_reader_key, open_as_reader
from durable_agents.kubectl.main import describe
from durable_agents_testkit.agent_sample import sample_of, script
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

SCRIPT = script()
PROPOSED = SCRIPT["rules"][1]  # the rule whose reply proposes the refund
REFUND = PROPOSED["toolCalls"][0]["arguments"]
WORDS = PROPOSED["content"]
MODEL_SAYS = "model says (written by the model, not authority):"


def reveal_as(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    """The revealed document, as ``status --reveal`` gets it (a dry-run patch with a new key)."""
    private, public = new_reader_key(entropy=os.urandom)
    answer = user_api(kubeconfig).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "agentruns",
        name,
        {"metadata": {"annotations": {REVEAL_ANNOTATION: public}}},
        dry_run="All",
    )
    return open_as_reader(
        private, answer["metadata"]["annotations"][REVEALED_ANNOTATION], f"{namespace}/{name}"
    )


def assert_nothing_in_clear(stored: dict[str, Any]) -> None:
    text = json.dumps(stored)
    assert WORDS not in text, "the model's words are stored in clear"
    # The model's final answer is the run's result (status.outcome), in clear by design.
    status = {key: value for key, value in (stored.get("status") or {}).items() if key != "outcome"}
    assert REFUND["orderId"] not in json.dumps(status), "the proposed call is stored in clear"
    assert REVEALED_ANNOTATION not in (stored["metadata"].get("annotations") or {})


@pytest.mark.local_plane("users", "webhook")
def test_an_approver_sees_the_models_proposal_its_reason_and_evidence_and_nobody_else_does(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,  # noqa: F811
    model: ModelServerThread,  # noqa: F811
    refsystem: ReferenceSystemThread,
    kubeconfigs: dict[str, Path],  # noqa: F811
) -> None:
    op = start_operator("agent-reveal", DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()  # the editor's run is written raw: the webhook stamps and seals it
    ns, name = agent_namespace, "refund"
    body = {**sample_of("AgentRun"), "spec": agent_spec(model, refsystem)}
    user_api(kubeconfigs["editor"]).create_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", body)
    run = runs.wait_state(name, "waiting_approval", timeout=Within.TAKEOVER)
    request = run["status"]["approvalRequest"]
    assert (request["proposal"]["tool"], request["proposal"]["turn"]) == ("refund", 1)
    assert_nothing_in_clear(run)

    # Without --reveal, the model's words are sealed for everyone.
    shown = plugin(kubeconfigs["viewer"], ns, "status", name)
    assert shown.returncode == 0, shown.stderr
    assert f"  {MODEL_SAYS} (sealed)" in shown.stdout
    assert "  arguments:   (sealed)" in shown.stdout
    assert WORDS not in shown.stdout

    # The approver sees the call as proposed, the model's reason as the model's, the evidence.
    document = reveal_as(kubeconfigs["approver"], ns, name)
    revealed = document["approvalRequest"]
    assert revealed["arguments"] == REFUND == {"orderId": "A-1042", "amount": 120, "currency": "EUR"}
    assert revealed["proposal"]["reason"] == {"writtenBy": "model", "text": WORDS}
    assert revealed["proposal"]["callId"] == request["proposal"]["callId"]
    (evidence,) = document["evidence"]
    assert revealed["evidence"] == request["evidence"] == [evidence["id"]]
    assert evidence["name"] == "refund-limits"
    assert evidence["turn"] == 0
    read = document["turns"][0]
    assert read["tool"] == "read_limits"
    assert read["result"]["contentDigest"] == evidence["contentDigest"]
    assert read["result"]["object"]["data"] == {"maxAmount": "200", "currency": "EUR"}
    assert document["turns"][1]["arguments"] == REFUND
    assert "unreadable" not in document

    # `kubectl agentrun status --reveal`: the same, as printed.
    status = describe(runs.get(name), document)
    print(status)  # what the approver sees (pytest -s)
    lines = status.splitlines()
    assert (
        f"  proposal:    refund (call {request['proposal']['callId']}, turn 1), proposed by the model"
        in lines
    )
    assert f"  {MODEL_SAYS} {json.dumps(WORDS)}" in lines
    assert '  arguments:   {"amount": 120, "currency": "EUR", "orderId": "A-1042"}' in lines
    assert any(line.startswith(f"  evidence:    {evidence['id']}: ConfigMap ") for line in lines)
    shown = plugin(kubeconfigs["approver"], ns, "status", name, "--reveal")
    assert shown.returncode == 0, shown.stderr
    assert f"  {MODEL_SAYS} {json.dumps(WORDS)}" in shown.stdout.splitlines()
    assert "not revealed" not in shown.stdout

    # Who does not hold the approve verb sees nothing here: the viewer may not patch; the editor
    # may, and holds "answer", which shows only a question the run waits on (none here).
    with pytest.raises(client.ApiException) as refused:
        reveal_as(kubeconfigs["editor"], ns, name)
    assert refused.value.status == 409, refused.value.body
    assert f"agentrun {ns}/{name} waits on no question" in str(refused.value.body)
    assert "its other sealed values need verb 'approve'" in str(refused.value.body)
    for who in ("editor", "viewer"):
        shown = plugin(kubeconfigs[who], ns, "status", name, "--reveal")
        assert shown.returncode != 0, f"{who} was shown: {shown.stdout}"
        assert "refused to reveal" in shown.stderr
        for secret in (WORDS, REFUND["orderId"]):
            assert secret not in shown.stdout + shown.stderr, f"{who} sees {secret!r}"
    assert_nothing_in_clear(runs.get(name))

    # Approved and done: the ActionRecord's arguments (sealed for the turn) are revealed too.
    request = runs.get(name)["status"]["approvalRequest"]  # the request the approver reviewed
    pinned = ("--request", request["requestId"], "--digest", request["digest"])
    approved = plugin(kubeconfigs["approver"], ns, "approve", name, *pinned)
    assert approved.returncode == 0, approved.stderr
    runs.wait_state(name, "completed", timeout=Within.RUN)
    assert list(refsystem.counts().values()) == [1]
    document = reveal_as(kubeconfigs["approver"], ns, name)
    (action,) = document["actions"]
    assert (action["effect"], action["state"], action["arguments"]) == ("http.post", "succeeded", REFUND)
    assert action["outcome"] is not None
    assert [turn["outcome"] for turn in document["turns"]] == ["succeeded", "succeeded"]
    assert "unreadable" not in document
    records = runs.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "actionrecords")["items"]
    assert all(REFUND["orderId"] not in json.dumps(r) for r in records)
    assert_nothing_in_clear(runs.get(name))
    assert not op.logged("Traceback")
