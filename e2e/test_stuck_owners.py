"""Stuck runs whose operator is wedged: each cause made real (a paused process, a region with no
deployment, a model endpoint that does not answer), flagged with its reason, a ``why`` that names
the fix, and the metric; undoing the wedge clears it.

* ``NoRegionOwner``: a run of region ``south``, which no operator serves. The live replicas (of
  ``east`` and ``west``) flag it from the Leases; deploying ``south`` clears it.
* ``OwnerNotRenewing``: the only replica of ``east`` is paused (SIGSTOP) and a run of ``east``
  created: its shard Lease is held by a replica that stopped renewing it, so ``west`` flags it,
  naming the hung replica; resuming it (SIGCONT) advances the run and clears it.
* ``ActionUnanswered``: an action's answer lost and its system's query endpoint answering nothing:
  flagged past its bound; a person's reconciliation settles it and clears it.
* ``ParentGone``: a parent run removed past the operator (paused meanwhile; its finalizer stripped,
  deleted with ``--cascade=orphan``) while its child waits: the child is flagged until canceled.
* ``NotAdvancing``: the owner is alive but its run's model call does not answer: the run stays
  ``pending`` (its first batch of model and tool calls not committed) past its bound
  (``DURABLE_AGENTS_STUCK_PENDING_AFTER``); the call answered, it goes on.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.engine import child_run_name
from durable_agents.kubectl import why as kubectl_why
from durable_agents_testkit.agent_sample import API_KEY, install_sample, sample_of
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import admitted
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port, metric, scrape

LEASE = 2
FAST = {
    "DURABLE_AGENTS_STUCK_CHECK_SECONDS": "1",
    "DURABLE_AGENTS_STUCK_UNOWNED_AFTER": "2s",
}
ASK = {"name": "confirm", "ask": {"question": "go on?", "expiresIn": "1h"}}
DONE = {"name": "done", "complete": {"result": "ok"}}


def spec(region: str) -> dict[str, Any]:
    return {"taskType": "stuck", "objective": "o", "region": region, "steps": [ASK, DONE]}


def condition(run: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (run.get("status") or {}).get("conditions") or [] if c["type"] == "Stuck"), None)


def stuck(runs: Runs, name: str, reason: str, within: float = Within.COMMIT) -> dict[str, Any]:
    def marked() -> dict[str, Any] | None:
        found = condition(runs.get(name))
        return found if found and (found["status"], found["reason"]) == ("True", reason) else None

    return eventually(marked, within, f"run {name} to be Stuck ({reason})")


def cleared(runs: Runs, name: str, within: float = Within.COMMIT) -> dict[str, Any]:
    def gone() -> dict[str, Any] | None:
        found = condition(runs.get(name))
        return found if found and found["status"] == "False" else None

    return eventually(gone, within, f"run {name}'s Stuck condition to clear")


def why(runs: Runs, name: str) -> str:
    return kubectl_why.text(kubectl_why.why(runs.custom, runs.namespace, name))


def unowned(port: int, region: str, reason: str) -> float:
    series = f'durable_agents_stuck_unowned_runs{{reason="{reason}",region="{region}"}}'
    return metric(scrape(port), series, default=0)


def test_runs_nobody_alive_owns_are_flagged_by_a_live_replica_and_cleared_when_served(
    start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    ns, port = runs.namespace, free_port()
    east = start_operator("east", LEASE, DURABLE_AGENTS_REGION="east", **FAST)
    start_operator("west", LEASE, DURABLE_AGENTS_REGION="west", DURABLE_AGENTS_METRICS_PORT=str(port), **FAST)

    # A region with no deployment: its run is flagged by the replicas that are alive.
    orphan = runs.create(spec("south"))
    found = stuck(runs, orphan, "NoRegionOwner")
    assert runs.state(orphan) == "pending", "nobody serves south: it never started"
    said = why(runs, orphan)
    assert "Stuck:            NoRegionOwner" in said, said
    assert "no operator serves its region 'south'" in said, said
    assert "--set region=south" in said, said
    eventually(lambda: unowned(port, "south", "NoRegionOwner") == 1, Within.COMMIT, "the unowned gauge")
    assert found["message"] == condition(runs.get(orphan))["message"]  # type: ignore[index]

    # The only replica of east paused: a run of east is held by a replica that stopped renewing.
    ready = runs.create(spec("east"))
    runs.wait_state(ready, "waiting_input", timeout=Within.COMMIT)
    east.signal(signal.SIGSTOP)
    try:
        eventually(east.stopped, Within.MOMENT, "the east operator to be paused")
        frozen = runs.create(spec("east"))
        found = stuck(runs, frozen, "OwnerNotRenewing", Within.TAKEOVER)
        assert runs.state(frozen) == "pending", "its owner is paused: it never started"
        said = why(runs, frozen)
        assert f"is held by '{east.identity}', which stopped renewing its Leases" in said, said
        assert f"kubectl delete pod -n {ns} {east.identity}" in said, said
        eventually(
            lambda: unowned(port, "east", "OwnerNotRenewing") >= 1, Within.COMMIT, "the unowned gauge (east)"
        )
        assert condition(runs.get(ready)) is not None, (
            "the paused replica's waiting run too: nobody serves it"
        )
    finally:
        east.signal(signal.SIGCONT)

    # The wedge undone: the replica resumes, advances its run and clears the condition.
    runs.wait_state(frozen, "waiting_input", timeout=Within.TAKEOVER)
    assert cleared(runs, frozen)["reason"] == "NotStuck"
    assert cleared(runs, ready)["reason"] == "NotStuck"
    eventually(lambda: unowned(port, "east", "OwnerNotRenewing") == 0, Within.COMMIT, "the gauge back to 0")

    # The region deployed: its run starts and the condition clears.
    start_operator("south", LEASE, DURABLE_AGENTS_REGION="south", **FAST)
    runs.wait_state(orphan, "waiting_input", timeout=Within.TAKEOVER)
    assert cleared(runs, orphan)["message"] == "no longer stuck (was NoRegionOwner)"
    eventually(lambda: unowned(port, "south", "NoRegionOwner") == 0, Within.COMMIT, "the gauge back to 0")
    assert metric(scrape(port), 'durable_agents_stuck_detections_total{reason="NoRegionOwner"}', 0) <= 1, (
        "only south"
    )


READS_THEN_ANSWERS = {
    "model": "scripted-refunds",
    "rules": [
        {
            "when": {"notCalled": ["read_limits"]},
            "content": "I will read the refund limits first.",
            "toolCalls": [{"name": "read_limits", "arguments": {"name": "refund-limits"}}],
        },
        {"when": {"lastToolResultContains": "maxAmount"}, "content": "The refund limit is 200 EUR."},
    ],
}


def agent_spec(model: ModelServerThread, refsystem: ReferenceSystemThread) -> dict[str, Any]:
    run: dict[str, Any] = sample_of("AgentRun")["spec"]
    run["agent"]["endpoint"].update(baseUrl=model.base_url, timeout="120s")
    for tool in run["agent"]["tools"]:
        if "effect" in tool:
            target = f"{refsystem.url}/effects"
            tool["effect"]["target"] = {"url": target, "queryUrl": target}
    return run


def test_an_eligible_run_its_live_owner_does_not_advance_is_not_advancing_until_it_moves(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    ns, port = runs.namespace, free_port()
    install_sample(kube.api, ns)
    with ModelServerThread(READS_THEN_ANSWERS, api_key=API_KEY) as model:
        # The call after the tool's result: accepted, answered only after 25 s.
        model.inject("slow", delay=25.0, match="maxAmount")
        start_operator(
            "owner",
            LEASE,
            DURABLE_AGENTS_METRICS_PORT=str(port),
            DURABLE_AGENTS_STUCK_PENDING_AFTER="4s",
            **FAST,
        )
        name = runs.create(agent_spec(model, refsystem))
        eventually(
            lambda: not model.call(lambda: model.server.faults), Within.COMMIT, "the slow call to arrive"
        )
        found = stuck(runs, name, "NotAdvancing")
        # Its first batch (model, tool, model) is in progress, nothing committed: still pending.
        assert runs.state(name) == "pending", "eligible, not waiting"
        assert "it has been pending at stateVersion 0" in found["message"]
        said = why(runs, name)
        assert "Stuck:            NotAdvancing" in said, said
        assert f"kubectl agentrun cancel {name} -n {ns}" in said, said
        assert "restart that replica" in said, said
        # The gauge is set at the end of the pass that wrote the condition.
        eventually(
            lambda: metric(scrape(port), 'durable_agents_stuck_runs{reason="NotAdvancing"}') == 1,
            Within.MOMENT,
            "the gauge at 1",
        )
        assert metric(scrape(port), 'durable_agents_stuck_detections_total{reason="NotAdvancing"}') == 1

        # The call answers: the run goes on, and the condition clears.
        runs.wait_state(name, "completed", timeout=Within.RUN)
        assert cleared(runs, name)["message"] == "no longer stuck (was NotAdvancing)"
        eventually(
            lambda: metric(scrape(port), 'durable_agents_stuck_runs{reason="NotAdvancing"}') == 0,
            Within.MOMENT,
            "the gauge back to 0",
        )


def test_an_action_whose_system_never_answers_is_action_unanswered_until_reconciled(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    ns, port = runs.namespace, free_port()
    refsystem.inject("drop_after_apply")  # applied, answer lost: the outcome is unknown
    start_operator(
        "ledger",
        LEASE,
        DURABLE_AGENTS_METRICS_PORT=str(port),
        DURABLE_AGENTS_STUCK_UNANSWERED_AFTER="4s",
        DURABLE_AGENTS_DISPATCH_TIMEOUT="2",
        **FAST,
    )
    nowhere = f"http://127.0.0.1:{free_port()}/effects"  # its query endpoint: nothing answers there
    pay = {
        "effect": "http.post",
        "target": {"url": f"{refsystem.url}/effects", "queryUrl": nowhere},
        "arguments": {"amount": 120},
    }
    name = runs.create({"taskType": "t", "objective": "o", "steps": [{"name": "pay", "effect": pay}, DONE]})
    runs.wait_state(name, "waiting_external", timeout=Within.COMMIT)
    stuck(runs, name, "ActionUnanswered")
    (action,) = [
        r
        for r in runs.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "actionrecords")["items"]
        if r["spec"]["runRef"]["name"] == name
    ]
    record = action["metadata"]["name"]
    assert action["status"]["state"] == "outcome_unknown", action["status"]
    said = why(runs, name)
    assert "Stuck:            ActionUnanswered" in said, said
    assert f"kubectl agentrun reconcile {name} -n {ns} --action {record} --applied|--not-applied" in said
    # The gauge is set at the end of the pass that wrote the condition.
    eventually(
        lambda: metric(scrape(port), 'durable_agents_stuck_runs{reason="ActionUnanswered"}') == 1,
        Within.MOMENT,
        "the gauge at 1",
    )

    # A person who knows it happened says so: the run goes on and the condition clears.
    old = runs.get(name)
    entry = {"applied": True, "attempt": action["status"]["attempts"], "reason": "the statement shows it"}
    new = {**old, "spec": {**old["spec"], "reconciliations": {record: entry}}}
    stamped = admitted("UPDATE", new, old)
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "agentruns", name, {"spec": {"reconciliations": {record: entry}, **stamped}}
    )
    runs.wait_state(name, "completed", timeout=Within.COMMIT)
    assert cleared(runs, name)["message"] == "no longer stuck (was ActionUnanswered)"
    assert refsystem.applied(action["spec"]["idempotencyKey"]) == 1, "applied once, never sent again"


def test_a_child_whose_parent_is_gone_is_parent_gone_until_canceled(
    kube: KubeEnv, start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    ns = runs.namespace
    children = rule(GROUP, "agentruns", "get", "create", "patch")
    grant(kube, ns, service_account("default", ns), children, name="start-children")
    op = start_operator("family", LEASE, **FAST)
    child = {"name": "sub", "child": {"taskType": "sub", "objective": "o", "steps": [ASK, DONE]}}
    parent = runs.create({"taskType": "t", "objective": "o", "steps": [child, DONE]})
    sub = child_run_name(parent, "sub")
    runs.wait_state(sub, "waiting_input", timeout=Within.COMMIT)
    runs.wait_state(parent, "waiting_external", timeout=Within.COMMIT)

    # Someone removes the parent past the operator (paused meanwhile): its finalizer stripped, deleted
    # with --cascade=orphan. The child stays, waiting for a parent that will never read its result.
    op.signal(signal.SIGSTOP)
    try:
        eventually(op.stopped, Within.MOMENT, "the operator to be paused")
        runs.custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, "agentruns", parent, {"metadata": {"finalizers": None}}
        )
        runs.custom.delete_namespaced_custom_object(
            GROUP, VERSION, ns, "agentruns", parent, propagation_policy="Orphan"
        )

        def gone() -> bool:
            try:
                runs.get(parent)
            except client.ApiException as err:
                return err.status == 404
            return False

        eventually(gone, Within.TAKEOVER, "the parent to be gone (the garbage collector orphans its child)")
    finally:
        op.signal(signal.SIGCONT)
    found = stuck(runs, sub, "ParentGone")
    assert f"for its parent run {parent!r}" in found["message"]
    said = why(runs, sub)
    assert "Stuck:            ParentGone" in said, said
    assert f"kubectl agentrun cancel {sub} -n {ns}" in said, said

    runs.patch_spec(sub, {"cancellations": {"orphaned": {"scope": "task", "reason": "parent gone"}}})
    runs.wait_state(sub, "canceled", timeout=Within.COMMIT)
    assert cleared(runs, sub)["message"] == "no longer stuck (was ParentGone)"
