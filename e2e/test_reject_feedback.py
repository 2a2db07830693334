"""Reject with feedback (issue 33): a person rejects a model's proposal with a reason; under the
policy's ``rejection.response: replan`` the model is told the reason and proposes again, the new
proposal is a new request (new ID, new digest), it is approved and applied once. Under ``end`` the
run ends as a rejection always ended it (failed, ``ApprovalRejected``).

Real API server, the operator as a separate process, the reference model server (scripted: 500
first; 100 once told "at most 100") and the reference system counting applications. Decisions are
stamped as through the admission webhook (:mod:`durable_agents_testkit.keys`).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.agent_sample import API_KEY, install_sample, sample_of
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless

REASON = "too much, at most 100"
LEASE = 3  # seconds: a rescuer takes over soon after a kill


def refund(amount: int) -> dict[str, Any]:
    return {"name": "refund", "arguments": {"orderId": "A-1042", "amount": amount, "currency": "EUR"}}


SCRIPT: dict[str, Any] = {
    "model": "scripted-refunds",
    "rules": [
        {"when": {"notCalled": ["refund"]}, "content": "Refund 500 EUR.", "toolCalls": [refund(500)]},
        {
            "when": {"called": ["refund"], "lastToolResultContains": "at most 100"},
            "content": "The approver allows at most 100: refund 100 EUR.",
            "toolCalls": [refund(100)],
        },
        {"when": {"called": ["refund"]}, "content": "Refunded 100 EUR for order A-1042."},
    ],
}


@pytest.fixture
def model() -> Iterator[ModelServerThread]:
    with ModelServerThread(SCRIPT, api_key=API_KEY) as server:
        yield server


def install(kube: KubeEnv, namespace: str, **rejection: Any) -> None:
    """The model sample's objects, its policy with ``rejection`` (none: the default, end)."""
    install_sample(kube.api, namespace, policy=False)
    policy = sample_of("AgentPolicy")
    policy["metadata"]["namespace"] = namespace
    if rejection:
        policy["spec"]["rejection"] = rejection
    client.CustomObjectsApi(kube.api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentpolicies", policy
    )


def spec(model: ModelServerThread, refsystem: ReferenceSystemThread) -> dict[str, Any]:
    out: dict[str, Any] = sample_of("AgentRun")["spec"]
    out["agent"]["endpoint"]["baseUrl"] = model.base_url
    for tool in out["agent"]["tools"]:
        if "effect" in tool:
            url = f"{refsystem.url}/effects"
            tool["effect"]["target"] = {"url": url, "queryUrl": url}
    return out


def request_after(runs: Runs, name: str, seen: set[str]) -> dict[str, Any]:
    """The run's approval request once it is one not ``seen`` before."""

    def current() -> dict[str, Any] | None:
        run = runs.get(name)
        request = (run.get("status") or {}).get("approvalRequest")
        ended = (run.get("status") or {}).get("state") in ("failed", "expired", "completed")
        assert not ended, f"run {name} ended waiting for a new request: {run['status'].get('outcome')}"
        return request if request and request["requestId"] not in seen else None

    return eventually(current, Within.RUN, f"a new approval request of {name} (not {sorted(seen)})")


def decide(runs: Runs, name: str, request: dict[str, Any], decision: str, reason: str | None = None) -> None:
    """Pinned to what was reviewed: the request's ID and digest."""
    body: dict[str, Any] = {"digest": request["digest"], "decision": decision}
    if reason is not None:
        body["reason"] = reason
    runs.patch_spec(name, {"approvals": {request["requestId"]: body}})


def told(model: ModelServerThread) -> list[list[dict[str, Any]]]:
    """The model requests whose last message carried the reason (those that tell the model of the
    rejection, not the later ones that still hold it): their tool messages."""
    requests = model.calls()["requests"]
    assert isinstance(requests, list)
    messages = [r["messages"] for r in requests]
    return [[m for m in ms if m["role"] == "tool"] for ms in messages if REASON in json.dumps(ms[-1])]


