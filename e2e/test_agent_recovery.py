"""Recovery of a model-driven run: SIGKILL before and after every write of record and inside model
calls; and a stale checkpoint whose replay makes the model propose other arguments than approved.

The run makes 8 model calls: read the refund limits, read the order (two read tools, two
ConfigMaps), look the support ticket up (a read-only MCP tool), propose a refund the tool's schema
refuses (the model is told why), propose it again correctly (a consequential ``http.post``:
approved, then sent once), close the ticket (a consequential MCP tool, ``mcp.call``: approved, then
applied once; its server's query tool reconciles a call whose answer a kill lost), ask a person
whether to tell the customer (``askHuman``), then answer. Its policy allows 2 model calls between
two writes, so the worker also writes in the middle of the reads, not only at the intents, the
waits and the end.

A model call is not a commit: a crash repeats the model calls made since the run's last status
write (counted at the model server), never an effect (counted at the reference system).
"""

from __future__ import annotations

import copy
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
import yaml
from kubernetes import client, watch

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import unsealed
from durable_agents_testkit.mcpserver import McpServerThread
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless
from durable_agents_testkit.scrape import free_port, metric, scrape

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "config/samples/agentrun-model.yaml"
API_KEY = "sk-test-agent-recovery"
LEASE = 3  # seconds: takeover soon after a kill (a 2s lease lapsed often on a loaded 2-core machine)
# A dispatch answer later than 3 s is an unknown outcome, so a claim lasts 7 s (11 s by default):
# a rescuer waits that long for the first claim of an effect the victim died sending.
FAST_CLAIMS = {"DURABLE_AGENTS_DISPATCH_TIMEOUT": "3"}
PER_BOUNDARY = 2  # the policy's maxModelCallsPerBoundary
ANSWER = "yes-tell-the-customer"  # the person's answer to the model's question
ENDED_BADLY = ("failed", "expired", "quarantined", "canceled")

ORDER = {"orderId": "A-1042", "amount": "120", "currency": "EUR", "condition": "damaged on arrival"}
REFUND = {"orderId": "A-1042", "amount": 120, "currency": "EUR"}
BAD_REFUND = {**REFUND, "currency": "USD"}
TICKET = "T-102"  # the reference MCP server's "Refund order 7731"
CLOSE = {"id": TICKET, "resolution": "refunded 120 EUR"}


def rule(when: dict[str, Any], tool: str, **arguments: Any) -> dict[str, Any]:
    """A rule of the scripted model: when ``when`` holds, call ``tool`` with ``arguments``."""
    return {"when": when, "content": f"Next, {tool}.", "toolCalls": [{"name": tool, "arguments": arguments}]}


# The model (see durable_agents_testkit.modelserver): the first rule whose condition holds answers.
SCRIPT: dict[str, Any] = {
    "model": "scripted-refunds",
    "rules": [
        rule({"notCalled": ["read_limits"]}, "read_limits", name="refund-limits"),
        rule({"called": ["read_limits"], "notCalled": ["read_order"]}, "read_order", name="order-a-1042"),
        rule({"called": ["read_order"], "notCalled": ["lookup_ticket"]}, "lookup_ticket", id=TICKET),
        # a bad call: the tool's schema allows EUR only; the refusal is the model's next input
        rule({"called": ["lookup_ticket"], "notCalled": ["refund"]}, "refund", **BAD_REFUND),
        rule({"called": ["refund"], "lastToolResultContains": "invalid arguments"}, "refund", **REFUND),
        rule({"called": ["refund"], "notCalled": ["close_ticket"]}, "close_ticket", **CLOSE),
        rule({"called": ["close_ticket"], "notCalled": ["ask_human"]}, "ask_human", question="Tell them?"),
        {"when": {"called": ["ask_human"]}, "content": "Refunded 120 EUR for order A-1042; customer told."},
    ],
}
MODEL_CALLS = 8  # one per rule
TURNS = [  # the checkpoint's turns: (tool, outcome); the final answer is no turn
    *[(tool, "succeeded") for tool in ("read_limits", "read_order", "lookup_ticket")],
    ("refund", "refused"),
    *[(tool, "succeeded") for tool in ("refund", "close_ticket", "ask_human")],
]
# The writes of record of a clean run, in order, as test_clean_run measures them: what is written
# (a run status commit, an ActionRecord created, its status written by the dispatcher) and, for a
# run write, the model calls committed by then (its checkpoint's modelCallsTotal).
WRITES: list[tuple[str, int | None]] = [
    ("run", 2),  # accepted; read_limits proposed and read; read_order proposed and read: a third
    # call would pass the bound of 2, so the write comes first
    ("run", 4),  # lookup_ticket proposed and asked (MCP); the bad refund refused
    ("run", 5),  # the refund proposed: approval_requested (a wait)
    ("run", 5),  # approval_decided, revalidated, the refund's intent (external_awaited)
    ("record", None),  # the refund's ActionRecord, created under the dispatcher's first claim
    ("record", None),  # its status: applied once at the reference system
    ("run", 6),  # external_received, revalidated; close_ticket proposed: approval_requested
    ("run", 6),  # approval_decided, revalidated, the closure's intent (mcp.call: external_awaited)
    ("record", None),  # the closure's ActionRecord
    ("record", None),  # its status: applied once at the MCP server
    ("run", 7),  # external_received, revalidated; ask_human proposed; input_requested (a wait)
    ("run", 8),  # input_received, revalidated; the final answer: succeeded
]
POINTS = [(phase, nth) for phase in ("before", "after") for nth in range(1, len(WRITES) + 1)]


