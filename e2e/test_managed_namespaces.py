"""Namespaces opt in: the operator acts as a run's ServiceAccount only where a RoleBinding lets it
(issue 37, item 1). A run in a namespace that has not opted in is left alone with the condition
``NamespaceNotManaged`` naming the fix, and no request is refused on its behalf (no 403 loop: the
operator asks once per namespace, a SelfSubjectAccessReview); once the namespace opts in, the run
goes on where it was. A namespace that opts out while its runs live leaves them where they are:
not failed, marked, and they go on when it opts back in.

The operators here keep their Leases in the test's namespace (managed, as every test namespace is)
and watch another one, ``team``, whose opt-in the test controls (e2e/conftest.py's rights otherwise:
the chart's cluster-wide rules; testkit operator_rights).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.shell.ownership.leases import lease_name
from durable_agents_testkit.audit import read_audit
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.governance import permissive_default
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.operator_rights import OPERATOR_USER, manage
from durable_agents_testkit.rbac import grant, rule, service_account
from durable_agents_testkit.runs import Runs, read_ask_await_complete

pytestmark = pytest.mark.local_plane("audit")

NOT_MANAGED = "NamespaceNotManaged"
READ = {"read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": "settings"}}}
READ_ASK_READ = {
    "taskType": "e2e",
    "objective": "read, confirm with a human, read again, finish",
    "steps": [
        {"name": "read-settings", **READ},
        {"name": "confirm", "ask": {"question": "proceed?", "expiresIn": "1h"}},
        {"name": "read-again", **READ},
        {"name": "done", "complete": {"result": "ok"}},
    ],
}
DONE_ONLY = {
    "taskType": "e2e",
    "objective": "finish",
    "steps": [{"name": "done", "complete": {"result": "ok"}}],
}
READ_REFUSED = "get configmaps/settings"  # the one read the API server refused the operator


@pytest.fixture
def team(kube: KubeEnv) -> Iterator[Runs]:
    """A namespace that has NOT opted in: its default ServiceAccount may read the ConfigMap
    ``settings``, its runs are governed by a permissive default policy."""
    name = f"team-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(kube.api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    core.create_namespaced_config_map(name, {"metadata": {"name": "settings"}, "data": {"maxSurge": "25%"}})
    reads = rule("", "configmaps", "get", names=["settings"])
    grant(kube, name, service_account("default", name), reads, name="read-settings")
    permissive_default(kube.api, name)
    yield Runs(kube, name)
    core.delete_namespace(name, propagation_policy="Background")


def not_managed(run: dict[str, Any]) -> dict[str, Any] | None:
    for condition in (run.get("status") or {}).get("conditions") or []:
        if condition.get("type") == NOT_MANAGED and condition.get("status") == "True":
            return dict(condition)
    return None


def may_impersonate(kube: KubeEnv, namespace: str) -> bool:
    """What the API server's authorizer answers now (RBAC changes reach it a moment later)."""
    attributes = {"namespace": namespace, "verb": "impersonate", "group": "", "resource": "serviceaccounts"}
    review = {"spec": {"user": OPERATOR_USER, "resourceAttributes": attributes}}
    answer = client.AuthorizationV1Api(kube.api).create_subject_access_review(review)
    return bool(answer.status.allowed)


def opt_out(kube: KubeEnv, namespace: str) -> None:
    client.RbacAuthorizationV1Api(kube.api).delete_namespaced_role_binding(OPERATOR_USER, namespace)
    eventually(lambda: not may_impersonate(kube, namespace), Within.MOMENT, "the opt-out in effect")


def refused_for(plane: LocalControlPlane, namespace: str, since: datetime) -> list[str]:
    """The operator's requests in ``namespace`` the API server refused (403), from its audit log."""
    entries = read_audit(plane.audit_log_path, user=OPERATOR_USER, since=since, mentions=namespace)
    return [f"{e.verb} {e.what}/{e.name}" for e in entries if e.code == 403 and e.namespace == namespace]


def reviews(plane: LocalControlPlane, since: datetime) -> int:
    path, reviewed = plane.audit_log_path, "selfsubjectaccessreviews"
    entries = read_audit(path, user=OPERATOR_USER, since=since, mentions=reviewed)
    return sum(1 for e in entries if e.resource == "selfsubjectaccessreviews")


