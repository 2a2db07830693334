"""Governed by default (issue 32, items 1 and 2), against the real API server and operator processes.

- A run that names no policy, in a namespace with no default and a cluster with no baseline, may
  only read: its read step runs, its consequential step ends the run ``PolicyRequired``, and the
  reference system counts 0 requests, with the webhook on and with it off. Once the namespace has
  a default that requires approval, a run there waits for an approval under it.
- Naming a policy is an authority: a user with ``create`` on agentruns but no ``use`` on a
  permissive policy is refused naming the verb; with the webhook off, a run naming it that carries
  no stamp, or a stamp copied from a run that named another policy, is not acted on.

These tests are marked ``ungoverned``: their namespaces get no permissive default (e2e/conftest.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.engine.children import child_run_name
from durable_agents.core.policy_identity import content_digest
from durable_agents.kubectl import why as kubectl_why
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import admitted
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

LEASE = 2
pytestmark = pytest.mark.ungoverned


def read_then_pay(url: str, configmap: str, policy: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "taskType": "payment",
        "objective": "read the limits, then pay",
        "steps": [
            {
                "name": "read",
                "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": configmap}},
            },
            {
                "name": "pay",
                "effect": {
                    "effect": "http.post",
                    "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
                    "arguments": {"amount": 120},
                },
            },
            {"name": "done", "complete": {"result": "paid"}},
        ],
    }
    if policy is not None:
        spec["policyRef"] = {"name": policy}
    return spec


def create_policy(runs: Runs, name: str, *, approvals: bool, **extra: Any) -> dict[str, Any]:
    spec = {
        "version": "1",
        "tiers": {"http.post": "consequential"},
        "approvalRequiredTiers": ["consequential"] if approvals else [],
        "approvalExpiry": "1h",
        **extra,
    }
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }
    made: dict[str, Any] = runs.custom.create_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", body
    )
    return made


def refused(call: Callable[[], Any]) -> str:
    """The API server's refusal message (the webhook's or the schema's); fails if it was accepted."""
    with pytest.raises(client.ApiException) as err:
        call()
    assert err.value.status in (403, 422), err.value.body
    body = err.value.body
    return str(json.loads(body).get("message", body) if isinstance(body, str) else body)


def action_records(runs: Runs) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = runs.custom.list_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "actionrecords"
    )["items"]
    return items


def assert_policy_required(runs: Runs, name: str, refsystem: ReferenceSystemThread) -> dict[str, Any]:
    """The run read, then ended PolicyRequired at its consequential step; nothing was sent."""
    run = runs.wait_state(name, "failed", "completed", timeout=Within.TAKEOVER)
    status = run["status"]
    assert status["state"] == "failed", status.get("outcome")
    assert status["outcome"]["reason"] == "PolicyRequired", status["outcome"]
    assert (
        "http.post is a consequential action and no policy governs this run" in status["outcome"]["message"]
    )
    checkpoint = status["checkpoint"]
    assert [call["tool"] for call in checkpoint["toolCalls"]] == ["kubernetes.read"], "the read step ran"
    assert len(checkpoint["evidence"]) == 1
    assert not checkpoint.get("pendingActions"), "no intent was committed"
    assert "policy" not in checkpoint, "accepted under no policy"
    assert action_records(runs) == [], "nothing in the ledger"
    assert refsystem.counts() == {}, "0 requests at the reference system"
    return run


