"""The model planner when the model misbehaves: each failure ends in its documented state, with a
reason that says why, and the operator goes on serving the namespace's other runs.

Real API server, the operator as a separate process, the reference model server (one per run, so
a fault injected for one run never reaches another) and the reference authoritative system on
loopback. The runs are config/samples/agentrun-model.yaml's, under AgentPolicies that set the
limits and the retry policy of each case.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.agent_facts import ANSWER_LABEL
from durable_agents.kubectl import why as kubectl_why
from durable_agents_testkit.agent_sample import API_KEY, install_sample, sample_of
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import eventually
from durable_agents_testkit.keys import unsealed
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless

MODEL = "scripted-refunds"
READ_LIMITS = {"name": "read_limits", "arguments": {"name": "refund-limits"}}
ANSWER = "The refund limit is 200 EUR."
# A model that reads the limits, then answers.
READS_THEN_ANSWERS = {
    "model": MODEL,
    "rules": [
        {
            "when": {"notCalled": ["read_limits"]},
            "content": "I will read the refund limits first.",
            "toolCalls": [READ_LIMITS],
        },
        {"when": {"lastToolResultContains": "maxAmount"}, "content": ANSWER},
    ],
}
# Its first call's arguments are cut short (not JSON); told so, it sends them again, whole. Scripted
# rather than a one-shot fault: a repeated request (a batch not committed) is answered alike.
MALFORMED_FIRST = {
    "model": MODEL,
    "rules": [
        {
            "when": {"notCalled": ["read_limits"]},
            "content": "I will read the refund limits first.",
            "toolCalls": [{"name": "read_limits", "argumentsText": '{"name": "refund-lim'}],
        },
        {
            "when": {"lastToolResultContains": "are not valid JSON"},
            "content": "I will send the arguments again, as JSON.",
            "toolCalls": [READ_LIMITS],
        },
        {"when": {"lastToolResultContains": "maxAmount"}, "content": ANSWER},
    ],
}
# A model that keeps calling a tool it was never offered, whatever it is told.
CALLS_AN_UNKNOWN_TOOL = {
    "model": MODEL,
    "rules": [
        {
            "content": "Refunding now.",
            "toolCalls": [{"name": "issue_refund", "arguments": {"orderId": "A-1042", "amount": 120}}],
        }
    ],
}
# The production default: a loaded machine's stall drops no Lease (a batch not committed is decided
# again, and a one-shot fault of the model server would then be used up by the first try).
MESSAGES = "anthropic-messages"
LEASE = 15
FAST_RETRY = {"initialBackoff": "300ms", "maxBackoff": "1s", "jitter": 0}
# A broken endpoint (the reference server's faults), the run's reason, and how the reply is named.
BROKEN_REPLIES = {
    "html": (
        "ModelReplyNotJson",
        'HTTP 200 with an HTML page (text/html): "Sign in to continue - Example Proxy"',
    ),
    "not_json": (
        "ModelReplyNotJson",
        "HTTP 200 with a body that is not JSON although its content type is application/json:"
        ' "upstream connect error',
    ),
    "unauthorized": ("ModelAuthFailed", "AuthenticationError (HTTP 401) from "),
    "error": ("ModelError", "InternalServerError (HTTP 500) from "),
    "empty": ("ModelReplyEmpty", "HTTP 200 with a chat completion with no content and no tool calls"),
}


@pytest.fixture
def agent_namespace(kube: KubeEnv, namespace: str) -> str:
    """The sample's prompt, limits, key Secret and RBAC (its policy: see :func:`policy`)."""
    install_sample(kube.api, namespace, policy=False)
    return namespace


@pytest.fixture
def models() -> Iterator[Callable[[dict[str, Any]], ModelServerThread]]:
    """Reference model servers with the sample's key, each answering from its own script."""
    with ExitStack() as stack:
        yield lambda script: stack.enter_context(ModelServerThread(script, api_key=API_KEY))


