"""Sub-agents as tools: a run of an Agent calls two other Agents; each call is a child AgentRun.

Real API server, the operator as a separate process (its own user, the chart's RBAC), the
reference model server (one script for every agent: its rules tell the runs apart by their
objective), the reference system (counts the refund's applications) and the reference MCP server
(counts the ticket closure's). The Agents, policy and RBAC are config/samples/agent-subagents.yaml's.

The coordinator calls ``refunder`` (whose run sends a refund, an ``http.post``) and then
``close_ticket_agent`` (an Agent whose run closes the ticket, a consequential MCP call); each
child answers, and its answer is the coordinator's call result. SIGKILL before and after every
write of record of that tree (the three runs' status commits, the two child creations, the two
ActionRecords' creations and status writes): each child's effect is applied exactly once and the
coordinator completes with both answers.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.engine import child_run_name
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.mcpserver import McpServerThread
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port, metric, scrape

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "config/samples/agent-subagents.yaml"
API_KEY = "sk-test-subagents"
LEASE = 3
FAST_CLAIMS = {"DURABLE_AGENTS_DISPATCH_TIMEOUT": "3"}
REFUND = {"orderId": "A-1042", "amount": 120, "currency": "EUR"}
TICKET = "T-102"
CLOSE = {"id": TICKET, "resolution": "refunded 120 EUR"}
REFUNDED, CLOSED = "REFUNDED-A-1042", "CLOSED-T-102"  # the children's final answers


def call(when: dict[str, Any], tool: str, **arguments: Any) -> dict[str, Any]:
    return {"when": when, "content": f"Next, {tool}.", "toolCalls": [{"name": tool, "arguments": arguments}]}


def answer(when: dict[str, Any], text: str) -> dict[str, Any]:
    return {"when": when, "content": text}


def task(token: str, **more: Any) -> dict[str, Any]:
    return {"userContains": token, **more}


SCRIPT: dict[str, Any] = {
    "model": "scripted-support",
    "rules": [
        # the coordinator: the refund to one sub-agent, the ticket to another, then its answer
        call(
            task("parent-task", notCalled=["refunder"]), "refunder", objective="child-refund: A-1042, 120 EUR"
        ),
        call(
            task("parent-task", called=["refunder"], notCalled=["close_ticket_agent"]),
            "close_ticket_agent",
            objective="child-close: close T-102, refunded",
        ),
        answer(task("parent-task", called=["close_ticket_agent"]), "Both sub-agents answered."),
        call(task("child-refund", notCalled=["refund"]), "refund", **REFUND),
        answer(task("child-refund", called=["refund"]), REFUNDED),
        call(task("child-close", notCalled=["close_ticket"]), "close_ticket", **CLOSE),
        answer(task("child-close", called=["close_ticket"]), CLOSED),
        # a tree: tree-task calls middle, which calls leaf, which asks a person (never answered)
        call(task("tree-task", notCalled=["middle"]), "middle", objective="tree-middle: go on"),
        call(task("tree-middle", notCalled=["leaf"]), "leaf", objective="tree-leaf: ask"),
        call(task("tree-leaf", notCalled=["ask"]), "ask", question="Wait here?"),
        # a cycle: ping calls pong, which calls ping
        call(task("cycle-task", notCalled=["pong"]), "pong", objective="cycle-pong: call back"),
        call(task("cycle-pong", notCalled=["ping"]), "ping", objective="cycle-ping: again"),
        answer(task("cycle-task", called=["pong"]), "pong did not answer"),
        # a fan-out over the bound: fanner may start one sub-agent run, and calls two
        call(task("fan-task", notCalled=["echo"]), "echo", objective="fan-echo: one"),
        answer(task("fan-echo"), "echoed"),
        call(task("fan-task", called=["echo"]), "echo", objective="fan-echo: two"),
    ],
}


def sample() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(SAMPLE.read_text()) if doc]


def sample_run() -> dict[str, Any]:
    spec: dict[str, Any] = next(doc for doc in sample() if doc["kind"] == "AgentRun")["spec"]
    return spec


def agent(name: str, prompt: str, **spec: Any) -> dict[str, Any]:
    body = {"modelRef": "support-model", "systemPrompt": {"inline": prompt}, **spec}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Agent", "metadata": {"name": name}, "spec": body}


def sub(name: str) -> dict[str, Any]:
    return {"agentRef": name, "description": f"Hand work to {name}."}


# The bad-input scenarios' Agents (the recovery scenario uses the sample's).
EXTRA_AGENTS = [
    agent("tree", "Hand work down.", subAgents=[sub("middle")]),
    agent("middle", "Hand work down.", subAgents=[sub("leaf")]),
    agent("leaf", "Ask a person.", tools=[{"name": "ask", "description": "Ask.", "askHuman": {}}]),
    agent("ping", "Call pong.", subAgents=[sub("pong")]),
    agent("pong", "Call ping.", subAgents=[sub("ping")]),
    agent("fanner", "Call echo.", subAgents=[sub("echo")], limits={"maxSubAgents": 1}),
    agent("echo", "Echo."),
]


@pytest.fixture
def model() -> Iterator[ModelServerThread]:
    with ModelServerThread(SCRIPT, api_key=API_KEY) as server:
        yield server


@pytest.fixture
def tickets() -> Iterator[McpServerThread]:
    with McpServerThread() as server:
        yield server


@pytest.fixture
def support(
    kube: KubeEnv,
    runs: Runs,
    namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    tickets: McpServerThread,
) -> str:
    """The sample's objects but its run, pointed at this test's reference servers."""
    core, rbac = client.CoreV1Api(kube.api), client.RbacAuthorizationV1Api(kube.api)
    for doc in sample():
        kind, body = doc["kind"], {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
        if kind == "Secret":
            core.create_namespaced_secret(namespace, {**body, "stringData": {"apiKey": API_KEY}})
        elif kind == "Role":
            rbac.create_namespaced_role(namespace, body)
        elif kind == "RoleBinding":
            body["subjects"] = [{**s, "namespace": namespace} for s in body["subjects"]]
            rbac.create_namespaced_role_binding(namespace, body)
        elif kind in ("AgentPolicy", "ModelConfig", "Agent"):
            spec = body["spec"]
            if kind == "ModelConfig":
                spec["baseUrl"] = model.base_url
            for tool in spec.get("tools", []) if kind == "Agent" else []:
                url = f"{refsystem.url}/effects"
                tool["effect"]["target"] = {"url": url, "queryUrl": url}
            for server in spec.get("mcpServers", []) if kind == "Agent" else []:
                server["url"] = tickets.url
            plural = {"AgentPolicy": "agentpolicies", "ModelConfig": "modelconfigs", "Agent": "agents"}[kind]
            runs.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
    for body in EXTRA_AGENTS:
        runs.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agents", body)
    return namespace


def run_of(runs: Runs, agent_name: str, objective: str, name: str | None = None) -> str:
    return runs.create({**sample_run(), "agentRef": agent_name, "objective": objective}, name=name)


def turns(run: dict[str, Any]) -> list[tuple[str, str]]:
    return [(t["tool"], t["outcome"]) for t in run["status"]["checkpoint"]["agent"]["turns"]]


def tool_results(model: ModelServerThread, token: str) -> list[str]:
    """The tool results in the last request of the run whose objective holds ``token``."""
    requests: list[dict[str, Any]] = model.calls()["requests"]  # type: ignore[assignment]
    mine = [
        r
        for r in requests
        if any(token in str(m.get("content")) for m in r["messages"] if m["role"] == "user")
    ]
    assert mine, f"no request of the run {token!r}"
    return [str(m.get("content")) for m in mine[-1]["messages"] if m["role"] == "tool"]


def assert_tree_done(
    runs: Runs,
    name: str,
    refsystem: ReferenceSystemThread,
    tickets: McpServerThread,
    model: ModelServerThread,
) -> None:
    """The coordinator completed with both answers; each child's effect applied exactly once."""
    done = runs.get(name)
    assert done["status"]["state"] == "completed", done["status"]
    children = [child_run_name(name, f"agent-{i}") for i in (0, 1)]
    recorded = [(c["name"], c["outcome"]) for c in done["status"]["checkpoint"]["children"]]
    assert recorded == [(children[0], "completed"), (children[1], "completed")]
    assert turns(done) == [("refunder", "succeeded"), ("close_ticket_agent", "succeeded")]
    results = tool_results(model, "parent-task")
    assert len(results) == 2, results
    assert REFUNDED in results[0], results
    assert CLOSED in results[1], results
    parent_uid = done["metadata"]["uid"]
    for child_name, agent_name in zip(children, ("refunder", "closer"), strict=True):
        child = runs.get(child_name)
        assert child["status"]["state"] == "completed"
        assert child["spec"]["agentRef"] == agent_name
        assert child["spec"]["parentRef"] == {"name": name, "uid": parent_uid}
        assert [o["uid"] for o in child["metadata"]["ownerReferences"]] == [parent_uid]
        # the parent's authority, no more: its ServiceAccount and its policy
        assert child["spec"]["serviceAccountName"] == done["spec"]["serviceAccountName"]
        assert child["spec"]["policyRef"] == done["spec"]["policyRef"]
        assert child["metadata"]["annotations"]["durable-agents.io/agent-path"] == "coordinator"
    assert list(refsystem.counts().values()) == [1], f"the refund applied once: {refsystem.counts()}"
    assert list(tickets.counts().values()) == [1], f"the ticket closed once: {tickets.counts()}"
    assert (refsystem.duplicates(), tickets.duplicates()) == ([], [])
    all_runs = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentruns")["items"]
    mine = [r["metadata"]["name"] for r in all_runs if r["metadata"]["name"].startswith(name)]
    assert sorted(mine) == sorted([name, *children]), f"exactly two children, never a third: {mine}"


