"""Health for GitOps tools, on objects the operator wrote on a real API server: kstatus itself
(Flux, kpt) and the chart's Argo CD health checks read a completed, a failed, a waiting-for-approval,
a quarantined run, one pending on a missing policy, and an AgentPolicy, as the health table
(durable_agents_testkit.health) says. The policy's status (the policy status writer) says its
digest, version history and the runs it governs, follows a new version, and is not written again
when nothing changed (its own write triggers no other).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.policy_identity import content_digest
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.health import POLICY_READY, RUN_HEALTH, ArgoCD, Health, kstatus
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

REPO = Path(__file__).resolve().parents[1]
DONE = {"name": "done", "complete": {"result": "done"}}
QUIET = 3  # seconds a settled policy is watched for a write it should not get


def create_policy(runs: Runs, name: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)


def get_policy(runs: Runs, name: str) -> dict[str, Any]:
    out: dict[str, Any] = runs.custom.get_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", name
    )
    return out


def policy_when(runs: Runs, name: str, test: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        policy = get_policy(runs, name)
        return policy if test(policy.get("status") or {}) else None

    return eventually(seen, Within.COMMIT, f"AgentPolicy {name}: {what}")


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    found: dict[str, Any] | None = next(
        (c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), None
    )
    assert found is not None, f"{obj['metadata']['name']} has no {kind} condition: {obj.get('status')}"
    return found


def test_runs_and_a_policy_read_as_the_health_table_says(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    spec = {"version": "v1", "tiers": {"http.post": "consequential"}}
    create_policy(runs, "guarded", spec)
    start_operator("health", 3)
    pay = {"effect": "http.post", "target": {"url": f"{refsystem.url}/effects"}, "arguments": {"n": 1}}
    read = {
        "name": "read",
        "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": "kube-root-ca.crt"}},
    }
    ask = {"name": "ask", "ask": {"question": "which one?", "expiresIn": "1h"}}
    done = runs.create({"taskType": "t", "objective": "o", "steps": [DONE]})
    failed = runs.create({"taskType": "t", "objective": "o", "steps": [read, DONE]})  # its SA may not read
    waiting = runs.create(
        {
            "taskType": "t",
            "objective": "o",
            "policyRef": {"name": "guarded"},
            "steps": [{"name": "pay", "effect": pay}, DONE],
        }
    )
    orphan = runs.create({"taskType": "t", "objective": "o", "policyRef": {"name": "late"}, "steps": [DONE]})
    forged = runs.create({"taskType": "t", "objective": "o", "steps": [ask, DONE]})

    runs.wait_state(done, "completed", timeout=Within.COMMIT)
    runs.wait_state(failed, "failed", timeout=Within.COMMIT)
    runs.wait_state(waiting, "waiting_approval", timeout=Within.COMMIT)
    runs.wait_state(forged, "waiting_input", timeout=Within.COMMIT)
    eventually(lambda: "finalizers" in runs.get(forged)["metadata"], Within.COMMIT, "the retention finalizer")
    current = runs.get(forged)
    current["status"]["stateVersion"] += 1  # written by someone other than the operator: quarantined
    client.CustomObjectsApi(kube.api).replace_namespaced_custom_object_status(
        GROUP, VERSION, runs.namespace, "agentruns", forged, current
    )
    runs.wait_state(forged, "quarantined", timeout=Within.COMMIT)
    eventually(
        lambda: (runs.get(orphan).get("status") or {}).get("waitingFor") == "agentpolicy:late",
        Within.COMMIT,
        "the orphan run to say it waits for its policy",
    )

    # --- the policy's status: Ready, its identity, the runs it governs ---------------------
    policy = policy_when(
        runs, "guarded", lambda s: (s.get("runs") or {}).get("waitingForApproval") == 1, "1 run waiting"
    )
    status = policy["status"]
    first = content_digest(policy["spec"])  # the spec as stored: with the API server's defaults
    assert first != content_digest(spec)  # (so the writer digests what is stored, not what was sent)
    assert status["observedGeneration"] == policy["metadata"]["generation"]
    assert status["contentDigest"] == first
    assert status["versions"] == [{"version": "v1", "contentDigest": first}]
    assert (condition(policy, "Ready")["status"], condition(policy, "Stalled")["status"]) == ("True", "False")
    assert status["runs"] == {"running": 0, "waitingForApproval": 1, "stuck": 0}

    # --- both judges over what the operator wrote -------------------------------------------
    expected: list[tuple[dict[str, Any], Health, str | None]] = [
        (runs.get(done), RUN_HEALTH[RunState.COMPLETED], None),
        (runs.get(failed), RUN_HEALTH[RunState.FAILED], "Forbidden"),
        (runs.get(waiting), RUN_HEALTH[RunState.WAITING_APPROVAL], "WaitingApproval"),
        (runs.get(forged), RUN_HEALTH[RunState.QUARANTINED], runs.get(forged)["status"]["outcome"]["reason"]),
        (runs.get(orphan), RUN_HEALTH[RunState.PENDING], "PolicyMissing"),
        (policy, POLICY_READY, None),
    ]
    objects = [obj for obj, _, _ in expected]
    argocd = ArgoCD()
    for obj, (health, judged) in zip(
        objects, zip([e[1] for e in expected], kstatus(objects), strict=True), strict=True
    ):
        name = f"{obj['kind']} {obj['metadata']['name']}"
        lua = argocd.health(obj)
        assert (judged.status, lua.status) == (health.kstatus, health.argocd), (
            name,
            judged,
            lua,
            obj.get("status"),
        )
    for obj, _, reason in expected:
        if reason is not None:
            [judged] = kstatus([obj])
            assert judged.reason == reason, (obj["metadata"]["name"], judged)
            assert argocd.health(obj).message.startswith(f"{reason}:"), obj["metadata"]["name"]

    # --- a new version: the status follows it, the history keeps both ------------------------
    spec2 = {
        "version": "v2",
        "tiers": {"http.post": "consequential"},
        "approvalRequiredTiers": ["consequential"],
    }
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "guarded", {"spec": spec2}
    )
    policy = policy_when(runs, "guarded", lambda s: len(s.get("versions") or []) == 2, "two versions")
    assert policy["status"]["observedGeneration"] == policy["metadata"]["generation"]
    second = content_digest(policy["spec"])
    assert second != first
    assert policy["status"]["contentDigest"] == second
    assert policy["status"]["versions"] == [
        {"version": "v1", "contentDigest": first},
        {"version": "v2", "contentDigest": second},
    ]

    # --- no write loop: a settled policy is not written again --------------------------------
    settled = policy["metadata"]["resourceVersion"]
    events = list(
        watch.Watch().stream(
            runs.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            runs.namespace,
            "agentpolicies",
            field_selector="metadata.name=guarded",
            resource_version=settled,
            timeout_seconds=QUIET,
        )
    )
    assert events == [], [(e["type"], e["object"]["metadata"]["resourceVersion"]) for e in events]


@pytest.mark.local_plane("users")
def test_only_the_operator_writes_a_policy_status(kube: KubeEnv, runs: Runs) -> None:
    """The version history admission reads is the operator's: someone RBAC lets patch
    agentpolicies/status (too broad a grant) is refused by the chart's ValidatingAdmissionPolicy."""
    ns = runs.namespace
    create_policy(runs, "guarded", {"version": "v1"})
    grant(kube, ns, "eve", rule(GROUP, "agentpolicies/status", "get", "update", "patch"), name="over-broad")
    eve = client.CustomObjectsApi(kube.user_client("eve", ["forgers"]))
    api = client.AdmissionregistrationV1Api(kube.api)
    name = f"operator-writes-{ns}"
    body = yaml.safe_load((REPO / "charts/durable-agents/files/admission-policy.yaml").read_text())
    api.create_validating_admission_policy(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {"variables": [{"name": "operator", "expression": "'durable-agents-operator'"}], **body},
        }
    )
    api.create_validating_admission_policy_binding(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
            },
        }
    )
    forged = {"status": {"versions": [{"version": "v1", "contentDigest": "sha256:" + "0" * 64}]}}

    def patch(**dry: str) -> str | None:
        try:
            eve.patch_namespaced_custom_object_status(
                GROUP, VERSION, ns, "agentpolicies", "guarded", forged, **dry
            )
        except client.ApiException as err:
            return str(err.body) if err.status in (403, 422) and "may not" in str(err.body) else None
        return None

    try:
        # A dry run (admitted, never stored) until the policy is enforced (its informer), then for real.
        eventually(lambda: patch(dry_run="All"), Within.COMMIT, "the admission policy to be enforced")
        message = patch()
        assert message is not None, "eve's status patch was accepted"
        assert "durable-agents: eve may not UPDATE agentpolicies/status" in message, message
        assert "writes ActionRecords and the status of AgentRuns and AgentPolicies" in message, message
    finally:
        api.delete_validating_admission_policy_binding(name)
        api.delete_validating_admission_policy(name)
    assert not (get_policy(runs, "guarded").get("status") or {}).get("versions"), "the forgery was stored"