def policy(runs: Runs, name: str, **spec: Any) -> str:
    """The sample's AgentPolicy under another name, with ``spec`` (agentLimits, retry) set."""
    body = sample_of("AgentPolicy")
    body = {**body, "metadata": {"name": name}, "spec": {**body["spec"], **spec}}
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)
    return name


def agent_spec(
    model: ModelServerThread, refsystem: ReferenceSystemThread, policy_name: str, timeout: str = "30s"
) -> dict[str, Any]:
    spec: dict[str, Any] = sample_of("AgentRun")["spec"]
    spec["policyRef"] = {"name": policy_name}
    spec["agent"]["endpoint"].update(baseUrl=model.base_url, timeout=timeout)
    for tool in spec["agent"]["tools"]:
        if "effect" in tool:
            tool["effect"]["target"] = {
                "url": f"{refsystem.url}/effects",
                "queryUrl": f"{refsystem.url}/effects",
            }
    return spec


def distinct(model: ModelServerThread) -> list[dict[str, Any]]:
    """The requests the model server received, each once: the operator repeats a request when a
    batch was not committed (the reference server answers it alike), which is no new call."""
    seen: dict[str, dict[str, Any]] = {}
    for request in model.calls()["requests"]:
        seen.setdefault(json.dumps(request, sort_keys=True), request)
    return list(seen.values())


def tool_results(request: dict[str, Any]) -> list[str]:
    """The ``tool`` messages of a request the model server received: what the model was told."""
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def retries(run: dict[str, Any]) -> list[str]:
    """The details of the run's retry windows, in order (each names the failure and the attempt)."""
    windows = [h for h in assert_history_is_gapless(run) if h["event"] == "retry_scheduled"]
    assert all((h["from"], h["to"]) == ("ready", "waiting_retry") for h in windows)
    return [h["detail"] for h in windows]


def outcome(run: dict[str, Any]) -> tuple[str, str, str]:
    return run["status"]["state"], run["status"]["outcome"]["reason"], run["status"]["outcome"]["message"]


def test_a_model_that_keeps_calling_an_unknown_tool_fails_while_a_healthy_run_completes(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    models: Callable[[dict[str, Any]], ModelServerThread],
    refsystem: ReferenceSystemThread,
) -> None:
    op = start_operator("agent-failures", lease_duration=LEASE)
    limits = policy(
        runs, "two-bad-calls", agentLimits={"maxConsecutiveToolErrors": 2}, retry={"maxAttempts": 3}
    )
    broken, healthy = models(CALLS_AN_UNKNOWN_TOOL), models(READS_THEN_ANSWERS)
    bad = runs.create(agent_spec(broken, refsystem, limits))
    good = runs.create(agent_spec(healthy, refsystem, limits))

    failed = runs.wait_state(bad, "failed", timeout=90)
    told = "unknown tool 'issue_refund'; the tools offered are: read_limits, refund"
    assert outcome(failed) == ("failed", "ToolCallsInvalid", f"2 bad tool calls in a row; the last: {told}")
    assert retries(failed) == [], "a model that keeps making bad calls is not retried"
    # The policy's maxConsecutiveToolErrors (2, not the default 3) ends it after two calls.
    first, second = distinct(broken)
    assert tool_results(first) == []
    (result,) = tool_results(second)
    assert told in result, "the model was told why"
    facts = failed["status"]["checkpoint"]["agent"]
    assert [(t["tool"], t["outcome"]) for t in facts["turns"]] == [("issue_refund", "refused")] * 2
    assert facts["toolErrors"] == 2

    done = runs.wait_state(good, "completed", timeout=90)
    assert done["status"]["outcome"]["reason"] == "Completed"
    assert [t["tool"] for t in done["status"]["checkpoint"]["agent"]["turns"]] == ["read_limits"]
    assert unsealed(done, done["status"]["outcome"]["result"], ANSWER_LABEL) == ANSWER  # sealed: model output
    assert len(distinct(healthy)) == 2
    assert refsystem.counts() == {}, "no call of either run reached the system"
    assert not op.logged("Traceback")