def sample() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(SAMPLE.read_text()) if doc]


def install(kube: KubeEnv, runs: Runs, namespace: str) -> None:
    """The sample's prompt, limits, key, RBAC and policy, plus the order ConfigMap (readable by the
    run's account) and the bound of PER_BOUNDARY model calls between two writes."""
    core = client.CoreV1Api(kube.api)
    rbac = client.RbacAuthorizationV1Api(kube.api)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "order-a-1042"}, "data": ORDER})
    for doc in sample():
        kind, body = doc["kind"], {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
        if kind == "ConfigMap":
            core.create_namespaced_config_map(namespace, body)
        elif kind == "Secret":
            body["stringData"] = {"apiKey": API_KEY}
            core.create_namespaced_secret(namespace, body)
        elif kind == "Role":
            body["rules"][0]["resourceNames"].append("order-a-1042")
            rbac.create_namespaced_role(namespace, body)
        elif kind == "RoleBinding":
            body["subjects"] = [{**s, "namespace": namespace} for s in body["subjects"]]
            rbac.create_namespaced_role_binding(namespace, body)
        elif kind == "AgentPolicy":
            body["spec"]["agentLimits"] = {"maxModelCallsPerBoundary": PER_BOUNDARY}
            # The ticket server is not trusted (its URL is per scenario): the policy's own tier
            # makes its lookup a read, called between commits.
            body["spec"]["tiers"]["mcp:tickets/lookup_ticket"] = "read-only"
            runs.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", body)


@dataclass
class Servers:
    """A scenario's own model server and the two systems its effects are counted at."""

    model: ModelServerThread
    refsystem: ReferenceSystemThread
    tickets: McpServerThread
    protocol: str = "openai-chat"


def agent_spec(servers: Servers) -> dict[str, Any]:
    """The sample run, with a second read tool (the order), the ticket server's two tools (the
    query tool declared for the consequential one) and a question for a person."""
    spec: dict[str, Any] = next(doc for doc in sample() if doc["kind"] == "AgentRun")["spec"]
    spec["agent"]["endpoint"].update(
        baseUrl=servers.model.base_url_for(servers.protocol), protocol=servers.protocol
    )
    tools = spec["agent"]["tools"]
    for tool in tools:
        if "effect" in tool:
            url = f"{servers.refsystem.url}/effects"
            tool["effect"]["target"] = {"url": url, "queryUrl": url}
    read = {"apiVersion": "v1", "kind": "ConfigMap"}
    tools.append({"name": "read_order", "description": "Read an order by name.", "read": read})
    tools.append({"name": "ask_human", "description": "Ask a person.", "askHuman": {"expiresIn": "1h"}})
    mcp = {"name": "tickets", "url": servers.tickets.url, "tools": ["lookup_ticket", "close_ticket"]}
    spec["agent"]["mcpServers"] = [{**mcp, "queryTools": {"close_ticket": "ticket_closure_status"}}]
    return spec


@pytest.fixture
def protocol() -> str:
    """The model endpoint's protocol; the tests of crashes inside model calls run on both."""
    return "openai-chat"


@pytest.fixture
def servers(refsystem: ReferenceSystemThread, protocol: str) -> Iterator[Servers]:
    """Per scenario: a fresh model server and ticket server (each counts from zero)."""
    with ModelServerThread(SCRIPT, api_key=API_KEY) as model, McpServerThread() as tickets:
        yield Servers(model, refsystem, tickets, protocol)


@pytest.fixture
def agent_namespace(kube: KubeEnv, namespace: str, runs: Runs) -> str:
    install(kube, runs, namespace)
    return namespace


def approve(runs: Runs, name: str, request: dict[str, Any]) -> None:
    decision = {"digest": request["digest"], "decision": "approve"}
    runs.patch_spec(name, {"approvals": {request["requestId"]: decision}})


def drive(
    runs: Runs,
    name: str,
    within: float,
    until: Callable[[], bool] = lambda: False,
    approved: list[dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """Approve each pending request (its own ID and digest; appended to ``approved``) and answer
    the model's question as soon as the run waits for them; the completed run, or None as soon as
    ``until()`` holds (say, the operator died)."""

    def driven() -> tuple[dict[str, Any] | None] | None:
        if until():
            return (None,)
        run = runs.get(name)
        status, spec = run.get("status") or {}, run["spec"]
        state = status.get("state")
        if state == "completed":
            return (run,)
        if state in ENDED_BADLY:
            raise AssertionError(f"run {name} ended {state}: {status.get('outcome')}")
        request = status.get("approvalRequest")
        if state == "waiting_approval" and request and request["requestId"] not in spec.get("approvals", {}):
            approve(runs, name, request)
            (approved if approved is not None else []).append(request)
        asked = (status.get("waitingFor") or "").removeprefix("input:")
        if state == "waiting_input" and asked not in spec.get("answers", {}):
            runs.patch_spec(name, {"answers": {asked: ANSWER}})
        return None

    try:
        return eventually(driven, within, f"run {name} to complete")[0]
    except TimeoutError as err:
        raise TimeoutError(f"{err}: {runs.get(name).get('status')}") from None


def applied(refsystem: ReferenceSystemThread, run: dict[str, Any]) -> list[int]:
    """How often each of this run's effects was applied at the reference system."""
    prefix = run["status"]["runId"] + "/"
    return [n for key, n in refsystem.counts().items() if key.startswith(prefix)]


def assert_effects_once(servers: Servers, run: dict[str, Any], where: str) -> None:
    """The refund and the ticket's closure each applied exactly once (counted at their servers),
    each under its own approval."""
    assert applied(servers.refsystem, run) == [1], f"{where}: the refund must be applied exactly once"
    closed, tickets = servers.tickets.counts(), servers.tickets
    assert list(closed.values()) == [1], f"{where}: close_ticket must be applied exactly once: {closed}"
    assert (tickets.duplicates(), tickets.ticket(TICKET)["status"]) == ([], "closed"), where
    approvals = {a["requestId"]: a.get("decision") for a in run["status"]["checkpoint"]["approvals"]}
    assert list(approvals.values()) == ["approved"] * 2, f"{where}: two requests, each approved: {approvals}"


def model_turns(run: dict[str, Any]) -> list[tuple[str, str]]:
    return [(t["tool"], t["outcome"]) for t in run["status"]["checkpoint"]["agent"]["turns"]]


def call_index(request: dict[str, Any]) -> int:
    """Which model call of the run a request is: the system prompt and the objective, then two
    messages (the call, its result) per earlier turn."""
    return (len(request["messages"]) - 2) // 2 + 1


def requests_since(model: ModelServerThread, total_before: int) -> tuple[int, list[int]]:
    """The model server's total now, and the call index of each request since ``total_before``."""
    calls = model.calls()
    since = calls["total"] - total_before
    return calls["total"], [call_index(r) for r in calls["requests"][len(calls["requests"]) - since :]]


# --- the writes of record of a clean run ---------------------------------------------------------


class WriteLog:
    """Watches a namespace's AgentRuns and ActionRecords and keeps every change in etcd's order (the
    resourceVersions of one etcd are its revisions): what each write of record stored."""

    def __init__(self, kube: KubeEnv, namespace: str) -> None:
        self.custom = kube.custom()
        self.namespace = namespace
        self.seen: list[tuple[int, str, str, str, dict[str, Any]]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._watches: list[watch.Watch] = []

    def __enter__(self) -> WriteLog:
        for plural in ("agentruns", "actionrecords"):
            listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)
            stream = watch.Watch()
            self._watches.append(stream)
            since = listed["metadata"]["resourceVersion"]
            threading.Thread(target=self._follow, args=(stream, plural, since), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in self._watches:
            stream.stop()

    def _follow(self, stream: watch.Watch, plural: str, since: str) -> None:
        listing = (self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, plural)
        try:
            for event in stream.stream(*listing, resource_version=since, timeout_seconds=int(Within.SETTLE)):
                meta, status = event["object"]["metadata"], event["object"].get("status") or {}
                with self._lock:
                    self.seen.append(
                        (int(meta["resourceVersion"]), plural, event["type"], meta["name"], status)
                    )
        except Exception as err:  # the API server went away; it matters only if writes are missing
            self.errors.append(f"{plural}: {err!r}")

    def writes(self, run: str) -> list[tuple[str, dict[str, Any]]]:
        """The run's status commits and its ActionRecords' creations and status writes, in order:
        ("run" or "record", the status stored)."""
        with self._lock:
            seen = sorted(self.seen)
        out: list[tuple[str, dict[str, Any]]] = []
        last: dict[str, dict[str, Any]] = {}
        for _, plural, kind, name, status in seen:
            if plural == "agentruns" and name != run:
                continue
            what = "run" if plural == "agentruns" else "record"
            if (kind == "ADDED" and what == "record") or (
                kind == "MODIFIED" and status != last.get(name, {})
            ):
                out.append((what, status))
            last[name] = status
        return out


def committed_calls(status: dict[str, Any]) -> int:
    agent = (status.get("checkpoint") or {}).get("agent") or {}
    return int(agent.get("modelCallsTotal", 0))


def writes_counted(port: int) -> int:
    """The operator's successful writes of record, by its own metrics: run status updates,
    ActionRecord creations and status updates, less the updates refused with 409."""
    text = scrape(port)
    written = sum(
        metric(text, f'durable_agents_api_writes_total{{resource="{resource}",verb="{verb}"}}', default=0)
        for resource, verb in (
            ("agentruns/status", "update"),
            ("actionrecords", "create"),
            ("actionrecords/status", "update"),
        )
    )
    refused = sum(
        metric(text, f'durable_agents_commit_conflicts_total{{resource="{r}"}}', default=0)
        for r in ("agentruns", "actionrecords")
    )
    return int(written - refused)


def test_clean_run_writes_and_model_calls_per_boundary(
    start_operator: Callable[..., OperatorProcess],
    kube: KubeEnv,
    runs: Runs,
    agent_namespace: str,
    servers: Servers,
) -> None:
    """The clean run the kill points below are taken from: its writes of record (as a watch sees
    them, as many as the operator counts, and no more: a kill before one more never fires)."""
    port = free_port()
    beyond = f"before:{len(WRITES) + 1}"
    op = start_operator(
        "clean", LEASE, DURABLE_AGENTS_METRICS_PORT=str(port), DURABLE_AGENTS_TEST_KILL_AT=beyond
    )
    with WriteLog(kube, runs.namespace) as log:
        name = runs.create(agent_spec(servers), name="clean")
        approved: list[dict[str, Any]] = []
        done = drive(runs, name, Within.RUN, approved=approved)
        assert done is not None

        def all_seen() -> list[tuple[str, dict[str, Any]]] | None:
            """The writes once the watch saw the last (the run completed) and the operator counted
            as many (each lags the other a little)."""
            seen = log.writes(name)
            last = seen[-1][1].get("state") if seen else None
            return seen if last == "completed" and len(seen) == writes_counted(port) else None

        try:
            writes = eventually(all_seen, Within.COMMIT, "the watch and the metrics to agree")
        except TimeoutError as err:
            raise TimeoutError(f"{err}; watch errors: {log.errors}") from None
    assert op.alive, f"the operator wrote more than {len(WRITES)} times: {op.log_tail()}"
    measured = [(what, committed_calls(status) if what == "run" else None) for what, status in writes]
    per_write = [calls for _, calls in measured if calls is not None]
    per_boundary = [b - a for a, b in zip([0, *per_write], per_write, strict=False)]
    asked = servers.model.calls()["total"]
    print(f"\nclean run: {len(writes)} writes of record ({len(per_write)} of the run's status)")
    for k, ((what, calls), (_, status)) in enumerate(zip(measured, writes, strict=True), 1):
        print(f"  write {k}: {what} {status.get('state')} v{status.get('stateVersion', '-')} calls={calls}")
    print(f"  model calls committed per status write: {per_boundary}; {asked} made in all")
    assert measured == WRITES, "the run's writes changed: update WRITES (the kill points follow it)"
    assert max(per_boundary) <= PER_BOUNDARY, "the policy's bound on model calls between two writes"
    assert model_turns(done) == TURNS
    assert done["status"]["checkpoint"]["agent"]["modelCallsTotal"] == MODEL_CALLS
    assert_effects_once(servers, done, "clean")
    assert [h["event"] for h in assert_history_is_gapless(done)] == CLEAN_EVENTS
    mcp = {"server": "tickets", "url": servers.tickets.url, "tool": "close_ticket"}
    targets = [(r["effect"], r["target"]) for r in approved]
    assert targets == [("http.post", ANY), ("mcp.call", {**mcp, "queryTool": "ticket_closure_status"})]


# --- SIGKILL at every write and inside model calls -----------------------------------------------


def committed_by(writes: int) -> int:
    """Model calls committed by the first ``writes`` writes of a clean run."""
    return max((calls or 0 for _, calls in WRITES[:writes]), default=0)


@dataclass
class Victim:
    """An operator killed at a known point, and what the clean run's profile says it had done by
    then: the model calls it had made (the last one maybe in flight) and those committed."""

    process: OperatorProcess
    made: int
    committed: int
    total_before: int  # the model server's count when the run was created


# An approved effect's transitions, from its request to its outcome.
APPROVED = ["approval_requested", "approval_decided", "revalidated", "external_awaited", "external_received"]
CLEAN_EVENTS = [
    "accepted",
    *["step_completed"] * 8,  # 4 proposals, 3 reads (the third an MCP tool's), 1 refusal
    *APPROVED,  # the refund
    *["revalidated", "step_completed", *APPROVED],  # close_ticket proposed, then the same
    *["revalidated", "step_completed", "input_requested", "input_received", "revalidated", "succeeded"],
]


# What a worker logs when it throws a computed batch away (its model calls are asked again): the
# region had no live leader (its lease lapsed on a loaded machine), a 409, the shard moved on.
THROWN_AWAY = ("not committed: region", "refused (409", "moved on; this process")


def recover(
    victim: Victim,
    where: str,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    name: str,
    servers: Servers,
) -> None:
    """With the victim dead: start a rescuer, drive the run to completion and check it."""
    total, by_victim = requests_since(servers.model, victim.total_before)
    committed = committed_calls(runs.get(name).get("status") or {})  # what the victim left
    assert (max(by_victim, default=0), committed) == (victim.made, victim.committed), (
        f"{where}: the victim was not killed where expected: it asked {by_victim}, committed "
        f"{committed}\n{victim.process.log_tail()}"
    )
    rescuer = start_operator("rescuer", LEASE, **FAST_CLAIMS)
    done = drive(runs, name, Within.RUN)
    assert done is not None
    # Checked before the stop: kopf may log a traceback of its watch's teardown while stopping.
    failed_in_run, tail = rescuer.logged("Traceback"), rescuer.log_tail()
    rescuer.stop()
    _, by_rescuer = requests_since(servers.model, total)

    assert_effects_once(servers, done, where)
    history = assert_history_is_gapless(done)
    assert [h["event"] for h in history] == CLEAN_EVENTS, f"{where}: a transition repeated or went missing"
    assert model_turns(done) == TURNS, where
    assert done["status"]["checkpoint"]["agent"]["modelCallsTotal"] == MODEL_CALLS, where
    victims = [h for h in history if h["holder"] == victim.process.identity]
    assert history[: len(victims)] == victims, f"{where}: the victim's transitions come first"
    assert all(h["holder"] == rescuer.identity for h in history[len(victims) :]), where
    # The victim asked its calls in order (maybe one twice: a batch not written because its
    # region lease lapsed on a loaded machine is thrown away too, and asked again).
    assert sorted(set(by_victim)) == list(range(1, victim.made + 1)), f"{where}: the victim asked {by_victim}"
    # The rescuer starts at the first call not committed, never before: it repeats exactly the
    # calls made since the last boundary, at most the policy's bound.
    rest = list(range(committed + 1, MODEL_CALLS + 1))
    assert by_rescuer[:1] == rest[:1], f"{where}: the rescuer asked {by_rescuer}"
    assert sorted(set(by_rescuer)) == rest, f"{where}: the rescuer asked {by_rescuer}"
    repeated = sorted(set(by_victim) & set(by_rescuer))
    assert repeated == list(range(committed + 1, victim.made + 1)), f"{where}: {repeated} repeated"
    assert len(repeated) <= PER_BOUNDARY, f"{where}: {repeated} repeated"
    assert not failed_in_run, tail
    # In all, the model server saw the clean run's calls plus the repeated ones, unless a batch was
    # thrown away for another reason (each is logged): then its calls were asked again as well.
    extra = len(by_victim) + len(by_rescuer) - MODEL_CALLS
    thrown = sum(p.logged(text) for p in (victim.process, rescuer) for text in THROWN_AWAY)
    assert thrown or extra == len(repeated), (
        f"{where}: {extra} calls beyond the clean run's, {repeated} repeated"
    )
    print(f"\n{where}: calls {repeated} repeated by the rescuer; {extra} calls beyond a clean run's")


@pytest.mark.parametrize(("phase", "nth"), POINTS, ids=[f"{p}-{n}-{WRITES[n - 1][0]}" for p, n in POINTS])
def test_sigkill_at_a_write_of_a_model_run(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    servers: Servers,
    phase: str,
    nth: int,
) -> None:
    what, calls = WRITES[nth - 1]
    committed = committed_by(nth if phase == "after" else nth - 1)
    # Before a run write the operator has made the calls that write would commit; every other
    # write is made with no call in flight (an ActionRecord's, while the run waits on it).
    made = calls if phase == "before" and calls is not None else committed
    process = start_operator("victim", LEASE, DURABLE_AGENTS_TEST_KILL_AT=f"{phase}:{nth}", **FAST_CLAIMS)
    victim = Victim(process, made, committed, servers.model.calls()["total"])
    name = runs.create(agent_spec(servers), name=f"{phase}-{nth}")
    # Approve and answer while the victim lives, so that it reaches every write itself.
    drive(runs, name, Within.RUN, until=lambda: not process.alive)
    assert process.wait_killed(Within.COMMIT) == -signal.SIGKILL
    recover(victim, f"{phase}:{nth} ({what})", start_operator, runs, name, servers)


# Model calls to kill the operator in (while it waits for the answer), each told apart by a text
# of the request's last message: the first read's result, the MCP read's, the MCP call's outcome
# (step 4's: the rescuer must neither send it again nor lose it).
INSIDE = {2: "maxAmount", 4: "Refund order 7731", 7: '"step":4'}


@pytest.mark.parametrize("protocol", ["openai-chat", "anthropic-messages"])
@pytest.mark.parametrize("call", list(INSIDE))
def test_sigkill_inside_a_model_call(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    servers: Servers,
    call: int,
) -> None:
    model = servers.model
    model.inject("slow", delay=float(Within.COMMIT), match=INSIDE[call])  # far longer than the kill
    process = start_operator("victim", LEASE, **FAST_CLAIMS)
    committed = max((c or 0 for _, c in WRITES if (c or 0) < call), default=0)
    victim = Victim(process, call, committed, model.calls()["total"])
    name = runs.create(agent_spec(servers), name=f"call-{call}")

    def in_flight() -> bool:
        """The slow request arrived (its fault is taken): the operator awaits its answer."""
        return model.call(lambda: not model.server.faults) and model.calls()["total"] >= call

    drive(runs, name, Within.RUN, until=in_flight)
    process.kill()
    assert process.wait_exit(0) == -signal.SIGKILL
    recover(victim, f"inside call {call}", start_operator, runs, name, servers)
    assert set(model.calls()["byProtocol"]) == {servers.protocol}, "every call spoke the endpoint's protocol"


# --- a stale checkpoint: the replayed model proposes other arguments ------------------------------


@pytest.mark.parametrize("protocol", ["openai-chat", "anthropic-messages"])
def test_an_approval_does_not_carry_over_to_other_arguments_proposed_on_replay(
    start_operator: Callable[..., OperatorProcess],
    kube: KubeEnv,
    runs: Runs,
    agent_namespace: str,
    refsystem: ReferenceSystemThread,
    protocol: str,
) -> None:
    """The refund is proposed and approved; then the run's status is restored from a backup taken
    before the model proposed it (the spec, with the approval, stays). On replay the model proposes
    another amount: the old approval must not authorise it, a new request is made, and only what
    the new approval binds is sent."""
    script = copy.deepcopy(SCRIPT)
    fix = 4  # the rule that answers "fix the currency": once, then another answer
    script["rules"][fix]["times"] = 1
    other = {**REFUND, "amount": 100}
    script["rules"].insert(fix + 1, rule(SCRIPT["rules"][fix]["when"], "refund", **other))
    turn = f"agent/turns/{TURNS.index(('refund', 'succeeded'))}/arguments"  # the refund's arguments
    with ModelServerThread(script, api_key=API_KEY) as model, McpServerThread() as tickets:
        servers = Servers(model, refsystem, tickets, protocol)
        first = start_operator("first", LEASE, **FAST_CLAIMS)
        with WriteLog(kube, runs.namespace) as log:
            name = runs.create(agent_spec(servers), name="replayed")
            waiting = runs.wait_state(name, "waiting_approval", timeout=Within.RUN)

            def three() -> list[dict[str, Any]] | None:  # up to the approval request
                statuses = [status for what, status in log.writes(name) if what == "run"]
                return statuses if len(statuses) == 3 else None

            written = eventually(three, Within.COMMIT, "the watch to see the run's first 3 writes")
        first.kill()  # a crash; then the status is restored from the backup
        # The backup: the run's last status before the refund proposal was committed (the model has read
        # the order and the ticket, had its bad call refused, and will be asked for the refund again).
        backup = next(s for s in reversed(written) if ("refund", "pending") not in model_turns({"status": s}))
        assert committed_calls(backup) == 4, backup
        old = waiting["status"]["approvalRequest"]
        assert unsealed(waiting, old["arguments"], turn) == REFUND
        # The approver's decision, in the spec (which the restore keeps). Given while no operator
        # runs, it is not acted on before the restore: had 120 been sent under the step's
        # idempotency key, the new intent (same run, step and attempt: the same key) would find
        # that key applied and take it as its own outcome (the ledger keys do not bind arguments).
        approve(runs, name, old)

        current = runs.get(name)
        runs.custom.replace_namespaced_custom_object_status(
            GROUP, VERSION, runs.namespace, "agentruns", name, {**current, "status": backup}
        )
        start_operator("restored", LEASE, **FAST_CLAIMS)

        def asked_again() -> dict[str, Any] | None:
            run = runs.get(name)
            request = run["status"].get("approvalRequest") or {}
            if run["status"].get("state") in ENDED_BADLY:
                raise AssertionError(run["status"])
            return run if request.get("requestId") not in (None, old["requestId"]) else None

        run = eventually(asked_again, Within.RUN, "a new approval request for the new arguments")
        new = run["status"]["approvalRequest"]
        assert unsealed(run, new["arguments"], turn) == other, "the model changed its mind"
        assert new["digest"] != old["digest"]
        refused = [(r["field"], r["key"], r["reason"]) for r in run["status"]["refusedRequests"]]
        assert refused == [("approvals", old["requestId"], "DigestMismatch")], "the old approval is refused"
        assert applied(refsystem, run) == [], "nothing is sent on the old approval"
        records = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
        assert records["items"] == [], "no intent exists for the new arguments before their approval"

        approve(runs, name, new)
        done = drive(runs, name, Within.RUN)  # the ticket's closure approved, the question answered
        assert done is not None
        assert applied(refsystem, done) == [1]
        assert list(tickets.counts().values()) == [1], "the ticket's closure is applied once"
    assert [r.body for r in refsystem.records()] == [other], "only what the new approval binds is sent"
    approvals = [(a["requestId"], a.get("decision")) for a in done["status"]["checkpoint"]["approvals"]]
    assert approvals[:2] == [(old["requestId"], None), (new["requestId"], "approved")]
    assert [d for _, d in approvals[2:]] == ["approved"], "and the ticket's closure, approved on its own"
    decided = [h for h in assert_history_is_gapless(done) if h["event"] == "approval_decided"]
    assert [new["requestId"] in h.get("detail", "") for h in decided] == [True, False]
