"""Every recovery scenario (crash points, zombies, stale backups, upgrades), many runs each:
``make e2e-chaos``.

Every scenario ends with the table's two global assertions over all its runs: (1) each run is
terminal or in an owned recovery state (quarantined, a wait with an expiry, in progress under a
live Lease), (2) the reference authoritative system applied no idempotency key twice; payments
also carry an invoice number, so one payment made twice under two keys is caught as well.

``DURABLE_AGENTS_CHAOS_SIZE=ci`` (default, part of every ``make test``) is the reduced version;
``full`` is the acceptance run (at least 500 kill points across the scenarios). The session prints a
table (scenario, runs, kills, faults, duplicates, stuck runs, wall time) and writes it as JSON to
``DURABLE_AGENTS_CHAOS_OUT`` (default: a file in the temp directory). A kill is an operator process
death the test causes (SIGKILL by the commit hooks or by the test) or a control-plane restart;
faults are everything else injected (freezes, ambiguous answers, repeated deliveries).
``DURABLE_AGENTS_CHAOS_SEED`` replays the random kill points of a run; ``DURABLE_AGENTS_CHAOS_TUNE``
(``crash_chains=4,restarts=6``) overrides single knobs of a size.

Operators are separate processes. Most are forked from an interpreter that has already imported
the operator (:class:`durable_agents_testkit.chaos.ForkServer`: hundreds of fresh processes on two
cores); the webhook's and the previous release's operators, and the one riding through the
control-plane restarts, are started the usual way.
"""

from __future__ import annotations

import contextlib
import random
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

import durable_agents
from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.checkpoint import CURRENT_SCHEMA_VERSION
from durable_agents_testkit.chaos import (
    DONE,
    READ,
    TERMINAL,
    ChaosReport,
    Lab,
    Responder,
    ScenarioResult,
    all_ended,
    apply_policy,
    ask,
    assert_history_consistent,
    assert_paid_once,
    await_event,
    chaos_seed,
    chaos_size,
    conclude,
    events_of,
    export_objects,
    grant_operator_rules,
    key_of,
    live_leases,
    measure,
    output_path,
    pay,
    prepare_namespace,
    record,
    record_state,
    restore_objects,
    retrying,
    run_spec,
    runs_in,
    wait_ended,
    wait_no_leases,
)
from durable_agents_testkit.cluster import KubeEnv, install_crds
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.releases import Release, ReleaseUnavailable, materialize_release
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port, metric, scrape

REPO = Path(__file__).resolve().parents[1]
SIZE = chaos_size()
# The full size's kill chains run for many minutes (the ci size keeps the project's 600 s per test).
pytestmark = pytest.mark.timeout(3600 if SIZE.name == "full" else 600)
SEED = chaos_seed()
REPORT = ChaosReport(SIZE, SEED)
OLD_RELEASE = "3e2c704bade3f44b048fdb45691ee03082502f96"  # checkpoint schemaVersion 1 (as test_upgrade)
FAST_DISPATCH = {"DURABLE_AGENTS_DISPATCH_TIMEOUT": "1"}  # a dead dispatcher's claim expires in 3 s

# read, ask, pay, await, complete: the boundary scenario, and its transitions in order.
BOUNDARY_EVENTS = [
    "accepted",
    "step_completed",
    "input_requested",
    "input_received",
    "revalidated",
    "external_awaited",
    "external_received",
    "revalidated",
    "external_awaited",
    "external_received",
    "revalidated",
    "succeeded",
]
# Its writes, at the fewest (answered up front): the status at its semantic boundaries (everything
# up to the intent; the outcome, the awaited event and the end), plus the action record's creation
# (sent under the creating process's first claim: no claim write). Its outcome write is not counted:
# a full-size run (seed 602348) reached 25 writes, not 32, for a batch of 8, so the sweep stays
# within what a batch certainly reaches. A run answered by the responder writes more.
BOUNDARY_WRITES = 2 + 1
PAY_EVENTS = ["accepted", "external_awaited", "external_received", "revalidated", "succeeded"]


# --- session plumbing: the table and the JSON --------------------------------------------------


class _Summary:
    """Prints the table at the end of the pytest session (even when output is captured)."""

    def __init__(self, report: ChaosReport, path: Path) -> None:
        self.report = report
        self.path = path

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.report.results:
            return
        terminalreporter.write_sep("=", f"chaos scenarios (size {SIZE.name}, seed {SEED})")
        terminalreporter.write_line(self.report.table())
        terminalreporter.write_line(f"written to {self.path}")


@pytest.fixture(scope="module", autouse=True)
def chaos_report(request: pytest.FixtureRequest) -> Iterator[ChaosReport]:
    path = output_path()
    request.config.pluginmanager.register(_Summary(REPORT, path), "durable-agents-chaos-summary")
    yield REPORT
    if REPORT.results:
        REPORT.write(path)


@pytest.fixture
def lab(
    request: pytest.FixtureRequest,
    kube: KubeEnv,
    operator_kubeconfig: Path,
    tmp_path: Path,
    refsystem: ReferenceSystemThread,
) -> Iterator[Lab]:
    result = ScenarioResult(request.node.name.removeprefix("test_"))
    lab = Lab(kube, operator_kubeconfig, tmp_path / "operators", result, refsystem)
    began = time.monotonic()
    try:
        yield lab
    finally:
        result.wall_seconds = time.monotonic() - began
        lab.close()
        REPORT.add(result)


def rng_for(lab: Lab) -> random.Random:
    return random.Random(f"{lab.result.scenario}-{SEED}")


def boundary_spec(url: str, invoice: str, *, answered: bool) -> dict[str, Any]:
    spec = run_spec(READ, ask(), pay(url, invoice), await_event(), DONE)
    if answered:
        spec |= {"answers": {"confirm": "yes"}, "events": {"window-open": "now"}}
    return spec


def people(kube: KubeEnv) -> dict[str, client.ApiClient]:
    """alice and carol are approvers, bob only edits runs (see prepare_namespace)."""
    return {
        "alice": kube.user_client("alice", ["approvers"]),
        "carol": kube.user_client("carol", ["approvers"]),
        "bob": kube.user_client("bob", ["editors"]),
    }


APPROVAL_POLICY: dict[str, Any] = {
    "tiers": {"http.post": "consequential"},
    "approvalRequiredTiers": ["consequential"],
    "approvers": {"verb": "approve", "resource": "agentruns"},
    "approvalExpiry": "1h",
}


def approval_policy(**overrides: Any) -> dict[str, Any]:
    freshness = {
        "evidenceChanged": "reapprove",
        "policyChanged": "reapprove",
        **overrides.pop("freshness", {}),
    }
    return {**APPROVAL_POLICY, "freshness": freshness, **overrides}


def decide(api: client.ApiClient, namespace: str, name: str, request_id: str, digest: str) -> dict[str, Any]:
    patch = {"spec": {"approvals": {request_id: {"digest": digest, "decision": "approve"}}}}
    out: dict[str, Any] = client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentruns", name, patch
    )
    return out


def answer_of(fn: Callable[[], Any]) -> tuple[int, str]:
    """The HTTP status and body of an API call (200 and "" when it was accepted)."""
    try:
        fn()
    except ApiException as err:
        return int(err.status), str(err.body)
    return 200, ""


def refusal(fn: Callable[[], Any]) -> str:
    """The API server's (or the webhook's) refusal message; fails if the call was accepted."""
    status, body = answer_of(fn)
    assert status in (400, 403, 422), f"answered {status}, not a clear refusal: {body}"
    return body