def test_malformed_arguments_are_told_to_the_model_which_corrects_them_and_the_run_completes(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    models: Callable[[dict[str, Any]], ModelServerThread],
    refsystem: ReferenceSystemThread,
) -> None:
    op = start_operator("agent-failures", lease_duration=LEASE)
    limits = policy(runs, "two-bad-calls", agentLimits={"maxConsecutiveToolErrors": 2})
    model = models(MALFORMED_FIRST)
    name = runs.create(agent_spec(model, refsystem, limits))

    done = runs.wait_state(name, "completed", timeout=90)
    assert done["status"]["outcome"]["reason"] == "Completed"
    assert unsealed(done, done["status"]["outcome"]["result"], ANSWER_LABEL) == ANSWER  # sealed: model output
    # Rule 1 answers only a model told "the arguments are not valid JSON" in the last tool result.
    assert all(n >= 1 for n in model.calls()["byRule"].values())
    first, second, third = distinct(model)
    assert tool_results(first) == []
    assert len(tool_results(third)) == 2
    (told,) = tool_results(second)
    assert "the arguments are not valid JSON" in told, told
    facts = done["status"]["checkpoint"]["agent"]
    assert [(t["tool"], t["outcome"]) for t in facts["turns"]] == [
        ("read_limits", "refused"),
        ("read_limits", "succeeded"),
    ]
    assert facts["toolErrors"] == 0, "a good call ends the run of bad ones"
    assert not op.logged("Traceback")


def test_model_500s_are_retried_per_the_retry_policy_and_fail_the_run_once_attempts_are_spent(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    models: Callable[[dict[str, Any]], ModelServerThread],
    refsystem: ReferenceSystemThread,
) -> None:
    op = start_operator("agent-failures", lease_duration=LEASE)
    three = policy(runs, "three-attempts", retry={"maxAttempts": 3, **FAST_RETRY})
    two = policy(runs, "two-attempts", retry={"maxAttempts": 2, **FAST_RETRY})
    once = policy(runs, "one-attempt")  # the default retry policy: no retry
    recovers, gives_up, no_retry = (models(READS_THEN_ANSWERS) for _ in range(3))
    recovers.inject("error", times=2)
    gives_up.inject("error", times=10)
    no_retry.inject("error", times=10)
    ok = runs.create(agent_spec(recovers, refsystem, three))
    spent = runs.create(agent_spec(gives_up, refsystem, two))
    single = runs.create(agent_spec(no_retry, refsystem, once))

    done = runs.wait_state(ok, "completed", timeout=90)
    assert done["status"]["outcome"]["reason"] == "Completed"
    windows = retries(done)
    assert len(windows) == 2, windows
    for attempt, detail in enumerate(windows, start=2):
        assert detail.startswith("model call failed: ModelError: InternalServerError (HTTP 500)"), detail
        assert f"attempt {attempt}/3 at " in detail, detail
    assert recovers.calls()["total"] >= 4, "two 500s, then the two calls of a good run"
    assert len(distinct(recovers)) == 2, "each retry asked the same question again"

    failed = runs.wait_state(spent, "failed", timeout=90)
    state, reason, message = outcome(failed)
    assert (state, reason) == ("failed", "RetriesExhausted")
    assert message.startswith("2 attempts failed; last: ModelError: InternalServerError (HTTP 500)"), message
    assert len(retries(failed)) == 1
    assert gives_up.calls()["total"] == 2, "one call per attempt, no hidden retries in the client"

    failed = runs.wait_state(single, "failed", timeout=90)
    state, reason, message = outcome(failed)
    assert (state, reason) == ("failed", "ModelError")
    assert message.startswith("InternalServerError (HTTP 500)"), message
    assert retries(failed) == []
    assert no_retry.calls()["total"] == 1
    assert not op.logged("Traceback")