def writes_counted(port: int) -> int:
    """The operator's successful writes of record: run status updates, child creations,
    ActionRecord creations and status updates, less the updates refused with 409."""
    text = scrape(port)
    written = sum(
        metric(text, f'durable_agents_api_writes_total{{resource="{resource}",verb="{verb}"}}', default=0)
        for resource, verb in (
            ("agentruns/status", "update"),
            ("agentruns", "create"),
            ("actionrecords", "create"),
            ("actionrecords/status", "update"),
        )
    )
    refused = sum(
        metric(text, f'durable_agents_commit_conflicts_total{{resource="{r}"}}', default=0)
        for r in ("agentruns", "actionrecords")
    )
    return int(written - refused)


def final_count(port: int) -> int:
    """The writes counted once the count stood still for a moment (the metric lags the watch)."""
    seen: list[int] = []

    def settled() -> int | None:
        seen.append(writes_counted(port))
        return seen[-1] if len(seen) > 5 and len(set(seen[-5:])) == 1 else None

    return eventually(settled, Within.COMMIT, "the operator's count of writes to settle", interval=0.2)


# The writes of record of the clean tree, as test_two_sub_agents_complete... counts them.
WRITES = 13
POINTS = [(phase, nth) for phase in ("before", "after") for nth in range(1, WRITES + 1)]