def rewrite_checkpoint(
    runs: Runs, name: str, change: Callable[[dict[str, Any]], dict[str, Any]]
) -> tuple[int, str]:
    """Replace a run's checkpoint by ``change`` of it: the answer (as :func:`answer_of`). Read again
    and retried while the operator moves the run meanwhile (409)."""
    for _ in range(20):
        run = runs.get(name)
        run["status"]["checkpoint"] = change(run["status"]["checkpoint"])
        status, body = answer_of(
            lambda run=run: runs.custom.replace_namespaced_custom_object_status(  # type: ignore[misc]
                GROUP, VERSION, runs.namespace, "agentruns", name, run
            )
        )
        if status != 409:
            return status, body
    raise AssertionError(f"{name} kept moving: 20 writes of its checkpoint refused with 409")


# --- 1. crash at every checkpoint boundary ---------------------------------------------------


def test_crash_at_every_checkpoint_boundary(lab: Lab) -> None:
    """SIGKILL right before / right after the Nth write of a fresh process, N swept over every
    write of a batch of runs (read, ask, pay, await, complete) that are all in flight at once, so
    one kill hits many runs; then a few more kills of the same batch at random boundaries; a
    fresh process finishes it. Namespaces are crashed in parallel."""
    assert lab.refsystem is not None
    url = lab.refsystem.url
    batch, chains = SIZE.crash_batch, SIZE.crash_chains
    writes = BOUNDARY_WRITES * batch
    # Chain c sweeps N = c+1, c+1+chains, ...: together the chains cover 1..writes evenly.
    points_per_chain = SIZE.crash_sweep
    stride = max(1, writes // (points_per_chain * chains))
    namespaces = [lab.namespace(f"crash{c}") for c in range(chains)]
    rng = rng_for(lab)
    seeds = [rng.randrange(1 << 30) for _ in range(chains)]
    swept: list[tuple[str, int]] = []
    lock = threading.Lock()
    stop = threading.Event()  # set when a chain fails or the session is interrupted: all stop

    def chain(c: int) -> None:
        ns, local = namespaces[c], random.Random(seeds[c])
        for k in range(points_per_chain):
            n = min(writes, 1 + c * stride + k * stride * chains)
            for phase in ("before", "after"):
                if stop.is_set():
                    return
                tag = f"{phase[0]}{n}-{k}"  # N repeats once the sweep passes a batch's writes
                names = [
                    lab.create(ns, boundary_spec(url, f"{ns}-{tag}-{i}", answered=i % 2 == 0), f"{tag}-{i}")
                    for i in range(batch)
                ]

                def done(names: list[str] = names) -> bool:
                    return stop.is_set() or all_ended(lab, ns, names, TERMINAL | {"quarantined"})

                victim = lab.operator(
                    ns, f"v-{tag}", DURABLE_AGENTS_TEST_KILL_AT=f"{phase}:{n}", **FAST_DISPATCH
                )
                if lab.await_hook_kill(victim, done):
                    with lock:
                        swept.append((phase, n))
                for extra in range(SIZE.crash_extra):
                    if done():
                        break
                    # Within the writes a batch still makes after a kill (about 5 a run): most are hit.
                    point = f"{local.choice(['before', 'after'])}:{local.randint(1, 2 * batch)}"
                    v = lab.operator(
                        ns, f"x{extra}-{tag}", DURABLE_AGENTS_TEST_KILL_AT=point, **FAST_DISPATCH
                    )
                    lab.await_hook_kill(v, done)
                rescuer = lab.operator(ns, f"r-{tag}", **FAST_DISPATCH)
                eventually(done, Within.RUN, f"batch {tag} in {ns} to end", interval=0.25)
                rescuer.stop()

    with Responder(lab.kube, namespaces), ThreadPoolExecutor(chains) as pool:
        futures = [pool.submit(chain, c) for c in range(chains)]
        try:
            for future in futures:
                future.result()
        except BaseException:
            stop.set()
            raise

    measure(lab)
    lab.note(f"{len(swept)} sweep kill points over N in 1..{writes} (stride {stride}), seed {SEED}")
    finished = lab.all_runs()
    for run in finished:
        assert run["status"]["state"] == "completed", (
            f"{run['metadata']['name']}: {run['status'].get('outcome')}"
        )
        history = assert_history_consistent(run)
        assert [h["event"] for h in history] == BOUNDARY_EVENTS, f"{run['metadata']['name']}: a step repeated"
        cp = run["status"]["checkpoint"]
        assert len(cp["toolCalls"]) == 2, f"{run['metadata']['name']}: {cp['toolCalls']}"
    assert_paid_once(lab, finished)
    # A fresh batch always makes its Nth write for N <= writes: every sweep point must kill.
    assert len(swept) == 2 * chains * points_per_chain, f"sweep kill points not reached: {sorted(swept)}"
    conclude(lab)


# --- 2. crash between dispatch and outcome ---------------------------------------------------


def test_crash_between_dispatch_and_outcome(lab: Lab) -> None:
    """Effects applied by the authoritative system whose answers are held back, the dispatcher
    SIGKILLed while every one of them is in flight: the outcome was never recorded, so recovery must
    find out by a query (attempts stays 1), never by dispatching again."""
    assert lab.refsystem is not None
    ref = lab.refsystem
    ns = lab.namespace("dispatch")
    caught = 0
    for r in range(SIZE.dispatch_rounds):
        names = [
            lab.create(ns, run_spec(pay(ref.url, f"{ns}-{r}-{i}"), DONE), f"r{r}-{i}")
            for i in range(SIZE.dispatch_runs)
        ]
        keys = [key_of(run, 0) for run in runs_in(lab, ns, names)]
        for key in keys:
            ref.inject("slow", delay=30, match=key)
        # A 3 s dispatch timeout: the kill must land within 3 s of the answers being held.
        victim = lab.operator(ns, f"victim{r}", DURABLE_AGENTS_DISPATCH_TIMEOUT="3")
        eventually(
            lambda keys=keys: all(ref.applied(k) == 1 for k in keys),  # type: ignore[misc]
            Within.TAKEOVER,
            "every effect applied while its answer is held back",
            interval=0.02,
        )
        lab.kill(victim)
        lab.count_fault(len(keys))
        # Applied, answer held: in flight, whether claimed (dispatching) or under the dispatching
        # process's first claim (still intent: no claim write before the send).
        in_flight = [k for k in keys if record_state(lab.kube, ns, k) in ("dispatching", "intent")]
        caught += len(in_flight)
        rescuer = lab.operator(ns, f"rescuer{r}", **FAST_DISPATCH)
        done = wait_ended(lab, ns, names)
        rescuer.stop()
        ref.clear_faults()
        for run in done:
            assert run["status"]["state"] == "completed", run["status"].get("outcome")
            assert events_of(run) == PAY_EVENTS, events_of(run)
            status = record(lab.kube, ns, key_of(run, 0))["status"]
            assert (status["state"], status["attempts"]) == ("succeeded", 1), status
            if key_of(run, 0) in in_flight:
                assert status["queries"] >= 1, f"recovered without asking the authoritative system: {status}"
        assert_paid_once(lab, done)
    measure(lab)
    lab.note(f"{caught} dispatches caught in flight by the kills")
    assert caught >= SIZE.dispatch_rounds, "the kills must catch dispatches whose outcome was not recorded"
    conclude(lab)


# --- 3. zombie worker ------------------------------------------------------------------------


def many_reads_then_pay(url: str, invoice: str, reads: int = 4) -> dict[str, Any]:
    steps = [{**READ, "name": f"read-{i}"} for i in range(reads)]
    return run_spec(*steps, pay(url, invoice), DONE)


def test_zombie_worker(lab: Lab) -> None:
    """A worker frozen (SIGSTOP) right after its Nth write, mid-step (its other runs are between a
    read and a commit), holding Leases; another takes over once they expire; then the zombie wakes
    (SIGCONT): its commits must be refused and its epoch dropped, and an intent it creates late
    must be deduplicated by the ledger. Workers and the dispatcher run as separate processes here
    (a supported deployment); a frozen *dispatcher* is the next test."""
    assert lab.refsystem is not None
    url = lab.refsystem.url
    refused = suppressed = 0
    rng = rng_for(lab)
    workers_only = {"DURABLE_AGENTS_DISPATCHER": "off"}
    for cycle in range(SIZE.zombie_cycles):
        ns = lab.namespace("zombie")
        lab.operator(ns, f"dispatcher{cycle}", DURABLE_AGENTS_WORKERS="0", **FAST_DISPATCH)
        names = [
            lab.create(
                ns, many_reads_then_pay(url, f"{ns}-{i}") if i % 2 else run_spec(pay(url, f"{ns}-{i}"), DONE)
            )
            for i in range(SIZE.zombie_runs)
        ]
        # A run here is about 3 writes of the worker, the last ones ending runs: freezing at the
        # very last write (CI failed so, seed 838331) would leave it holding nothing in flight.
        nth = rng.randint(2, 2 * SIZE.zombie_runs)
        port = free_port()
        zombie = lab.operator(
            ns,
            f"zombie{cycle}",
            DURABLE_AGENTS_TEST_STOP_AT=f"after:{nth}",
            DURABLE_AGENTS_TEST_COMMIT_DELAY="0.1",
            DURABLE_AGENTS_METRICS_PORT=str(port),
            **workers_only,
        )
        eventually(
            zombie.stopped,
            Within.TAKEOVER,
            f"the zombie to freeze after its write {nth}:\n{zombie.log_tail(30)}",
        )
        lab.count_fault()
        covered = live_leases(lab.kube, ns, datetime.now(UTC), names)
        ended = {
            r["metadata"]["name"]
            for r in runs_in(lab, ns, names)
            if (r.get("status") or {}).get("state") in TERMINAL
        }
        held = sorted(n for n, holder in covered.items() if holder == zombie.identity and n not in ended)
        rescuer = lab.operator(ns, f"rescuer{cycle}", **workers_only)

        def taken_over(held: list[str] = held, rescuer: OperatorProcess = rescuer, ns: str = ns) -> bool:
            runs = runs_in(lab, ns, held)
            fenced = [
                ((r.get("status") or {}).get("checkpoint") or {}).get("fencing", {}).get("holder")
                for r in runs
            ]
            return all(f == rescuer.identity for f in fenced) or all_ended(lab, ns, held)

        eventually(
            taken_over, Within.TAKEOVER, f"the rescuer to take over the zombie's runs {held}", interval=0.2
        )
        zombie.signal(signal.SIGCONT)
        done = wait_ended(lab, ns, names)
        if held:
            # Noticed either way: a commit in flight refused (409), or its shards' Leases found taken
            # before it tried one (then nothing of it is committed: the epochs are checked below).
            noticed = ("refused (409", "moved on", "Conflict", f"lost by {zombie.identity}")
            eventually(
                lambda zombie=zombie, noticed=noticed: any(  # type: ignore[misc]
                    s in zombie.log_tail(400) for s in noticed
                ),
                Within.COMMIT,
                f"the zombie to notice it lost {held}:\n{zombie.log_tail(40)}",
            )
            refused += 1
        with contextlib.suppress(OSError):  # only a note's figure: a slow scrape loses no proof
            suppressed += int(metric(scrape(port), "durable_agents_duplicate_suppressions_total"))
        for run in done:
            assert run["status"]["state"] == "completed", run["status"].get("outcome")
            history = assert_history_consistent(run)
            taken = [h for h in history if h["holder"] == rescuer.identity]
            late = [
                h for h in history if h["holder"] == zombie.identity and taken and h["at"] > taken[0]["at"]
            ]
            assert all(h["epoch"] > taken[0]["epoch"] for h in late), (
                f"{run['metadata']['name']}: the zombie committed in a stale epoch: {history}"
            )
        assert_paid_once(lab, done)
        zombie.stop()
        rescuer.stop()
    measure(lab)
    lab.note(f"{refused} zombies held Leases and were refused; {suppressed} late intents deduplicated")
    assert refused >= 1, "no zombie held a Lease when it froze: the scenario proved nothing"
    conclude(lab)


ZOMBIE_FREEZES = {
    # where the zombie dispatcher is frozen -> what it must log when it wakes (and send nothing)
    "after its claim write": ({"DURABLE_AGENTS_TEST_STOP_AT": "after:1"}, "moved on meanwhile"),
    "right before its request": ({"DURABLE_AGENTS_TEST_STOP_BEFORE_SEND": "1"}, "claim lapsed"),
}


SENT = re.compile(r"http\.post attempt \d+: ")  # the dispatcher's log line for a request it sent


def test_zombie_dispatcher_frozen_between_claim_and_post(lab: Lab) -> None:
    """The dispatcher half of the zombie row: a dispatcher frozen after claiming an intent, before
    it sends the effect (alternately right after the claim write, and after its query, right
    before the request); the claim expires, another dispatcher asks the authoritative system (not
    applied) and dispatches; then the zombie wakes up. It must send nothing: its claim has lapsed
    (or its record moved on), and the reference system sees each key applied once."""
    assert lab.refsystem is not None
    freezes = list(ZOMBIE_FREEZES.items())
    for cycle in range(SIZE.zombie_dispatcher_cycles):
        where, (freeze, woke) = freezes[cycle % len(freezes)]
        ns = lab.namespace("zombie-dispatch")
        lab.operator(ns, f"worker{cycle}", DURABLE_AGENTS_DISPATCHER="off")
        zombie = lab.operator(
            ns, f"zombie-dispatcher{cycle}", DURABLE_AGENTS_WORKERS="0", **freeze, **FAST_DISPATCH
        )
        names = [
            lab.create(ns, run_spec(pay(lab.refsystem.url, f"{ns}-{i}"), DONE), f"pay-{i}")
            for i in range(SIZE.zombie_runs)
        ]
        eventually(zombie.stopped, Within.TAKEOVER, f"the dispatcher to freeze {where}")
        lab.count_fault()
        claimed = [
            r["metadata"]["name"]
            for r in lab.kube.custom().list_namespaced_custom_object(GROUP, VERSION, ns, "actionrecords")[
                "items"
            ]
            if (r.get("status") or {}).get("claimedBy") == zombie.identity
        ]
        assert claimed, f"the zombie froze {where} holding no claim: the scenario proved nothing"
        lab.operator(ns, f"dispatcher{cycle}", DURABLE_AGENTS_WORKERS="0", **FAST_DISPATCH)
        done = wait_ended(lab, ns, names)
        zombie.signal(signal.SIGCONT)
        eventually(
            lambda zombie=zombie, woke=woke: woke in (log := zombie.log_tail(400)) or SENT.search(log),  # type: ignore[misc]
            Within.COMMIT,
            f"the zombie (frozen {where}) to wake and log {woke!r}",
        )
        sent = [line for line in zombie.log_tail(400).splitlines() if SENT.search(line)]
        assert sent == [], f"the zombie (frozen {where}) sent requests after waking: {sent}"
        assert woke in zombie.log_tail(400)
        for run in done:
            assert run["status"]["state"] == "completed", run["status"].get("outcome")
        zombie.stop()
    measure(lab)
    conclude(lab)


# --- 4. duplicate events -----------------------------------------------------------------------


@pytest.mark.local_plane("users", "webhook")
def test_duplicate_events(lab: Lab, kube: KubeEnv) -> None:
    """The same answer, external event and approval delivered many times, concurrently, by two
    approvers at once, and again after the run ended; the worker killed once on the way. Each is
    taken once: one transition per delivery kind, one application of the effect."""
    assert lab.refsystem is not None
    ns = lab.namespace("dup", approvers=True)
    apply_policy(kube, ns, "payments", "v1", **approval_policy())
    lab.webhook_operator(ns)
    worker = lab.operator(ns, "worker", **FAST_DISPATCH)
    who = people(kube)
    spec = run_spec(ask(), await_event(), pay(lab.refsystem.url, "x"), DONE, policyRef={"name": "payments"})
    names = []
    for i in range(SIZE.duplicate_runs):
        spec["steps"][2] = pay(lab.refsystem.url, f"{ns}-{i}")
        names.append(lab.create(ns, spec))
    copies = SIZE.duplicate_threads
    with (
        Responder(kube, [ns], approver=who["alice"], copies=copies) as first,
        Responder(kube, [ns], approver=who["carol"], copies=copies) as second,
    ):
        eventually(
            lambda: sum("input_received" in events_of(r) for r in runs_in(lab, ns, names)) >= len(names) // 2,
            Within.TAKEOVER,
            "half the runs to take their answer",
        )
        lab.kill(worker)
        lab.operator(ns, "worker-2", **FAST_DISPATCH)
        done = wait_ended(lab, ns, names)
    lab.count_fault(first.delivered + first.refused + second.delivered + second.refused)
    # Deliver everything again, concurrently, to the ended runs: nothing may change.
    before = {r["metadata"]["name"]: r["metadata"]["resourceVersion"] for r in done}

    def again(run: dict[str, Any]) -> None:
        name = run["metadata"]["name"]
        approvals = run["spec"]["approvals"]
        rid = next(iter(approvals))
        for api in (who["alice"], who["carol"]):
            # Accepted as a no-op, or refused (no pending request): either way nothing changes.
            status, body = answer_of(lambda api=api: decide(api, ns, name, rid, approvals[rid]["digest"]))  # type: ignore[misc]
            assert status in (200, 400, 403, 422), body
        lab.runs(ns).patch_spec(name, {"answers": {"confirm": "yes"}, "events": {"window-open": "now"}})
        lab.count_fault(3)

    with ThreadPoolExecutor(copies) as pool:
        list(pool.map(again, done * 2))
    after = runs_in(lab, ns, names)
    for run in after:
        name = run["metadata"]["name"]
        assert run["status"]["state"] == "completed", run["status"].get("outcome")
        assert run["metadata"]["resourceVersion"] == before[name], f"{name} changed after it ended"
        events = Counter(events_of(run))
        assert (events["input_received"], events["approval_decided"], events["external_received"]) == (
            1,
            1,
            2,
        ), f"{name}: {events_of(run)}"
        approval = run["spec"]["approvals"]["pay-1"]
        assert approval["approver"]["username"] in ("alice", "carol")
        decided = run["status"]["checkpoint"]["approvals"][0]["decidedBy"]
        assert decided == approval["approver"]["username"], "the checkpoint names the approver the spec kept"
        assert_history_consistent(run)
    assert_paid_once(lab, after)
    measure(lab)
    conclude(lab)


# --- 5. delayed approval -----------------------------------------------------------------------


def first_requests(lab: Lab, namespace: str, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each run's approval request, noted when it is first seen waiting. Runs are noted one by one:
    on a loaded machine a 3 s request can expire before the last run asks for its own."""
    seen: dict[str, dict[str, Any]] = {}

    def note() -> bool:
        for run in lab.runs(namespace).all():
            status, name = run.get("status") or {}, run["metadata"]["name"]
            if name in names and name not in seen and status.get("state") == "waiting_approval":
                seen[name] = status["approvalRequest"]
        return len(seen) == len(names)

    try:
        eventually(note, Within.RUN, f"{len(names)} runs to ask for approval", interval=0.25)
    except TimeoutError as err:
        raise AssertionError(f"{err}: never seen waiting: {sorted(set(names) - set(seen))}") from None
    return seen


@pytest.mark.local_plane("users", "webhook")
def test_delayed_approval(lab: Lab, kube: KubeEnv) -> None:
    """Approvals that arrive late: after the request expired (the run expires, or per policy asks
    again), after the policy changed, after the evidence changed. A stale approval never lets the
    action run: it is refused, or the run asks for a new approval first."""
    assert lab.refsystem is not None
    url = lab.refsystem.url
    ns = lab.namespace("late", approvers=True)
    policies = {
        "expire": approval_policy(approvalExpiry="3s"),
        "reask": approval_policy(approvalExpiry="3s", freshness={"approvalExpired": "reapprove"}),
        "policy": approval_policy(),
        "evidence": approval_policy(),
    }
    for name, spec in policies.items():
        apply_policy(kube, ns, name, "v1", **spec)
    lab.webhook_operator(ns)
    worker = lab.operator(ns, "worker", **FAST_DISPATCH)
    alice = people(kube)["alice"]
    groups: dict[str, list[str]] = {}
    for case in policies:
        steps = [READ] if case == "evidence" else []
        groups[case] = [
            lab.create(
                ns,
                run_spec(*steps, pay(url, f"{ns}-{case}-{i}"), DONE, policyRef={"name": case}),
                f"{case}-{i}",
            )
            for i in range(SIZE.delayed_runs)
        ]
    every = [n for names in groups.values() for n in names]
    first = first_requests(lab, ns, every)
    # While they wait: the policy moves on, the evidence changes, the short requests expire.
    apply_policy(kube, ns, "policy", "v2", **policies["policy"])
    client.CoreV1Api(kube.api).patch_namespaced_config_map("settings", ns, {"data": {"maxSurge": "90%"}})
    wait_ended(lab, ns, groups["expire"], states=frozenset({"expired"}))
    # Asked again at least once: each asks anew every 3 s, so on a loaded machine (runs created
    # seconds apart) they are never all at the same request at once.
    eventually(
        lambda: all(
            r["status"].get("approvalRequest", {}).get("requestId") not in (None, "pay-1")
            for r in runs_in(lab, ns, groups["reask"])
        ),
        Within.TAKEOVER,
        "the expired requests to be asked again (approvalExpired: reapprove)",
    )
    # Now the original approvals arrive.
    for name in groups["expire"] + groups["reask"]:
        message = refusal(lambda name=name: decide(alice, ns, name, "pay-1", first[name]["digest"]))  # type: ignore[misc]
        assert "pay-1" in message, message
        lab.count_fault()
    for name in groups["policy"] + groups["evidence"]:
        decide(alice, ns, name, "pay-1", first[name]["digest"])
        lab.count_fault()
    lab.kill(worker)  # the late approvals are durable: a fresh worker acts on them
    lab.operator(ns, "worker-2", **FAST_DISPATCH)

    def reasked(name: str) -> bool:
        request = lab.runs(ns).get(name)["status"].get("approvalRequest") or {}
        return request.get("requestId") == "pay-2"

    for name in groups["policy"] + groups["evidence"]:
        eventually(lambda name=name: reasked(name), Within.TAKEOVER, f"{name} to ask for a new approval")  # type: ignore[misc]
    assert lab.refsystem.counts() == {}, "a stale approval let an action run"
    for name in groups["policy"]:
        assert (
            "policy changed from v1 to v2"
            in lab.runs(ns).get(name)["status"]["approvalRequest"]["policyReason"]
        )
    for name in groups["evidence"]:
        reason = lab.runs(ns).get(name)["status"]["approvalRequest"]["policyReason"]
        assert "evidence changed during the wait: ConfigMap/settings" in reason, reason
    with Responder(kube, [ns], approver=alice):
        approved = wait_ended(lab, ns, groups["reask"] + groups["policy"] + groups["evidence"])
    for run in approved:
        assert run["status"]["state"] == "completed", run["status"].get("outcome")
        assert events_of(run).count("reapproval_required") >= 1
        assert_history_consistent(run)
    for run in runs_in(lab, ns, groups["expire"]):
        assert run["status"]["outcome"]["reason"] == "ApprovalExpired", run["status"]["outcome"]
    paid = {key_of(r, 0 if r["metadata"]["name"].startswith(("reask", "policy")) else 1) for r in approved}
    assert set(lab.refsystem.counts()) == paid, "exactly the re-approved actions ran"
    measure(lab)
    conclude(lab)


# --- 6. policy change during a wait --------------------------------------------------------------


@pytest.mark.local_plane("users", "webhook")
def test_policy_change_during_wait(lab: Lab, kube: KubeEnv) -> None:
    """A GitOps pipeline rolls out several AgentPolicy versions while runs wait (some while no
    worker runs at all, a worker killed at each change). Per policy: the pending approval is asked
    again (policyChanged: reapprove) or still binds (immaterial); a run that waited for input
    meets the NEW policy's approval rule when it resumes."""
    assert lab.refsystem is not None
    url = lab.refsystem.url
    ns = lab.namespace("gitops", approvers=True)
    specs = {
        "strict": approval_policy(),
        "lenient": approval_policy(freshness={"policyChanged": "immaterial"}),
        "gate": approval_policy(approvalRequiredTiers=[]),  # no approval needed, until it is
    }
    for name, spec in specs.items():
        apply_policy(kube, ns, name, "v1", **spec)
    lab.webhook_operator(ns)
    worker = lab.operator(ns, "worker", **FAST_DISPATCH)
    groups = {
        case: [
            lab.create(
                ns,
                run_spec(
                    *([ask()] if case == "gate" else []),
                    pay(url, f"{ns}-{case}-{i}"),
                    DONE,
                    policyRef={"name": case},
                ),
                f"{case}-{i}",
            )
            for i in range(SIZE.policy_runs)
        ]
        for case in specs
    }
    wait_ended(lab, ns, groups["strict"] + groups["lenient"], states=frozenset({"waiting_approval"}))
    wait_ended(lab, ns, groups["gate"], states=frozenset({"waiting_input"}))
    version = "v1"
    for change in range(SIZE.policy_changes):
        version = f"v{change + 2}"
        if worker.alive and change % 2 == 0:
            lab.kill(worker)  # the change lands while no worker runs
        for name, spec in specs.items():
            if name == "gate":
                spec = {**spec, "approvalRequiredTiers": ["consequential"]}
            apply_policy(kube, ns, name, version, **spec)
            lab.count_fault()
        if not worker.alive:
            worker = lab.operator(ns, f"worker-{change}", **FAST_DISPATCH)
        if change % 2 == 1:
            lab.kill(worker)  # killed right after the change
            worker = lab.operator(ns, f"worker-{change}b", **FAST_DISPATCH)
    assert lab.refsystem.counts() == {}
    with Responder(kube, [ns], approver=people(kube)["alice"]):
        done = wait_ended(lab, ns, [n for names in groups.values() for n in names])
    for run in done:
        name = run["metadata"]["name"]
        assert run["status"]["state"] == "completed", (name, run["status"].get("outcome"))
        events = events_of(run)
        approvals = run["status"]["checkpoint"]["approvals"]
        if name.startswith("strict"):
            assert events.count("reapproval_required") == 1, (name, events)
            assert approvals[-1]["policyVersion"] == version, approvals
        elif name.startswith("lenient"):
            assert "reapproval_required" not in events, (name, events)
            assert [a["policyVersion"] for a in approvals] == ["v1"], approvals
        else:
            assert events.count("approval_requested") == 1, (name, events)
            assert [a["policyVersion"] for a in approvals] == [version], approvals
        assert_history_consistent(run)
    assert_paid_once(lab, done)
    measure(lab)
    conclude(lab)


# --- 7. deployment upgrade ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    try:
        release = materialize_release(REPO, OLD_RELEASE, tmp_path_factory.mktemp("release-3e2c704"))
    except ReleaseUnavailable as err:
        pytest.fail(str(err), pytrace=False)
    assert release.probe()["schemaVersion"] == 1
    return release


def test_deployment_upgrade(lab: Lab, old_release: Release) -> None:
    """N -> N+1: operators of the previous release (checkpoint schema 1) SIGKILLed one after the
    other mid-flight, the new one migrates and finishes every run. N+1 -> N: the new operator
    killed with effects in flight, the old one quarantines its schema-2 checkpoints without changing
    a byte, and the new one, back, releases them (retryQuarantine): every effect applied once."""
    assert lab.refsystem is not None
    ref = lab.refsystem
    rng = rng_for(lab)
    old_env = old_release.env()
    # N -> N+1
    up = lab.namespace("upgrade")
    mixed = []
    for i in range(SIZE.upgrade_runs):
        # Made as the previous release admitted runs: it does not seal (nor unseal) values.
        mixed.append(
            lab.create(up, boundary_spec(ref.url, f"{up}-b{i}", answered=True), f"boundary-{i}", seal=False)
        )
        mixed.append(lab.create(up, run_spec(pay(ref.url, f"{up}-p{i}"), DONE), f"pay-{i}", seal=False))
        mixed.append(
            lab.create(up, many_reads_then_pay(ref.url, f"{up}-r{i}", reads=6), f"reads-{i}", seal=False)
        )
    for k in range(SIZE.upgrade_kills):
        point = f"{rng.choice(['before', 'after'])}:{rng.randint(1, 4 * len(mixed))}"
        old = lab.operator(up, f"old{k}", **old_env, DURABLE_AGENTS_TEST_KILL_AT=point, **FAST_DISPATCH)
        lab.await_hook_kill(old, lambda: all_ended(lab, up, mixed))
    new = lab.operator(up, "new", warm=False, **FAST_DISPATCH)
    upgraded = wait_ended(lab, up, mixed)
    new.stop()
    for run in upgraded:
        assert run["status"]["state"] == "completed", (run["metadata"]["name"], run["status"].get("outcome"))
        cp = run["status"]["checkpoint"]
        if run["status"]["history"][-1]["holder"] == new.identity:  # else it ended under the old one
            assert cp["schemaVersion"] == CURRENT_SCHEMA_VERSION, f"{run['metadata']['name']} not migrated"
            assert cp["runtimeConfig"].get("operator") == durable_agents.__version__
        assert_history_consistent(run)

    # N+1 -> N
    down = lab.namespace("downgrade")
    asking = [lab.create(down, run_spec(READ, ask(), DONE), f"ask-{i}") for i in range(SIZE.upgrade_runs)]
    paying = [
        lab.create(down, run_spec(pay(ref.url, f"{down}-{i}"), DONE), f"pay-{i}")
        for i in range(SIZE.upgrade_runs)
    ]
    keys = [key_of(r, 0) for r in runs_in(lab, down, paying)]
    for key in keys:
        ref.inject("slow", delay=30, match=key)
    # Its dispatch timeout (6 s) is the window in which it must die with the answers still held.
    # Claimed, not first-claimed: the old release knows claims only (a first claim in flight would
    # wait for the upgrade back: the old release can neither claim it nor give it up).
    new = lab.operator(down, "new", DURABLE_AGENTS_DISPATCH_TIMEOUT="6", DURABLE_AGENTS_FIRST_CLAIM="off")
    wait_ended(lab, down, asking, states=frozenset({"waiting_input"}))
    eventually(
        lambda: all(ref.applied(k) == 1 for k in keys),
        Within.TAKEOVER,
        "the effects to be applied, answers held",
        interval=0.02,
    )
    # Killed at once, Leases and all: the old release never rewrites a checkpoint it cannot read.
    lab.kill(new)
    states = {k: record_state(lab.kube, down, k) for k in keys}
    assert "dispatching" in states.values(), f"the kill must catch a dispatch in flight: {states}"
    parked = {r["metadata"]["name"]: r["status"]["checkpoint"] for r in runs_in(lab, down, asking + paying)}
    old = lab.operator(down, "old-again", **old_env, **FAST_DISPATCH)
    for name in asking:
        lab.runs(down).patch_spec(name, {"answers": {"confirm": "yes"}})
    quarantined = wait_ended(lab, down, asking + paying, states=frozenset({"quarantined"}))
    for run in quarantined:
        assert run["status"]["outcome"]["reason"] == "UnknownSchemaVersion", run["status"]["outcome"]
        assert run["status"]["checkpoint"] == parked[run["metadata"]["name"]], (
            "the old operator changed a checkpoint"
        )
    wait_no_leases(lab, down)
    lab.kill(old)
    lab.operator(down, "new-again", **FAST_DISPATCH)
    for name in asking + paying:
        lab.runs(down).patch_spec(name, {"retryQuarantine": "upgraded-again"})
    done = wait_ended(lab, down, asking + paying)
    for run in done:
        assert run["status"]["state"] == "completed", (run["metadata"]["name"], run["status"].get("outcome"))
        assert_history_consistent(run)
    assert_paid_once(lab, runs_in(lab, down, paying))
    measure(lab)
    conclude(lab)


# --- 8. ambiguous responses ----------------------------------------------------------------------

AMBIGUOUS = ["error_after_apply", "slow", "drop_after_apply", "error_before_apply"]


def test_ambiguous_responses(lab: Lab) -> None:
    """The authoritative system applies the effect and then answers 500, answers too late, or
    drops the connection (or fails before applying); operators are SIGKILLed meanwhile. Every
    ambiguity is resolved by a query by idempotency key: each effect applied exactly once."""
    assert lab.refsystem is not None
    ref = lab.refsystem
    ns = lab.namespace("ambiguous")
    names: dict[str, list[str]] = {
        fault: [
            lab.create(
                ns, run_spec(pay(ref.url, f"{ns}-{fault}-{i}"), DONE), f"{fault.replace('_', '-')}-{i}"
            )
            for i in range(SIZE.ambiguous_runs)
        ]
        for fault in AMBIGUOUS
    }
    every = [n for group in names.values() for n in group]
    for fault, group in names.items():
        for run in runs_in(lab, ns, group):
            ref.inject(fault, delay=2.5, match=key_of(run, 0))
            lab.count_fault()
    rng = rng_for(lab)
    for k in range(SIZE.ambiguous_kills):
        point = f"{rng.choice(['before', 'after'])}:{rng.randint(1, 3 * len(every))}"
        victim = lab.operator(ns, f"victim{k}", DURABLE_AGENTS_TEST_KILL_AT=point, **FAST_DISPATCH)
        lab.await_hook_kill(victim, lambda: all_ended(lab, ns, every))
    lab.operator(ns, "rescuer", **FAST_DISPATCH)
    done = wait_ended(lab, ns, every)
    for run in done:
        assert run["status"]["state"] == "completed", (run["metadata"]["name"], run["status"].get("outcome"))
        status = record(lab.kube, ns, key_of(run, 0))["status"]
        assert status["state"] == "succeeded", status
        assert status["queries"] >= 1, f"an ambiguous answer must be reconciled by a query: {status}"
        assert_history_consistent(run)
    assert ref.pending_faults() == [], "every injected fault must have been met"
    assert_paid_once(lab, done)
    measure(lab)
    conclude(lab)


# --- 9. API server and etcd restarts -----------------------------------------------------------


@pytest.mark.local_plane("restarts")
def test_api_server_and_etcd_restarts(lab: Lab, kube: KubeEnv, plane: LocalControlPlane) -> None:
    """The API server and etcd restarted (gracefully and by SIGKILL, alternating) under load:
    nothing committed is lost (no run's history shrinks or changes), nothing is applied twice, the
    operator rides through every restart without dying."""
    assert lab.refsystem is not None
    ns = lab.namespace("restarts")
    op = lab.operator(ns, "op", warm=False, **FAST_DISPATCH)  # a process started the usual way
    names: list[str] = []
    per_restart = max(3, SIZE.restart_runs // max(1, SIZE.restarts))
    with Responder(kube, [ns]):
        for i in range(SIZE.restarts):
            batch = [
                retrying(
                    lambda i=i, j=j: lab.create(  # type: ignore[misc]
                        ns,
                        boundary_spec(lab.refsystem.url, f"{ns}-{i}-{j}", answered=j % 2 == 0),
                        f"r{i}-{j}",
                    ),
                    "create a run",
                )
                for j in range(per_restart)
            ]
            names += batch
            eventually(
                lambda batch=batch: any(
                    len(events_of(r)) >= 2 for r in retrying(lambda: runs_in(lab, ns, batch), "read")
                ),  # type: ignore[misc]
                Within.TAKEOVER,
                "the new runs to be under way",
            )
            before = {
                r["metadata"]["name"]: (r.get("status") or {}).get("history", [])
                for r in retrying(lambda: lab.runs(ns).all(), "list")
            }
            graceful = (i // 2) % 2 == 0
            if i % 2 == 0:
                plane.restart_apiserver(graceful=graceful)
            else:
                plane.restart_etcd(graceful=graceful)
            lab.count_kill()
            component = "kube-apiserver" if i % 2 == 0 else "etcd"
            lab.note(f"restart {i}: {component} ({'SIGTERM' if graceful else 'SIGKILL'})")
            after = {
                r["metadata"]["name"]: (r.get("status") or {}).get("history", [])
                for r in retrying(lambda: lab.runs(ns).all(), "list")
            }
            for name, history in before.items():
                assert after[name][: len(history)] == history, (
                    f"{name}: committed history lost in restart {i}"
                )
        done = wait_ended(lab, ns, names, Within.SETTLE)
    assert op.alive, f"the operator died in a restart:\n{op.log_tail(60)}"
    for run in done:
        assert run["status"]["state"] == "completed", (run["metadata"]["name"], run["status"].get("outcome"))
        assert [h["event"] for h in assert_history_consistent(run)] == BOUNDARY_EVENTS
    assert_paid_once(lab, done)
    measure(lab)
    conclude(lab)


# --- 10. stale backup restore ------------------------------------------------------------------


@pytest.mark.local_plane("restarts")
def test_stale_backup_restore(lab: Lab, kube: KubeEnv) -> None:
    """Export every AgentRun and ActionRecord (with status), let the runs advance and dispatch,
    then restore the stale export into a FRESH control plane and run an operator there, against
    the same authoritative system: no effect may be applied again."""
    assert lab.refsystem is not None
    ref = lab.refsystem
    where: list[tuple[KubeEnv, list[str]]] = [(kube, lab.namespaces)]
    for r in range(SIZE.restore_rounds):
        ns = lab.namespace("restore")
        first = lab.operator(ns, f"before-backup{r}", **FAST_DISPATCH)
        finished = [
            lab.create(ns, run_spec(pay(ref.url, f"{ns}-f{i}"), DONE), f"finished-{i}")
            for i in range(SIZE.restore_runs)
        ]
        wait_ended(lab, ns, finished)
        first.stop()
        # No dispatcher yet: intents are committed and wait in the ledger, undispatched.
        holding = lab.operator(ns, f"no-dispatch{r}", DURABLE_AGENTS_DISPATCHER="off")
        intents = [
            lab.create(ns, run_spec(pay(ref.url, f"{ns}-i{i}"), DONE), f"intent-{i}")
            for i in range(SIZE.restore_runs)
        ]
        asking = [
            lab.create(ns, run_spec(READ, ask(), pay(ref.url, f"{ns}-a{i}"), DONE), f"asking-{i}")
            for i in range(SIZE.restore_runs)
        ]
        wait_ended(lab, ns, intents, states=frozenset({"waiting_external"}))
        wait_ended(lab, ns, asking, states=frozenset({"waiting_input"}))
        eventually(
            lambda ns=ns: len(export_objects(kube, ns)["actionrecords"]) == 2 * SIZE.restore_runs,
            Within.COMMIT,
            "the intents' records",
        )  # type: ignore[misc]
        backup = export_objects(kube, ns)
        lab.kill(holding)
        # The cluster goes on after the backup: the intents are dispatched, the questions answered.
        later = lab.operator(ns, f"after-backup{r}", **FAST_DISPATCH)
        with Responder(kube, [ns]):
            wait_ended(lab, ns, finished + intents + asking)
        later.stop()
        assert set(ref.counts().values()) == {1}
        # Disaster: the cluster is rebuilt from the stale backup.
        with LocalControlPlane() as plane2:
            fresh = KubeEnv.local(plane2)
            install_crds(fresh.api, REPO / "crds")
            grant_operator_rules(fresh.api)
            prepare_namespace(fresh.api, ns)
            restored = restore_objects(fresh, ns, backup)
            lab.note(f"round {r}: restored {restored} objects into a fresh control plane")
            kubeconfig = plane2.write_user_kubeconfig("durable-agents-operator", [])
            restored_op = lab.operator(ns, f"restored{r}", kubeconfig=kubeconfig, **FAST_DISPATCH)
            with Responder(fresh, [ns]), contextlib.suppress(TimeoutError):  # stuck runs: measured below
                eventually(
                    lambda fresh=fresh, ns=ns: all(  # type: ignore[misc]
                        r["status"].get("state") in TERMINAL for r in Runs(fresh, ns).all()
                    ),
                    Within.RUN,
                    "the restored runs to end",
                    interval=0.25,
                )
            where.append((fresh, [ns]))
            records = fresh.custom().list_namespaced_custom_object(GROUP, VERSION, ns, "actionrecords")[
                "items"
            ]
            recognised = [
                rec for rec in records if (rec.get("status") or {}).get("reason") == "AlreadyApplied"
            ]
            lab.note(f"round {r}: {len(recognised)} effects recognised as already applied, not sent again")
            # The intents restored undispatched, and the effects of the runs restored before their
            # intent (same keys: the run ID survived the restore), were all applied after the backup.
            assert len(recognised) == 2 * SIZE.restore_runs, [
                (rec["spec"]["idempotencyKey"], rec.get("status")) for rec in records
            ]
            measure(lab, where, within=5)  # every run ended above: a last look
            restored_op.stop()
            conclude(lab)  # a duplicate fails here, while this round's plane is still up
            where.pop()
    measure(lab, where, within=Within.COMMIT)
    conclude(lab)


# --- 11. bad input -------------------------------------------------------------------------------


def malformed(url: str) -> list[tuple[str, dict[str, Any], str]]:
    """(what, spec, fragment of the API server's message) for specs the schema must refuse."""
    good = run_spec(ask(), DONE)
    return [
        ("bad step name", run_spec({**DONE, "name": "Done_Step"}), "spec.steps[0].name"),
        ("two kinds in one step", run_spec({**DONE, **ask()}), "exactly one of"),
        ("no kind in a step", run_spec({"name": "nothing"}), "exactly one of"),
        ("oversized objective", {**good, "objective": "x" * 5000}, "spec.objective"),
        ("bad duration", run_spec(ask(expires="five minutes"), DONE), "spec.steps[0].ask.expiresIn"),
        (
            "bad effect name",
            run_spec({**pay(url, "x"), "effect": {**pay(url, "x")["effect"], "effect": "HTTP POST"}}),
            "spec.steps[0].effect.effect",
        ),
        (
            "steps not a list",
            {**good, "steps": "read the settings"},
            "spec.steps in body must be of type array",
        ),
        ("duplicate step names", run_spec(DONE, DONE), "step names must be unique"),
        (
            "bad approval digest",
            {**good, "approvals": {"pay-1": {"digest": "md5:abc", "decision": "approve"}}},
            "spec.approvals.pay-1.digest",
        ),
        (
            "unknown cancellation scope",
            {**good, "cancellations": {"c": {"scope": "everything"}}},
            "spec.cancellations.c.scope: Unsupported value",
        ),
        ("no task type", {k: v for k, v in good.items() if k != "taskType"}, "spec.taskType: Required value"),
    ]


@pytest.mark.local_plane("users", "webhook")
def test_bad_input(lab: Lab, kube: KubeEnv) -> None:
    """Malformed manifests, oversized fields, forged identities, wrong digests, unknown request
    IDs, decisions without the RBAC verb: refused with a message naming the problem. Unreadable
    checkpoints (unknown schema version, invalid content): quarantined, never a crash loop; good
    runs beside them finish; nothing is lost."""
    assert lab.refsystem is not None
    url = lab.refsystem.url
    ns = lab.namespace("bad", approvers=True)
    apply_policy(kube, ns, "payments", "v1", **approval_policy())
    lab.webhook_operator(ns)
    worker = lab.operator(ns, "worker", **FAST_DISPATCH)
    runs = lab.runs(ns)
    refused = 0
    for what, spec, fragment in malformed(url):
        message = refusal(lambda spec=spec: runs.create(spec))  # type: ignore[misc]
        assert fragment in message, f"{what}: the refusal does not name the problem: {message}"
        refused += 1
    # Changing what a run is about, or an answer already given, is refused too.
    probe = lab.create(ns, run_spec(ask(), DONE), "probe")
    runs.wait_state(probe, "waiting_input")
    assert "taskType is immutable" in refusal(lambda: runs.patch_spec(probe, {"taskType": "other"}))
    runs.patch_spec(probe, {"answers": {"confirm": "yes"}})
    assert "cannot be changed" in refusal(lambda: runs.patch_spec(probe, {"answers": {"confirm": "no"}}))
    refused += 2
    # Approvals: forged identity (stamped over), wrong digest, unknown request, no RBAC verb.
    who = people(kube)
    paying = [
        lab.create(ns, run_spec(pay(url, f"{ns}-{i}"), DONE, policyRef={"name": "payments"}), f"pay-{i}")
        for i in range(SIZE.bad_runs)
    ]
    for name in paying:
        request = runs.wait_state(name, "waiting_approval")["status"]["approvalRequest"]
        assert "wrong digest" in refusal(
            lambda name=name: decide(who["alice"], ns, name, "pay-1", "sha256:" + "0" * 64)
        )  # type: ignore[misc]
        assert "unknown approval request 'pay-7'" in refusal(
            lambda name=name, request=request: decide(who["alice"], ns, name, "pay-7", request["digest"])
        )  # type: ignore[misc]
        assert "missing RBAC permission verb 'approve'" in refusal(
            lambda name=name, request=request: decide(who["bob"], ns, name, "pay-1", request["digest"])
        )  # type: ignore[misc]
        forged = {
            "spec": {
                "approvals": {
                    "pay-1": {
                        "digest": request["digest"],
                        "decision": "approve",
                        "approver": {"username": "mallory", "groups": ["system:masters"]},
                    }
                }
            }
        }
        stamped = client.CustomObjectsApi(who["alice"]).patch_namespaced_custom_object(
            GROUP, VERSION, ns, "agentruns", name, forged
        )
        assert stamped["spec"]["approvals"]["pay-1"]["approver"]["username"] == "alice"
        refused += 3
    # Unreadable checkpoints, written over parked runs; the answer then wakes them.
    corrupt = {
        "future": lambda cp: {**cp, "schemaVersion": 99},
        "invalid": lambda cp: {**cp, "position": "somewhere"},
        "truncated": lambda cp: {"schemaVersion": 2},
    }
    reasons = {
        "future": "UnknownSchemaVersion",
        "invalid": "InvalidCheckpoint",
        "truncated": "InvalidCheckpoint",
    }
    damaged: dict[str, str] = {}
    for kind in corrupt:
        for i in range(SIZE.bad_runs):
            damaged[lab.create(ns, run_spec(READ, ask(), DONE), f"{kind}-{i}")] = kind
    good = [
        lab.create(ns, boundary_spec(url, f"{ns}-good-{i}", answered=True), f"good-{i}")
        for i in range(SIZE.bad_runs)
    ]
    wait_ended(lab, ns, list(damaged), states=frozenset({"waiting_input"}))
    for name, kind in damaged.items():
        status, body = rewrite_checkpoint(runs, name, corrupt[kind])
        assert status == 200, body
        lab.count_fault()
    status, body = rewrite_checkpoint(runs, next(iter(damaged)), lambda cp: {**cp, "schemaVersion": "two"})
    assert status in (400, 403, 422), f"answered {status}, not a clear refusal: {body}"
    assert "schemaVersion" in body, body
    for name in damaged:
        runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    half = list(damaged)[: len(damaged) // 2]
    wait_ended(lab, ns, half, states=frozenset({"quarantined"}))
    lab.kill(worker)  # killed among the quarantines: the next one must not crash-loop either
    survivor = lab.operator(ns, "survivor", **FAST_DISPATCH)
    quarantined = wait_ended(lab, ns, list(damaged), states=frozenset({"quarantined"}))
    for run in quarantined:
        kind = damaged[run["metadata"]["name"]]
        assert run["status"]["outcome"]["reason"] == reasons[kind], (kind, run["status"]["outcome"])
    # Quarantine controls: a retry while still unreadable stays put; a cancel ends the run.
    retried, canceled = next(iter(damaged)), list(damaged)[-1]
    runs.patch_spec(retried, {"retryQuarantine": "try-1"})
    runs.patch_spec(canceled, {"cancellations": {"give-up": {"scope": "task", "reason": "unreadable"}}})
    runs.wait_state(canceled, "canceled")
    with Responder(kube, [ns], approver=who["alice"]):
        finished = wait_ended(lab, ns, good + paying)
    # By now (a cancel patched after it was carried out, other runs finished) the retry was looked at.
    assert runs.state(retried) == "quarantined", "a still unreadable checkpoint must stay quarantined"
    for run in finished:
        assert run["status"]["state"] == "completed", (run["metadata"]["name"], run["status"].get("outcome"))
    assert survivor.alive, f"the operator died on bad input:\n{survivor.log_tail(60)}"
    assert all("Traceback" not in op.log_path.read_text() for op in lab.operators), (
        "an operator logged a traceback:\n" + lab.crash_report(6)
    )
    lab.count_fault(refused)
    measure(lab)
    conclude(lab)


class NotQuarantined(AssertionError):
    """A run with an unreadable checkpoint went on instead of being quarantined."""


def test_bad_input_undecryptable_checkpoint(lab: Lab) -> None:
    """Checkpoints whose sealed values were sealed with a retired key (or tampered with): the
    table requires a quarantine (reason Undecryptable), never a crash and never going on."""
    import base64
    import os

    ns = lab.namespace("sealed")
    worker = lab.operator(ns, "worker", **FAST_DISPATCH)
    runs = lab.runs(ns)
    names = [lab.create(ns, run_spec(ask(), DONE), f"sealed-{i}") for i in range(SIZE.bad_runs)]
    wait_ended(lab, ns, names, states=frozenset({"waiting_input"}))
    wait_no_leases(lab, ns)
    for name in names:
        run = runs.get(name)
        run["status"]["checkpoint"]["sealed"] = {
            "apiToken": {
                "keyId": "retired-2025",
                "nonce": base64.b64encode(os.urandom(12)).decode(),
                "ciphertext": base64.b64encode(os.urandom(48)).decode(),
            }
        }
        runs.custom.replace_namespaced_custom_object_status(GROUP, VERSION, ns, "agentruns", name, run)
        runs.patch_spec(name, {"answers": {"confirm": "yes"}})
        lab.count_fault()
    ended = wait_ended(lab, ns, names, states=TERMINAL | frozenset({"quarantined"}))
    assert worker.alive, f"the operator died on an undecryptable checkpoint:\n{worker.log_tail(60)}"
    measure(lab)
    went_on = [r["metadata"]["name"] for r in ended if r["status"]["state"] != "quarantined"]
    if went_on:
        raise NotQuarantined(f"runs with undecryptable sealed values went on: {went_on}")
    for run in ended:
        assert run["status"]["outcome"]["reason"] == "Undecryptable", run["status"]["outcome"]
    conclude(lab)


# --- acceptance ----------------------------------------------------------------------------------


def test_full_size_acceptance() -> None:
    """The full size's acceptance: at least 500 kill points across all scenarios, zero
    duplicates, zero stuck runs, no scenario failed."""
    if SIZE.min_total_kills == 0:
        pytest.skip("the ci size has no acceptance target")
    names = {r.scenario for r in REPORT.results}
    if len(names) < 13:
        pytest.skip(f"only {len(names)} of 13 scenarios ran in this session")
    assert REPORT.total_kills >= SIZE.min_total_kills, f"only {REPORT.total_kills} kill points"
    failed = [r.scenario for r in REPORT.results if not r.passed]
    assert not failed, f"scenarios failed: {failed}"