def test_a_model_slower_than_the_endpoint_timeout_is_a_model_timeout_retried_per_the_policy(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    models: Callable[[dict[str, Any]], ModelServerThread],
    refsystem: ReferenceSystemThread,
) -> None:
    op = start_operator("agent-failures", lease_duration=LEASE)
    two = policy(runs, "two-attempts", retry={"maxAttempts": 2, **FAST_RETRY})
    recovers, gives_up = models(READS_THEN_ANSWERS), models(READS_THEN_ANSWERS)
    recovers.inject("slow", times=1, delay=4.0)
    gives_up.inject("slow", times=2, delay=4.0)
    ok = runs.create(agent_spec(recovers, refsystem, two, timeout="1s"))
    spent = runs.create(agent_spec(gives_up, refsystem, two, timeout="1s"))

    done = runs.wait_state(ok, "completed", timeout=90)
    assert done["status"]["outcome"]["reason"] == "Completed"
    (window,) = retries(done)
    assert window.startswith("model call failed: ModelTimeout: APITimeoutError"), window
    assert "attempt 2/2 at " in window

    failed = runs.wait_state(spent, "failed", timeout=90)
    state, reason, message = outcome(failed)
    assert (state, reason) == ("failed", "RetriesExhausted")
    assert message.startswith("2 attempts failed; last: ModelTimeout: APITimeoutError"), message
    assert f"({recovers.base_url}, timeout 1s)" in window, "the message names the endpoint and its limit"

    def why(w: str) -> str:
        return w.split(";")[0].split(" (http")[0]

    assert [why(w) for w in retries(failed)] == [why(window)]
    assert gives_up.calls()["total"] == 2
    assert not op.logged("Traceback")


def test_a_run_over_its_token_budget_fails_without_calling_the_model_again(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    models: Callable[[dict[str, Any]], ModelServerThread],
    refsystem: ReferenceSystemThread,
) -> None:
    op = start_operator("agent-failures", lease_duration=LEASE)
    budget = policy(
        runs, "small-budget", agentLimits={"maxTokens": 100}, retry={"maxAttempts": 3, **FAST_RETRY}
    )
    model = models(READS_THEN_ANSWERS)
    name = runs.create(agent_spec(model, refsystem, budget))

    failed = runs.wait_state(name, "failed", timeout=90)
    state, reason, message = outcome(failed)
    usage = failed["status"]["checkpoint"]["agent"]["usageTotal"]
    used = usage["inputTokens"] + usage["outputTokens"]
    assert used > 100
    assert (state, reason) == ("failed", "AgentLimitExceeded")
    assert message == (
        f"{used} tokens used ({usage['inputTokens']} in, {usage['outputTokens']} out): the run's limit is 100"
    )
    assert retries(failed) == [], "a spent budget is not retried"
    assert len(distinct(model)) == 1, "the model is not called once the budget is spent"
    assert [t["tool"] for t in failed["status"]["checkpoint"]["agent"]["turns"]] == ["read_limits"]
    assert not op.logged("Traceback")


def assert_no_internal_error(op: OperatorProcess, run: dict[str, Any]) -> None:
    """The endpoint's failure stayed the endpoint's: no traceback, no quarantine, no key anywhere."""
    history = assert_history_is_gapless(run)
    assert all(h["to"] != "quarantined" for h in history), [h["event"] for h in history]
    assert API_KEY not in json.dumps(run), "the API key is in the run"
    assert not op.logged("Traceback")
    assert not op.logged("InternalError")
    assert not op.logged(API_KEY), "the API key is in the operator's log"