def test_a_run_where_the_operator_may_not_act_is_marked_and_goes_on_once_the_namespace_opts_in(
    kube: KubeEnv,
    plane: LocalControlPlane,
    namespace: str,
    team: Runs,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    since = datetime.now(UTC)
    start_operator(DURABLE_AGENTS_NAMESPACE=team.namespace, DURABLE_AGENTS_LEASE_NAMESPACE=namespace)
    name = team.create(read_ask_await_complete("settings", answered=True))

    marked = eventually(lambda: not_managed(team.get(name)), Within.RUN, f"{name} marked {NOT_MANAGED}")
    assert marked["reason"] == "NoRoleBinding"
    assert team.namespace in marked["message"], marked
    assert "managedNamespaces" in marked["message"], marked
    assert "kubectl create rolebinding" in marked["message"], "the condition names the fix"
    run = team.get(name)
    assert (run.get("status") or {}).get("state") in (None, "pending"), "left alone: not started, not failed"
    warned = eventually(
        lambda: [e for e in team.events(name) if e.reason == NOT_MANAGED], Within.COMMIT, "the Warning Event"
    )
    assert warned[0].type == "Warning"
    # Looked at again while it waits (one review per namespace every few seconds), never as its
    # ServiceAccount: the API server refused the operator nothing there.
    eventually(lambda: reviews(plane, since) >= 3, Within.TAKEOVER, "the namespace asked about again")
    assert refused_for(plane, team.namespace, since) == [], "a request as the run's ServiceAccount was made"
    assert not_managed(team.get(name)) is not None

    manage(kube, team.namespace, leases=False)  # the documented opt-in: one RoleBinding
    done = team.wait_state(name, "completed", timeout=Within.RUN)
    assert not_managed(done) is None, "the condition is removed once the namespace is managed"
    [evidence] = done["status"]["checkpoint"]["evidence"]
    assert (evidence["kind"], evidence["name"]) == ("ConfigMap", "settings"), "read as its ServiceAccount"
    assert refused_for(plane, team.namespace, since) == []


def test_a_namespace_that_opts_out_leaves_its_runs_where_they_are_until_it_opts_back_in(
    kube: KubeEnv,
    plane: LocalControlPlane,
    namespace: str,
    team: Runs,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    since = datetime.now(UTC)
    manage(kube, team.namespace, leases=False)
    start_operator(DURABLE_AGENTS_NAMESPACE=team.namespace, DURABLE_AGENTS_LEASE_NAMESPACE=namespace)
    name = team.create(READ_ASK_READ)
    parked = team.wait_state(name, "waiting_input", timeout=Within.RUN)  # read as its ServiceAccount
    assert not_managed(parked) is None

    opt_out(kube, team.namespace)
    # The answer resumes it: its next step reads as its ServiceAccount, which the operator may no
    # longer do. The refusal is not the run's failure: it waits, marked.
    team.patch_spec(name, {"answers": {"confirm": "yes"}})
    marked = eventually(lambda: not_managed(team.get(name)), Within.RUN, f"{name} marked {NOT_MANAGED}")
    assert team.namespace in marked["message"]
    run = team.get(name)
    assert run["status"]["state"] == "waiting_input", "left where it was, not failed"
    assert "outcome" not in run["status"] or not run["status"]["outcome"]
    listed = [r["metadata"]["name"] for r in team.all() if not_managed(r)]
    assert listed == [name], "the namespace's runs are listed by their condition"

    manage(kube, team.namespace, leases=False)
    done = team.wait_state(name, "completed", timeout=Within.RUN)
    assert not_managed(done) is None
    assert done["status"]["outcome"]["result"] == "ok"
    assert len(done["status"]["checkpoint"]["evidence"]) == 2, "both reads made, as its ServiceAccount"
    assert refused_for(plane, team.namespace, since) == [READ_REFUSED], "refused once, not in a loop"


def test_a_lease_of_an_earlier_release_renewed_while_the_run_waits_keeps_it_waiting(
    kube: KubeEnv, plane: LocalControlPlane, runs: Runs, start_operator: Callable[..., OperatorProcess]
) -> None:
    """Per-run Leases of an earlier release are read (``get``, in a managed namespace), never
    watched cluster-wide: a Lease its old holder renews after the operator first read it is read
    again before the run is advanced, so the run waits for the renewed expiry, not the first."""
    name = runs.create(DONE_ONLY, name="held-by-old")
    uid = runs.get(name)["metadata"]["uid"]
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRun", "name": name, "uid": uid}
    duration = 10
    leases = client.CoordinationV1Api(kube.api)

    def renew() -> datetime:
        spec = {"renewTime": _micro()}
        lease = leases.patch_namespaced_lease(lease_name(name), runs.namespace, {"spec": spec})
        return lease.spec.renew_time  # type: ignore[no-any-return]

    held = leases.create_namespaced_lease(
        runs.namespace,
        {
            "metadata": {"name": lease_name(name), "labels": {RUN_LABEL: name}, "ownerReferences": [owner]},
            "spec": {
                "holderIdentity": "old-release-pod",
                "leaseDurationSeconds": duration,
                "renewTime": _micro(),
            },
        },
    )
    renewals = [held.spec.renew_time]
    since = datetime.now(UTC)
    start_operator()

    def read_by_operator() -> bool:
        entries = read_audit(plane.audit_log_path, user=OPERATOR_USER, since=since, mentions=lease_name(name))
        if any(e.resource == "leases" and e.verb == "get" and e.code == 200 for e in entries):
            return True
        # The old holder goes on renewing, as a live pod of that release does, however long the
        # operator takes to start (a slow machine must not let the Lease lapse before the read).
        if datetime.now(UTC) - renewals[-1] > timedelta(seconds=1):
            renewals.append(renew())
        return False

    what = "the operator to read the old release's Lease"
    eventually(read_by_operator, Within.TAKEOVER, what, interval=0.5)
    renewals.append(renew())  # after the operator's first read
    gaps = [later - earlier for earlier, later in itertools.pairwise(renewals)]
    assert max(gaps) < timedelta(seconds=duration), f"renewed while live: {gaps}"
    expires = renewals[-1] + timedelta(seconds=duration)
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    first = datetime.fromisoformat(done["status"]["history"][0]["at"])
    assert first >= expires, f"advanced at {first}, before the renewed Lease expired at {expires}"


def _micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