def test_two_sub_agents_complete_and_the_parent_gets_both_answers(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    support: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    tickets: McpServerThread,
) -> None:
    """The clean tree the kill points below are taken from (its writes of record, counted)."""
    port = free_port()
    op = start_operator("clean", LEASE, DURABLE_AGENTS_METRICS_PORT=str(port))
    name = run_of(runs, "coordinator", sample_run()["objective"], name="clean")
    waited = eventually(
        lambda: (runs.get(name).get("status") or {}).get("waitingFor", "").startswith("child:") or None,
        Within.RUN,
        "the coordinator to wait for its first sub-agent",
    )
    assert waited
    try:
        runs.wait_state(name, "completed", timeout=Within.RUN)
    except TimeoutError as err:  # say where the tree stands: each run's state and what it waits for
        where = [(r["metadata"]["name"], (r.get("status") or {}).get("waitingFor")) for r in all_runs(runs)]
        raise AssertionError(f"{err}; {where}\n{op.log_tail(80)}") from None
    assert_tree_done(runs, name, refsystem, tickets, model)
    history = [h["event"] for h in runs.get(name)["status"]["history"]]
    waits = (history.count("external_awaited"), history.count("external_received"))
    assert waits == (2, 2), history
    # Every run's last write is its completion, seen above: the count is final (the metric lags
    # the watch a little).
    counted = final_count(port)
    print(f"\nclean tree: {counted} writes of record")
    assert counted == WRITES, f"the tree's writes changed: {counted}, update WRITES (the kill points)"
    assert not op.logged("Traceback"), op.log_tail()