def test_a_broken_model_endpoint_is_a_named_model_error_retried_per_the_policy_then_the_run_completes(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    models: Callable[[dict[str, Any]], ModelServerThread],
    refsystem: ReferenceSystemThread,
) -> None:
    """Issue 30 (6): an HTML page or a non-JSON body with 200 used to be the operator's internal
    error (five tracebacks, then quarantined, naming neither the endpoint nor the reply). Each
    broken reply, once, is now a model error naming the endpoint and the kind of reply: a retry
    window of the policy, after which the fixed endpoint answers and the run completes."""
    op = start_operator("agent-failures", lease_duration=LEASE)
    three = policy(runs, "three-attempts", retry={"maxAttempts": 3, **FAST_RETRY})
    servers = {fault: models(READS_THEN_ANSWERS) for fault in BROKEN_REPLIES}
    names = {}
    for fault, model in servers.items():
        model.inject(fault, times=1)
        names[fault] = runs.create(agent_spec(model, refsystem, three))

    for fault, (reason, kind) in BROKEN_REPLIES.items():
        done = runs.wait_state(names[fault], "completed", "failed", "quarantined", timeout=120)
        assert done["status"]["outcome"]["reason"] == "Completed", (fault, done["status"]["outcome"])
        (window,) = retries(done)
        assert window.startswith(f"model call failed: {reason}: "), window
        assert servers[fault].base_url in window, "the endpoint is named"
        assert kind in window, window
        assert "attempt 2/3 at " in window, window
        assert unsealed(done, done["status"]["outcome"]["result"], ANSWER_LABEL) == ANSWER
        assert servers[fault].calls()["total"] >= 3, "the broken reply, then the two calls of a good run"
        assert_no_internal_error(op, done)
    assert refsystem.counts() == {}


def test_a_model_endpoint_that_stays_broken_is_shown_waiting_for_its_retry_then_fails_naming_it(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    models: Callable[[dict[str, Any]], ModelServerThread],
    refsystem: ReferenceSystemThread,
) -> None:
    """A 401 that echoes the key it was given (as careless servers do), every time: the run waits
    out its retry window (``kubectl agentrun why`` says why), then fails RetriesExhausted with the
    endpoint and the kind of reply named in its outcome and its Event, and the key in none of them."""
    op = start_operator("agent-failures", lease_duration=LEASE)
    slow = policy(runs, "two-slow-attempts", retry={"maxAttempts": 2, "initialBackoff": "8s", "jitter": 0})
    model = models(READS_THEN_ANSWERS)
    model.inject("unauthorized", times=10)
    name = runs.create(agent_spec(model, refsystem, slow))

    waiting = runs.wait_state(name, "waiting_retry", "failed", timeout=90)
    assert waiting["status"]["state"] == "waiting_retry"
    said = kubectl_why.text(kubectl_why.why(runs.custom, runs.namespace, name))
    expected = (
        f"the last attempt failed: ModelAuthFailed: AuthenticationError (HTTP 401) from {model.base_url}"
    )
    assert expected in said, said
    assert 'a JSON error (application/json): "Incorrect API key provided: [redacted]."' in said, said
    assert API_KEY not in said

    failed = runs.wait_state(name, "failed", timeout=90)
    state, reason, message = outcome(failed)
    assert (state, reason) == ("failed", "RetriesExhausted")
    assert message.startswith(
        f"2 attempts failed; last: ModelAuthFailed: AuthenticationError (HTTP 401) from {model.base_url}: "
    ), message
    assert model.calls()["total"] == 2, "one call per attempt"

    def failed_event() -> list[str] | None:  # Events are written after the commit, in the background
        events = [e.message or "" for e in runs.events(name)]
        return events if any(model.base_url in m and "HTTP 401" in m for m in events) else None

    events = eventually(failed_event, 30, "an Event naming the endpoint and the 401")
    assert all(API_KEY not in m for m in events), "the API key is in an Event"
    assert_no_internal_error(op, failed)


# Two calls in one reply (as a server that ignores parallel_tool_calls false sends them): the read,
# and a refund. Told that the refund was not executed, the model answers without it.
TWO_CALLS_AT_ONCE = {
    "model": MODEL,
    "rules": [
        {
            "when": {"notCalled": ["read_limits"]},
            "content": "I will read the limits and refund at once.",
            "toolCalls": [READ_LIMITS, {"name": "refund", "arguments": {"orderId": "A-1042", "amount": 120}}],
        },
        {"when": {"lastToolResultContains": "not executed"}, "content": ANSWER},
    ],
}


