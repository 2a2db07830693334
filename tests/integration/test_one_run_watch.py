"""One AgentRun list-and-watch per operator process: the manager's reflector feeds every consumer.

An operator process runs, as a user of its own (the chart's ClusterRole), with its admission
webhook, run workers, retention, the stuck check and the census on. Each consumer is shown to
have received run events (retention deletes a finished run after its TTL; the stuck check marks a
run whose policy is missing; the census counts a run that waits for input), and the API server's
audit log then holds exactly one watch request for agentruns from that user: no consumer runs a
list-and-watch of its own, and kopf (which serves the AgentRun admission webhook) does not watch
AgentRuns either.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.audit import audit_offset, read_audit
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.operator_rights import grant_operator, manage
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port, metric, scrape

pytestmark = pytest.mark.local_plane("users", "webhook", "audit")

REPO = Path(__file__).resolve().parents[2]
USER = "durable-agents-operator-one-watch"  # this test's operator only: its requests are its own
DONE = {"name": "done", "complete": {"result": "ok"}}
ASK = {"name": "confirm", "ask": {"question": "go on?"}}


@pytest.fixture
def operator_kubeconfig(kube: KubeEnv, namespace: str) -> Iterator[Path]:
    """A kubeconfig for a user of this test's own, with the chart's cluster-wide rules, the
    namespace managed for it."""
    grant_operator(kube, USER, name=USER)
    manage(kube, namespace, USER)
    rbac = client.RbacAuthorizationV1Api(kube.api)
    yield Path(kube.plane.write_user_kubeconfig(USER, []))
    rbac.delete_cluster_role_binding(USER)
    rbac.delete_cluster_role(USER)


def stuck_reason(run: dict[str, Any]) -> str | None:
    for condition in (run.get("status") or {}).get("conditions") or []:
        if condition["type"] == "Stuck" and condition["status"] == "True":
            return str(condition["reason"])
    return None


def gone(runs: Runs, name: str) -> bool:
    try:
        runs.get(name)
    except ApiException as err:
        if err.status == 404:
            return True
        raise
    return False


def test_one_agentrun_watch_per_operator_process_feeds_retention_stuck_and_census(
    kube: KubeEnv, namespace: str, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    assert kube.plane is not None
    audit = kube.plane.audit_log_path
    offset = audit_offset(audit)  # what earlier tests logged is not read again
    runs = Runs(kube, namespace)
    policy = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "brief"},
        "spec": {"version": "v1", "approvalRequiredTiers": [], "retention": {"ttlAfterFinished": "2s"}},
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", policy)
    port = free_port()
    op = OperatorProcess(
        operator_kubeconfig,
        tmp_path / "operators",
        name="one-watch",
        lease_duration=3,
        env={
            "DURABLE_AGENTS_NAMESPACE": namespace,
            "DURABLE_AGENTS_WEBHOOK_PORT": str(free_port()),
            "DURABLE_AGENTS_METRICS_PORT": str(port),
            "DURABLE_AGENTS_STUCK_CHECK_SECONDS": "1",
        },
    )
    op.start()
    try:
        eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
        runs.await_webhook()
        finished = runs.create(
            {"taskType": "t", "objective": "o", "policyRef": {"name": "brief"}, "steps": [DONE]},
            stamped=False,
        )
        orphan = runs.create(
            {"taskType": "t", "objective": "o", "policyRef": {"name": "late"}, "steps": [DONE]}, stamped=False
        )
        waiting = runs.create({"taskType": "t", "objective": "o", "steps": [ASK, DONE]}, stamped=False)

        # Retention: the finished run is deleted after its policy's TTL (2 s).
        eventually(lambda: gone(runs, finished), Within.RUN, f"{finished} deleted by retention")
        # The stuck check: a run whose policy does not exist is marked.
        eventually(
            lambda: stuck_reason(runs.get(orphan)) == "PolicyMissing", Within.COMMIT, f"{orphan} marked Stuck"
        )
        # The census: the run waiting for an answer is counted.
        runs.wait_state(waiting, "waiting_input", timeout=Within.RUN)
        eventually(
            lambda: metric(scrape(port), 'durable_agents_waiting_runs{state="waiting_input"}') == 1,
            Within.COMMIT,
            "the census to count the waiting run",
        )
        assert op.alive, op.log_tail()
    finally:
        op.stop()

    # A watch is logged once as it begins (ResponseStarted), however long it lasts.
    watches = [
        e
        for e in read_audit(audit, offset=offset, user=USER, stage="ResponseStarted")
        if e.verb == "watch" and e.resource == "agentruns"
    ]
    assert len(watches) == 1, f"{len(watches)} AgentRun watches from one operator process: {watches}"
    assert watches[0].namespace == namespace, "the operator watches the namespace it is given"
    # The count means something: the same log shows the process's other watches.
    kinds = {
        e.resource
        for e in read_audit(audit, offset=offset, user=USER, stage="ResponseStarted")
        if e.verb == "watch"
    }
    assert {"actionrecords", "agentpolicies"} <= kinds, kinds