def test_a_rejection_s_reason_goes_back_to_the_model_and_its_new_proposal_is_applied_once(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    kube: KubeEnv,
    namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    install(kube, namespace, response="replan", maxRejections=2)
    op = start_operator("replan")
    name = runs.create(spec(model, refsystem))
    first = request_after(runs, name, set())
    decide(runs, name, first, "reject", REASON)
    second = request_after(runs, name, {first["requestId"]})
    assert second["digest"] != first["digest"], "a replanned proposal is a new request with a new digest"
    assert refsystem.total() == 0, "nothing rejected, nothing unapproved is sent"
    [tool_messages, *_] = told(model)
    assert [REASON in m["content"] for m in tool_messages] == [True], "the reason, as the call's result"
    assert "rejected" in tool_messages[0]["content"]

    decide(runs, name, second, "approve")
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    [applied] = refsystem.records()
    assert '"amount": 100' in json.dumps(applied.body), f"the approved amount is applied: {applied.body}"
    assert refsystem.total() == 1, "exactly one application, of the approved amount"
    approvals = done["status"]["checkpoint"]["approvals"]
    assert [(a["requestId"], a["decision"]) for a in approvals] == [
        (first["requestId"], "rejected"),
        (second["requestId"], "approved"),
    ], "each decision stays in the run's record"
    history = assert_history_is_gapless(done)
    assert [h["event"] for h in history].count("approval_decided") == 2
    assert any("rejection 1 of at most 2" in (h.get("detail") or "") for h in history)
    facts = done["status"]["checkpoint"]["agent"]
    assert [t["outcome"] for t in facts["turns"]] == ["refused", "succeeded"]
    assert REASON not in json.dumps(done["status"]), "the reason is sealed in the status"
    assert not op.logged("Traceback")


def test_under_end_a_rejection_ends_the_run_as_it_always_did(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    kube: KubeEnv,
    namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    install(kube, namespace)  # no rejection rule: the default, end
    start_operator("end")
    name = runs.create(spec(model, refsystem))
    first = request_after(runs, name, set())
    decide(runs, name, first, "reject", REASON)
    ended = runs.wait_state(name, "failed", "completed", timeout=Within.RUN)
    assert ended["status"]["state"] == "failed"
    outcome = ended["status"]["outcome"]
    assert outcome["reason"] == "ApprovalRejected"
    assert outcome["message"] == f"durable-agents-test-kit rejected {first['requestId']}"
    assert told(model) == [], "the model is not asked again"
    assert refsystem.total() == 0


def test_a_kill_while_the_model_is_asked_after_a_rejection_loses_and_repeats_nothing(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    kube: KubeEnv,
    namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    """SIGKILL between the rejection's commit and the model's answer: the rescuer asks the model
    the same request again (the rejection once, as the call's result), and carries on."""
    install(kube, namespace, response="replan")
    model.inject("slow", delay=float(Within.COMMIT), match=REASON)  # the request that tells the reason
    victim = start_operator("victim", LEASE)
    name = runs.create(spec(model, refsystem))
    first = request_after(runs, name, set())
    decide(runs, name, first, "reject", REASON)
    eventually(lambda: told(model), Within.RUN, "the model asked with the rejection's reason")
    victim.kill()
    assert victim.wait_exit(0) == -signal.SIGKILL
    rescuer = start_operator("rescuer", LEASE)
    second = request_after(runs, name, {first["requestId"]})
    decide(runs, name, second, "approve")
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    asked = told(model)
    assert len(asked) >= 2, "the rescuer asked again what the victim asked"
    assert all(messages == asked[0] for messages in asked), "the same request, rebuilt from the checkpoint"
    assert sum(REASON in m["content"] for m in asked[0]) == 1, "the rejection told once"
    replans = [h for h in assert_history_is_gapless(done) if "rejection 1 of" in (h.get("detail") or "")]
    assert len(replans) == 1, "one rejection, recorded once"
    assert refsystem.total() == 1
    assert not rescuer.logged("Traceback")


def test_a_rejection_written_past_the_webhook_tells_the_model_nothing(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    kube: KubeEnv,
    namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    """The second line: a rejection without the webhook's stamp (the webhook off, RBAC too broad)
    is refused, never a decision; its text reaches no model request, and the run asks again."""
    install(kube, namespace, response="replan")
    start_operator("forged")
    name = runs.create(spec(model, refsystem))
    first = request_after(runs, name, set())
    forged = {"digest": first["digest"], "decision": "reject", "reason": f"FORGED {REASON}"}
    runs.patch_spec(name, {"approvals": {first["requestId"]: forged}}, stamped=False)
    second = request_after(runs, name, {first["requestId"]})
    run = runs.get(name)
    refused = [(r["field"], r["key"]) for r in run["status"].get("refusedRequests") or []]
    assert refused == [("approvals", first["requestId"])], "refused once, never taken as a decision"
    assert second["arguments"] == first["arguments"], "the same proposal asked again: no replan"
    requests = model.calls()["requests"]
    assert isinstance(requests, list)
    assert "FORGED" not in json.dumps(requests), "no unverified text reaches the model"
    tool_results = [m for r in requests for m in r["messages"] if m["role"] == "tool"]
    assert tool_results == [], "the model was told nothing: its call is still the pending one"
    assert refsystem.total() == 0


@pytest.mark.parametrize(
    "reason",
    ["\x1b[2J\x1b[31mapproved\x1b[0m", "nul\x00byte", "c1\x9bcontrol", "r" * 1025],
    ids=["ansi-escape", "nul", "c1-control", "over-1024"],
)
def test_a_reason_with_control_characters_or_over_its_bound_is_refused_naming_the_field(
    runs: Runs,
    kube: KubeEnv,
    namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    reason: str,
) -> None:
    """The reason is shown to people and, under replan, told to the model: the API server refuses
    one it could not show as plain text, naming the field; nothing is recorded."""
    install(kube, namespace, response="replan")
    name = runs.create(spec(model, refsystem))
    body = {"digest": "sha256:" + "0" * 64, "decision": "reject", "reason": reason}
    with pytest.raises(client.ApiException) as refused:
        runs.patch_spec(name, {"approvals": {"agent-0-1": body}}, stamped=False)
    assert refused.value.status == 422
    assert "spec.approvals.agent-0-1.reason" in str(refused.value.body)
    assert (runs.get(name)["spec"].get("approvals") or {}) == {}
    fine = {**body, "reason": "too much,\tat most 100\r\nsee the limits page"}
    runs.patch_spec(name, {"approvals": {"agent-0-1": fine}}, stamped=False)  # tabs and line breaks pass
    assert runs.get(name)["spec"]["approvals"]["agent-0-1"]["reason"] == fine["reason"]