def test_a_second_tool_call_in_one_reply_is_told_to_the_model_as_not_executed_and_never_runs(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    models: Callable[[dict[str, Any]], ModelServerThread],
    refsystem: ReferenceSystemThread,
) -> None:
    """Issue 30 (6): the calls after the first used to be dropped silently (the model could believe
    its refund was done). The first runs; the refund is answered "not executed" and never reaches
    the system."""
    op = start_operator("agent-failures", lease_duration=LEASE)
    model = models(TWO_CALLS_AT_ONCE)
    name = runs.create(agent_spec(model, refsystem, policy(runs, "default-policy")))

    done = runs.wait_state(name, "completed", "failed", timeout=90)
    assert done["status"]["outcome"]["reason"] == "Completed", done["status"]["outcome"]
    assert unsealed(done, done["status"]["outcome"]["result"], ANSWER_LABEL) == ANSWER
    first, second = distinct(model)
    assert tool_results(first) == []
    read, refund = tool_results(second)
    assert "maxAmount" in read
    assert json.loads(refund)["status"] == "not executed", refund
    (call,) = [m for m in second["messages"] if m["role"] == "assistant"]
    assert [c["function"]["name"] for c in call["tool_calls"]] == ["read_limits", "refund"]
    (turn,) = done["status"]["checkpoint"]["agent"]["turns"]
    assert (turn["tool"], turn["droppedTools"]) == ("read_limits", ["refund"])
    assert any(
        "not executed (one call per turn): refund" in (h.get("detail") or "")
        for h in done["status"]["history"]
    )
    assert refsystem.counts() == {}, "the refund never reached the system"
    assert not op.logged("Traceback")


# What each broken reply of an endpoint speaking the Messages API is told as.
BROKEN_MESSAGES_REPLIES = {
    "unauthorized": ("ModelAuthFailed", "AuthenticationError (HTTP 401) from "),
    "overloaded": (
        "ModelOverloaded",
        'OverloadedError (HTTP 529) from {url}: a JSON error (application/json): "Overloaded"',
    ),
    "not_json": (
        "ModelReplyNotJson",
        "HTTP 200 with a body that is not JSON although its content type is application/json:"
        ' "upstream connect error',
    ),
}


def test_a_broken_anthropic_messages_endpoint_is_a_named_model_error_retried_then_the_run_completes(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    models: Callable[[dict[str, Any]], ModelServerThread],
    refsystem: ReferenceSystemThread,
) -> None:
    """The same classification on the second protocol (spec.agent.endpoint.protocol:
    anthropic-messages): a 401, a 529 (overloaded) and a body that is not JSON are each a model
    error naming the endpoint and the kind of reply, a retry window of the policy, never the
    operator's internal error; then the endpoint answers and the run completes."""
    op = start_operator("agent-failures", lease_duration=LEASE)
    three = policy(runs, "three-attempts", retry={"maxAttempts": 3, **FAST_RETRY})
    servers = {fault: models(READS_THEN_ANSWERS) for fault in BROKEN_MESSAGES_REPLIES}
    names = {}
    for fault, model in servers.items():
        model.inject(fault, times=1)
        spec = agent_spec(model, refsystem, three)
        spec["agent"]["endpoint"].update(baseUrl=model.base_url_for(MESSAGES), protocol=MESSAGES)
        names[fault] = runs.create(spec)

    for fault, (reason, kind) in BROKEN_MESSAGES_REPLIES.items():
        url = servers[fault].base_url_for(MESSAGES)
        done = runs.wait_state(names[fault], "completed", "failed", "quarantined", timeout=120)
        assert done["status"]["outcome"]["reason"] == "Completed", (fault, done["status"]["outcome"])
        (window,) = retries(done)
        assert window.startswith(f"model call failed: {reason}: "), window
        assert url in window, "the endpoint is named"
        assert kind.format(url=url) in window, window
        assert "attempt 2/3 at " in window, window
        assert unsealed(done, done["status"]["outcome"]["result"], ANSWER_LABEL) == ANSWER
        calls = servers[fault].calls()
        assert calls["total"] >= 3, "the broken reply, then the two calls of a good run"
        assert set(calls["byProtocol"]) == {MESSAGES}, "every call went to /v1/messages"
        assert_no_internal_error(op, done)
    assert not op.logged(API_KEY), "the API key is in the operator's log (the 401 echoes it)"
    assert refsystem.counts() == {}