@pytest.mark.parametrize(("phase", "nth"), POINTS, ids=[f"{p}-{n}" for p, n in POINTS])
def test_sigkill_at_every_write_of_a_tree_of_sub_agents(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    support: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    tickets: McpServerThread,
    phase: str,
    nth: int,
) -> None:
    victim = start_operator("victim", LEASE, DURABLE_AGENTS_TEST_KILL_AT=f"{phase}:{nth}", **FAST_CLAIMS)
    name = run_of(runs, "coordinator", sample_run()["objective"], name=f"{phase}-{nth}")
    assert victim.wait_killed(Within.RUN) == -signal.SIGKILL, victim.log_tail()
    rescuer = start_operator("rescuer", LEASE, **FAST_CLAIMS)
    runs.wait_state(name, "completed", timeout=Within.RUN)
    assert_tree_done(runs, name, refsystem, tickets, model)
    assert not rescuer.logged("Traceback"), rescuer.log_tail()


def test_cancelling_the_parent_cancels_its_sub_agent_runs_down_the_tree(
    start_operator: Callable[..., OperatorProcess], runs: Runs, support: str
) -> None:
    start_operator("cancel", LEASE)
    name = run_of(runs, "tree", "tree-task: hand it down")
    middle = child_run_name(name, "agent-0")
    leaf = child_run_name(middle, "agent-0")
    runs.wait_state(leaf, "waiting_input", timeout=Within.RUN)
    assert runs.get(name)["status"]["waitingFor"] == f"child:{middle}", "the parent waits, saying for what"
    assert runs.get(leaf)["metadata"]["annotations"]["durable-agents.io/agent-path"] == "tree/middle"
    runs.patch_spec(name, {"cancellations": {"stop": {"scope": "task", "reason": "no longer needed"}}})
    for each in (name, middle, leaf):
        runs.wait_state(each, "canceled", timeout=Within.RUN)


def test_a_sub_agent_cycle_fails_the_call_saying_so(
    start_operator: Callable[..., OperatorProcess], runs: Runs, support: str, model: ModelServerThread
) -> None:
    op = start_operator("cycle", LEASE)
    name = run_of(runs, "ping", "cycle-task: start")
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    pong = runs.get(child_run_name(name, "agent-0"))
    outcome = pong["status"]["outcome"]
    assert (pong["status"]["state"], outcome["reason"]) == ("failed", "SubAgentCycle")
    assert "ping → pong → ping" in outcome["message"]
    assert turns(done) == [("pong", "failed")], "the parent's model is told its sub-agent failed"
    assert any("SubAgentCycle" in r for r in tool_results(model, "cycle-task"))
    assert not any(r["metadata"]["name"].startswith(pong["metadata"]["name"] + "-") for r in all_runs(runs))
    assert not op.logged("Traceback"), op.log_tail()


def test_a_fan_out_over_the_bound_fails_the_run_saying_so(
    start_operator: Callable[..., OperatorProcess], runs: Runs, support: str
) -> None:
    start_operator("fan", LEASE)
    name = run_of(runs, "fanner", "fan-task: twice")
    failed = runs.wait_state(name, "failed", timeout=Within.RUN)
    outcome = failed["status"]["outcome"]
    assert outcome["reason"] == "SubAgentFanOutExceeded", outcome
    assert "maxSubAgents" in outcome["message"]
    started = [r["metadata"]["name"] for r in all_runs(runs) if r["metadata"]["name"].startswith(name + "-")]
    assert started == [child_run_name(name, "agent-0")], "one child, never the second"


def all_runs(runs: Runs) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = runs.custom.list_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentruns"
    )["items"]
    return items