@pytest.mark.local_plane("webhook")
def test_a_run_no_policy_governs_may_only_read_then_a_namespace_default_governs(
    kube: KubeEnv,
    webhook_operator: Callable[[], OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    readable_configmap: str,
) -> None:
    webhook_operator()
    runs.create(read_then_pay(refsystem.url, readable_configmap), name="ungoverned", stamped=False)
    assert_policy_required(runs, "ungoverned", refsystem)

    # kubectl agentrun why names the fix.
    answer = kubectl_why.why(client.CustomObjectsApi(kube.api), runs.namespace, "ungoverned")
    said = kubectl_why.text(answer)
    assert "spec.default: true" in said, said
    assert "spec.policyRef" in said, said
    assert f"kubectl get agentpolicies -n {runs.namespace}" in said, said

    # The namespace gets a default that requires approval: a new run waits for one under it.
    guarded = create_policy(runs, "guarded", approvals=True, default=True)
    runs.create(read_then_pay(refsystem.url, readable_configmap), name="governed", stamped=False)
    waiting = runs.wait_state("governed", "waiting_approval", timeout=Within.TAKEOVER)
    request = waiting["status"]["approvalRequest"]
    assert "policy guarded@1 requires approval" in request["policyReason"], request
    assert waiting["status"]["checkpoint"]["policy"] == {
        "name": "guarded",
        "version": "1",
        "kind": "AgentPolicy",
        "digest": content_digest(guarded["spec"]),
    }, "the resolved policy is recorded at acceptance"
    assert refsystem.counts() == {}

    # A second default in the namespace is refused at admission, naming the field and the first.
    message = refused(lambda: create_policy(runs, "also-default", approvals=False, default=True))
    assert "spec.default" in message, message
    assert "'guarded'" in message, message
    # mandatory only on a default: the API server's own rule (there with the webhook or without).
    message = refused(lambda: create_policy(runs, "lax", approvals=False, mandatory=True))
    assert "mandatory" in message, message

    # The printer column shows the policy a run was accepted under.
    crd = client.ApiextensionsV1Api(kube.api).read_custom_resource_definition(f"agentruns.{GROUP}")
    columns = {c.name: c.json_path for c in crd.spec.versions[0].additional_printer_columns}
    assert columns["Policy"] == ".status.checkpoint.policy.name"


def test_with_the_webhook_off_a_run_no_policy_governs_sends_nothing(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    readable_configmap: str,
) -> None:
    start_operator("no-webhook", LEASE)  # no webhook anywhere: the operator is the only line
    runs.create(read_then_pay(refsystem.url, readable_configmap), name="ungoverned")
    assert_policy_required(runs, "ungoverned", refsystem)


@pytest.fixture
def dave(kube: KubeEnv, namespace: str) -> client.ApiClient:
    """dave may create runs as the ServiceAccount default, and holds no use on any policy."""
    rules = [rule(GROUP, "agentruns", "get", "list", "create"), rule("", "serviceaccounts", "use")]
    grant(kube, namespace, "dave", rules, name="dave-creates")
    return kube.user_client("dave", [])


def as_user(api: client.ApiClient, runs: Runs, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRun", "metadata": {"name": name}, "spec": spec}
    made: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentruns", body
    )
    return made


@pytest.mark.local_plane("users", "webhook")
def test_naming_a_policy_needs_use_on_it(
    kube: KubeEnv,
    webhook_operator: Callable[[], OperatorProcess],
    runs: Runs,
    dave: client.ApiClient,
    refsystem: ReferenceSystemThread,
    readable_configmap: str,
) -> None:
    create_policy(runs, "guarded", approvals=True, default=True)
    create_policy(runs, "permissive", approvals=False)
    webhook_operator()
    ns = runs.namespace

    message = refused(
        lambda: as_user(dave, runs, "by-dave", read_then_pay(refsystem.url, readable_configmap, "permissive"))
    )
    assert (
        f"user 'dave' may not use agentpolicies/permissive in namespace '{ns}': needs verb 'use'" in message
    )
    assert "spec.policyRef" in message, message

    # The default needs no verb: dave's run naming none waits for an approval under it.
    as_user(dave, runs, "by-default", read_then_pay(refsystem.url, readable_configmap))
    waiting = runs.wait_state("by-default", "waiting_approval", timeout=Within.TAKEOVER)
    assert waiting["status"]["checkpoint"]["policy"]["name"] == "guarded"

    # The default governs that run as if named: its status counts it, and it is not deleted under it.
    def waiting_under_guarded() -> bool:
        policy = runs.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "agentpolicies", "guarded")
        return bool(((policy.get("status") or {}).get("runs") or {}).get("waitingForApproval") == 1)

    eventually(waiting_under_guarded, Within.COMMIT, "the default's status counting the run waiting under it")
    message = refused(
        lambda: runs.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "agentpolicies", "guarded")
    )
    assert "by-default" in message, message

    # With use on that one policy (resourceNames), dave may name it, and its rules govern.
    grant(kube, ns, "dave", rule(GROUP, "agentpolicies", "use", names=["permissive"]), name="dave-permissive")
    eventually(
        lambda: _accepted(
            dave, runs, "named", read_then_pay(refsystem.url, readable_configmap, "permissive")
        ),
        Within.COMMIT,
        "the grant of use on agentpolicies/permissive to be in effect",
    )
    done = runs.wait_state("named", "completed", timeout=Within.TAKEOVER)
    assert done["status"]["checkpoint"]["policy"]["name"] == "permissive"
    assert len(refsystem.counts()) == 1

    # A mandatory default leaves no choice, whatever one may use.
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "agentpolicies", "guarded", {"spec": {"mandatory": True, "version": "2"}}
    )
    message = refused(
        lambda: as_user(
            dave, runs, "elsewhere", read_then_pay(refsystem.url, readable_configmap, "permissive")
        )
    )
    assert "mandatory default AgentPolicy 'guarded'" in message, message
    assert len(refsystem.counts()) == 1


def _accepted(api: client.ApiClient, runs: Runs, name: str, spec: dict[str, Any]) -> bool:
    try:
        as_user(api, runs, name, spec)
    except client.ApiException as err:
        if err.status == 403:
            return False
        raise
    return True