@pytest.mark.local_plane("webhook")
def test_an_agent_closing_a_cycle_of_sub_agents_is_refused_at_admission_naming_the_field(
    start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    op = start_operator("webhook", LEASE, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()
    create = runs.custom.create_namespaced_custom_object
    create(GROUP, VERSION, runs.namespace, "agents", agent("alpha", "Call beta.", subAgents=[sub("beta")]))
    create(GROUP, VERSION, runs.namespace, "agents", agent("beta", "Call gamma.", subAgents=[sub("gamma")]))
    closing = agent("gamma", "Call delta and alpha.", subAgents=[sub("delta"), sub("alpha")])
    with pytest.raises(client.ApiException) as err:
        create(GROUP, VERSION, runs.namespace, "agents", closing)
    assert err.value.status == 403, err.value.body
    body = str(err.value.body)
    assert "spec.subAgents[1].agentRef" in body, body
    assert "gamma → alpha → beta → gamma" in body, body
    create(GROUP, VERSION, runs.namespace, "agents", agent("gamma", "Call delta.", subAgents=[sub("delta")]))
    with pytest.raises(client.ApiException) as err:  # an update that closes it is refused too
        runs.custom.patch_namespaced_custom_object(
            GROUP, VERSION, runs.namespace, "agents", "gamma", {"spec": {"subAgents": [sub("beta")]}}
        )
    assert "gamma → beta → gamma" in str(err.value.body), err.value.body


@pytest.mark.local_plane("webhook")
def test_two_sub_agents_complete_through_the_admission_webhook(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    support: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    tickets: McpServerThread,
) -> None:
    """The children are created as the parent's ServiceAccount through the webhook (which stamps
    and seals them as any run): they still are the operator's children, with their stamped path."""
    op = start_operator("webhook", LEASE, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()
    name = run_of(runs, "coordinator", sample_run()["objective"], name="hooked")
    runs.wait_state(name, "completed", timeout=Within.RUN)
    assert_tree_done(runs, name, refsystem, tickets, model)
    assert not op.logged("Traceback"), op.log_tail()


def test_a_forged_answer_of_a_sub_agent_is_never_given_to_the_parents_model(
    start_operator: Callable[..., OperatorProcess],
    kube: KubeEnv,
    runs: Runs,
    support: str,
    model: ModelServerThread,
) -> None:
    """Someone who may write a sub-agent run's status writes it ended with an answer: the child's
    status stamp does not verify, so the parent waits on (its worker quarantines the child) and its
    model never sees that answer; the parent's own cancel still ends the tree."""
    start_operator("forged", LEASE)
    name = run_of(runs, "tree", "tree-task: hand it down")
    middle = child_run_name(name, "agent-0")
    runs.wait_state(child_run_name(middle, "agent-0"), "waiting_input", timeout=Within.RUN)
    forged = {"state": "completed", "outcome": {"reason": "Completed", "result": "FORGED-ANSWER"}}
    client.CustomObjectsApi(kube.api).patch_namespaced_custom_object_status(
        GROUP, VERSION, runs.namespace, "agentruns", middle, {"status": forged}
    )
    runs.wait_state(middle, "quarantined", timeout=Within.COMMIT)  # its worker: IntegrityFailed
    parent = runs.get(name)
    assert parent["status"]["state"] == "waiting_external", parent["status"]
    assert turns(parent) == [("middle", "pending")], "the call is not settled by the forged end"
    requests: list[dict[str, Any]] = model.calls()["requests"]  # type: ignore[assignment]
    assert not any("FORGED-ANSWER" in str(r) for r in requests), "the forged answer reached a model"
    # The parent's cancel does not act on a child it does not believe; a person cancels that one.
    stop = {"cancellations": {"stop": {"scope": "task", "reason": "forged child"}}}
    runs.patch_spec(name, stop)
    runs.patch_spec(middle, stop)
    for each in (name, middle):
        runs.wait_state(each, "canceled", timeout=Within.RUN)
    done = runs.get(name)
    assert [(c["outcome"], c["reason"]) for c in done["status"]["checkpoint"]["children"]] == [
        ("canceled", "Canceled")
    ], "the child's real, stamped end"