@pytest.mark.local_plane("users", "webhook")
def test_with_the_webhook_off_a_run_naming_a_policy_without_a_stamp_for_it_is_not_acted_on(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    dave: client.ApiClient,
    refsystem: ReferenceSystemThread,
    readable_configmap: str,
) -> None:
    """The webhook is not installed. dave (no use on any policy) creates a run naming the
    permissive policy: it carries no stamp. Someone re-creates a run with a createdBy stamped for
    the guarded policy and switches policyRef to the permissive one: the stamp does not cover it.
    Neither is acted on; a control run, stamped for the policy it names, is."""
    create_policy(runs, "guarded", approvals=True, default=True)
    create_policy(runs, "permissive", approvals=False)
    start_operator("no-webhook", LEASE)

    as_user(dave, runs, "by-dave", read_then_pay(refsystem.url, readable_configmap, "permissive"))
    switched = read_then_pay(refsystem.url, readable_configmap, "permissive")
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": "switched", "namespace": runs.namespace},
        "spec": read_then_pay(refsystem.url, readable_configmap, "guarded"),
    }
    copied = admitted("CREATE", body, None)["createdBy"]  # as the webhook stamped it, for "guarded"
    runs.create({**switched, "createdBy": copied}, name="switched", stamped=False)

    for name, reason in (("by-dave", "Unstamped"), ("switched", "StampInvalid")):
        status = runs.wait_state(name, "failed", "completed", timeout=Within.TAKEOVER)["status"]
        assert status["outcome"]["reason"] == "ServiceAccountNotAuthorized", status["outcome"]
        message = status["outcome"]["message"]
        assert message.startswith(f"{reason}: "), message
        assert "under AgentPolicy 'permissive'" in message, message
        assert [h["event"] for h in status["history"]] == ["rejected"]
        assert not status["checkpoint"]["evidence"], "not even the read ran"
    assert action_records(runs) == []
    assert refsystem.counts() == {}

    # Control: stamped for the policy it names, the same run is acted on (and sent once).
    runs.create(read_then_pay(refsystem.url, readable_configmap, "permissive"), name="control")
    runs.wait_state("control", "completed", timeout=Within.TAKEOVER)
    assert len(refsystem.counts()) == 1


@pytest.mark.local_plane("webhook")
def test_the_cluster_baseline_governs_a_namespace_without_a_default(
    kube: KubeEnv,
    webhook_operator: Callable[[], OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    readable_configmap: str,
) -> None:
    """A ClusterAgentPolicy with default: true governs the runs of a namespace that has no default
    of its own; a second cluster default is refused. Deleted afterwards: it would govern every
    other test's runs."""
    custom = runs.custom
    baseline = f"baseline-{runs.namespace}"
    spec = {
        "version": "b1",
        "default": True,
        "tiers": {"http.post": "consequential"},
        "approvalRequiredTiers": ["consequential"],
    }
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterAgentPolicy", "metadata": {"name": baseline}}
    made = custom.create_cluster_custom_object(GROUP, VERSION, "clusteragentpolicies", {**body, "spec": spec})
    try:
        webhook_operator()
        second = {**body, "metadata": {"name": f"{baseline}-2"}, "spec": spec}
        message = refused(
            lambda: custom.create_cluster_custom_object(GROUP, VERSION, "clusteragentpolicies", second)
        )
        assert "spec.default: the cluster already has a default ClusterAgentPolicy" in message, message
        runs.create(read_then_pay(refsystem.url, readable_configmap), name="baseline-run", stamped=False)
        waiting = runs.wait_state("baseline-run", "waiting_approval", timeout=Within.TAKEOVER)
        assert waiting["status"]["checkpoint"]["policy"] == {
            "name": baseline,
            "version": "b1",
            "kind": "ClusterAgentPolicy",
            "digest": content_digest(made["spec"]),
        }
        assert refsystem.counts() == {}
    finally:
        for name in (baseline, f"{baseline}-2"):
            try:
                custom.delete_cluster_custom_object(GROUP, VERSION, "clusteragentpolicies", name)
            except client.ApiException as err:
                if err.status != 404:
                    raise


@pytest.mark.local_plane("webhook")
def test_a_child_run_inherits_its_parents_policy_without_a_new_use(
    kube: KubeEnv,
    webhook_operator: Callable[[], OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    readable_configmap: str,
) -> None:
    """The parent's creator may use the permissive policy; the child is created by the operator AS
    the run's ServiceAccount, which may create runs but holds no use on any policy: naming its
    parent's policy is no new choice, so it is admitted, and its effect sent under that policy."""
    create_policy(runs, "permissive", approvals=False)
    children = rule(GROUP, "agentruns", "get", "create", "patch")
    grant(kube, runs.namespace, service_account("default", runs.namespace), children, name="start-children")
    webhook_operator()
    child = {"name": "child", "child": read_then_pay(refsystem.url, readable_configmap)}
    parent = {
        "taskType": "tree",
        "objective": "pay through a child",
        "policyRef": {"name": "permissive"},
        "steps": [child, {"name": "done", "complete": {}}],
    }
    runs.create(parent, name="parent", stamped=False)
    runs.wait_state("parent", "completed", timeout=Within.RUN)
    made = runs.get(child_run_name("parent", "child"))
    assert made["spec"]["policyRef"] == {"name": "permissive"}
    assert made["spec"]["createdBy"]["username"] == f"system:serviceaccount:{runs.namespace}:default"
    assert made["status"]["checkpoint"]["policy"]["name"] == "permissive"
    assert len(refsystem.counts()) == 1
