"""The CRDs on a real API server: create and read back, admission rejects bad input by field,
and status writes are optimistic-concurrency controlled by resourceVersion."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.cluster import SPEC_POLICY, KubeEnv
from durable_agents_testkit.eventually import Within, eventually

REPO = Path(__file__).resolve().parents[2]
PLURALS = {"AgentRun": "agentruns", "ActionRecord": "actionrecords", "AgentPolicy": "agentpolicies"}


def sample(name: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((REPO / "config" / "samples" / name).read_text())
    return body


def create(kube: KubeEnv, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = kube.custom().create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURALS[body["kind"]], body
    )
    return out


def rejection(kube: KubeEnv, ns: str, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as err:
        create(kube, ns, body)
    assert err.value.status == 422, err.value.body
    return str(err.value.body)


@pytest.mark.parametrize(
    "name",
    ["agentpolicy-default.yaml", "agentrun-read-ask-complete.yaml", "actionrecord-example.yaml"],
)
def test_each_kind_round_trips(kube: KubeEnv, namespace: str, name: str) -> None:
    body = sample(name)
    if body["kind"] == "AgentRun":
        del body["spec"]["serviceAccountName"]  # defaulted by the generated schema
    created = create(kube, namespace, body)
    read = kube.custom().get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURALS[body["kind"]], body["metadata"]["name"]
    )
    assert read["metadata"]["uid"] == created["metadata"]["uid"]
    for key, value in body["spec"].items():
        assert read["spec"][key] == value, key
    if body["kind"] == "AgentRun":
        assert read["spec"]["serviceAccountName"] == "default"


def test_missing_required_field_is_named(kube: KubeEnv, namespace: str) -> None:
    body = sample("agentrun-read-ask-complete.yaml")
    del body["spec"]["objective"]
    assert "spec.objective: Required value" in rejection(kube, namespace, body)


def test_wrong_enum_is_named(kube: KubeEnv, namespace: str) -> None:
    body = sample("agentrun-read-ask-complete.yaml")
    body["spec"]["agent"]["planner"] = "freestyle"
    message = rejection(kube, namespace, body)
    assert "spec.agent.planner" in message
    assert 'Unsupported value: \\"freestyle\\"' in message or "Unsupported value" in message


def test_step_with_two_kinds_is_rejected(kube: KubeEnv, namespace: str) -> None:
    body = sample("agentrun-read-ask-complete.yaml")
    body["spec"]["steps"][0]["complete"] = {"result": "x"}
    message = rejection(kube, namespace, body)
    # Refused by the spec's ValidatingAdmissionPolicy (api/spec_policy.py), which names the field,
    # not the item; the CRD no longer carries the rule (it would be evaluated on every status write).
    assert "spec.steps[]: exactly one of read, ask, await, effect, complete" in message
    assert "ValidatingAdmissionPolicy" in message


def _rules_in(node: Any) -> list[Any]:
    if isinstance(node, dict):
        found = [node["x_kubernetes_validations"]] if node.get("x_kubernetes_validations") else []
        return found + [rule for child in node.values() for rule in _rules_in(child)]
    if isinstance(node, list):
        return [rule for child in node for rule in _rules_in(child)]
    return []


def test_spec_rules_are_not_evaluated_on_status_writes(kube: KubeEnv, namespace: str) -> None:
    """The AgentRun CRD's spec keeps only the rules of ``region``: the others are the spec policy's,
    matching CREATE and UPDATE of agentruns (not agentruns/status), so the API server does not
    evaluate them on status writes; and the policy still refuses a change of the steps."""
    crd = client.ApiextensionsV1Api(kube.api).read_custom_resource_definition("agentruns.durable-agents.io")
    spec = crd.to_dict()["spec"]["versions"][0]["schema"]["open_apiv3_schema"]["properties"]["spec"]
    rules = sorted(rule["rule"] for found in _rules_in(spec) for rule in found)
    assert rules == ["!has(oldSelf.region) || has(self.region)", "self == oldSelf"]
    policy = client.AdmissionregistrationV1Api(kube.api).read_validating_admission_policy(SPEC_POLICY)
    assert [(r.resources, r.operations) for r in policy.spec.match_constraints.resource_rules] == [
        (["agentruns"], ["CREATE", "UPDATE"])
    ]
    body = sample("agentrun-read-ask-complete.yaml")
    body["metadata"]["name"] = "immutable-steps"
    custom = client.CustomObjectsApi(kube.api)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", body)
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "agentruns",
            "immutable-steps",
            {"spec": {"steps": body["spec"]["steps"][:1]}},
        )
    assert refused.value.status == 422
    assert "spec.steps: steps is immutable" in str(refused.value.body)
    assert "ValidatingAdmissionPolicy" in str(refused.value.body)


def test_oversized_field_is_rejected(kube: KubeEnv, namespace: str) -> None:
    body = sample("agentrun-read-ask-complete.yaml")
    body["spec"]["objective"] = "x" * 5000
    message = rejection(kube, namespace, body)
    assert "spec.objective" in message
    assert "4096" in message


def _patch_spec(kube: KubeEnv, ns: str, name: str, spec: dict[str, Any]) -> ApiException:
    with pytest.raises(ApiException) as err:
        kube.custom().patch_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", name, {"spec": spec})
    assert err.value.status == 422, err.value.body
    return err.value


def test_immutable_fields_cannot_change(kube: KubeEnv, namespace: str) -> None:
    body = sample("agentrun-read-ask-complete.yaml")
    create(kube, namespace, body)
    name = body["metadata"]["name"]
    err = _patch_spec(kube, namespace, name, {"taskType": "something-else"})
    assert "spec.taskType" in str(err.body)
    assert "taskType is immutable" in str(err.body)
    steps = copy.deepcopy(body["spec"]["steps"])
    steps[1]["ask"]["question"] = "a different question"
    assert "steps is immutable" in str(_patch_spec(kube, namespace, name, {"steps": steps}).body)


def test_an_answer_cannot_be_changed_once_given(kube: KubeEnv, namespace: str) -> None:
    body = sample("agentrun-read-ask-complete.yaml")
    create(kube, namespace, body)
    name = body["metadata"]["name"]
    kube.custom().patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentruns", name, {"spec": {"answers": {"req-1": "yes"}}}
    )
    err = _patch_spec(kube, namespace, name, {"answers": {"req-1": "no"}})
    assert "an answer cannot be changed or withdrawn once given" in str(err.body)


def test_stale_status_write_gets_409(kube: KubeEnv, namespace: str) -> None:
    body = sample("agentrun-read-ask-complete.yaml")
    create(kube, namespace, body)
    name = body["metadata"]["name"]
    custom = kube.custom()
    first = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", name)
    second = copy.deepcopy(first)  # a second writer read the same resourceVersion

    first["status"] = {"state": "ready", "stateVersion": 1, "checkpoint": {"schemaVersion": 1}}
    written = custom.replace_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "agentruns", name, first
    )
    assert written["status"]["stateVersion"] == 1
    assert written["metadata"]["resourceVersion"] != second["metadata"]["resourceVersion"]

    second["status"] = {"state": "failed", "stateVersion": 1, "checkpoint": {"schemaVersion": 1}}
    with pytest.raises(ApiException) as err:
        custom.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, "agentruns", name, second)
    assert err.value.status == 409
    now = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", name)
    assert now["status"]["state"] == "ready"


def test_future_checkpoint_is_stored_untouched(kube: KubeEnv, namespace: str) -> None:
    """An older operator must be able to quarantine a newer checkpoint, so the API server keeps it."""
    body = sample("agentrun-read-ask-complete.yaml")
    created = create(kube, namespace, body)
    future = {"schemaVersion": 99, "somethingNew": {"nested": [1, 2, 3]}}
    created["status"] = {"state": "ready", "stateVersion": 1, "checkpoint": future}
    written = kube.custom().replace_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "agentruns", body["metadata"]["name"], created
    )
    assert written["status"]["checkpoint"] == future
    created = kube.custom().get_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentruns", body["metadata"]["name"]
    )
    created["status"]["checkpoint"] = {"noVersion": True}
    with pytest.raises(ApiException) as err:
        kube.custom().replace_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "agentruns", body["metadata"]["name"], created
        )
    assert "status.checkpoint.schemaVersion: Required value" in str(err.value.body)


def test_status_cannot_be_set_through_the_main_resource(kube: KubeEnv, namespace: str) -> None:
    body = sample("agentrun-read-ask-complete.yaml")
    body["status"] = {"state": "completed", "stateVersion": 42}
    created = create(kube, namespace, body)
    assert "status" not in created or created["status"].get("state") != "completed"


def test_duplicate_step_names_are_rejected(kube: KubeEnv, namespace: str) -> None:
    body = sample("agentrun-read-ask-complete.yaml")
    body["spec"]["steps"][2]["name"] = body["spec"]["steps"][1]["name"]
    message = rejection(kube, namespace, body)
    assert "spec.steps" in message
    assert "step names must be unique" in message


def test_empty_question_is_rejected(kube: KubeEnv, namespace: str) -> None:
    body = sample("agentrun-read-ask-complete.yaml")
    body["spec"]["steps"][1]["ask"]["question"] = ""
    assert "spec.steps[1].ask.question" in rejection(kube, namespace, body)


def _status_write(kube: KubeEnv, ns: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    custom = kube.custom()
    current = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "actionrecords", name)
    out: dict[str, Any] = custom.replace_namespaced_custom_object_status(
        GROUP, VERSION, ns, "actionrecords", name, {**current, "status": status}
    )
    return out


def test_an_intent_under_a_first_claim_cannot_be_claimed(kube: KubeEnv, namespace: str) -> None:
    """The API server keeps a dispatcher that knows no first claims (an earlier release) from
    claiming an intent its first claimant may be sending: intent -> dispatching is refused."""
    claimed = sample("actionrecord-example.yaml")
    claimed["metadata"]["name"] = "first-claimed"
    claimed["spec"]["firstClaim"] = {"holder": "op-a", "expiresAt": "2030-01-01T00:00:00Z"}
    create(kube, namespace, claimed)
    plain = sample("actionrecord-example.yaml")
    plain["metadata"]["name"] = "plain"
    create(kube, namespace, plain)

    claim = {"state": "dispatching", "attempts": 1, "claimedBy": "old-release"}
    with pytest.raises(ApiException) as err:
        _status_write(kube, namespace, "first-claimed", claim)
    assert err.value.status == 422
    assert "never claimed from intent" in str(err.value.body)
    # Without a first claim, a claim is what it always was.
    assert _status_write(kube, namespace, "plain", claim)["status"]["state"] == "dispatching"
    # Its holder's answer, or the give-up once it expired, may follow the intent; and after an
    # unknown outcome found not applied, a claim and a new send are allowed again.
    given_up = {"state": "outcome_unknown", "attempts": 1, "reason": "ClaimExpired"}
    assert _status_write(kube, namespace, "first-claimed", given_up)["status"]["state"] == "outcome_unknown"
    assert _status_write(kube, namespace, "first-claimed", claim)["status"]["state"] == "dispatching"


def status_fields(run: dict[str, Any]) -> dict[str, Any]:
    """What managedFields record for the status subresource's writes (its fieldsV1)."""
    (entry,) = [m for m in run["metadata"]["managedFields"] if m.get("subresource") == "status"]
    fields: dict[str, Any] = entry["fieldsV1"]
    return fields


CHECKPOINT = {
    "schemaVersion": 1,
    "evidence": [{"source": "kubernetes.read", "digest": "sha256:" + "a" * 64}],
    "toolCalls": [{"tool": "kubernetes.read", "step": "read", "at": "2026-12-05T08:00:00Z"}],
    "agent": {"turns": [{"tool": "refund", "outcome": "succeeded"}], "usageTotal": {"inputTokens": 9}},
}
CONDITION = {
    "type": "Ready",
    "status": "True",
    "reason": "Completed",
    "message": "done",
    "lastTransitionTime": "2026-12-05T08:00:00Z",
}


def test_the_status_is_one_field_to_managed_fields(kube: KubeEnv, namespace: str) -> None:
    """The API server tracks the status as one field (x-kubernetes-map-type: atomic), not one per
    leaf: every status write would otherwise build and store a field set as large as the status."""
    body = sample("agentrun-read-ask-complete.yaml")
    created = create(kube, namespace, body)
    status = {"state": "ready", "stateVersion": 1, "checkpoint": CHECKPOINT, "conditions": [CONDITION]}
    created["status"] = status
    written = kube.custom().replace_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "agentruns", body["metadata"]["name"], created
    )
    assert written["status"] == status
    assert status_fields(written) == {"f:status": {}}, "no leaf of the status is tracked"


UPGRADE_GROUP = "upgrade-probe.durable-agents.test"


def upgrade_probe_crd(atomic: bool) -> dict[str, Any]:
    """The AgentRun CRD under a group of this test's own (the shared one is left alone), with the
    status atomic as now or a field per leaf as the previous release stored it."""
    crd: dict[str, Any] = yaml.safe_load((REPO / "crds" / "durable-agents.io_agentruns.yaml").read_text())
    crd["metadata"] = {"name": f"agentruns.{UPGRADE_GROUP}"}
    crd["spec"]["group"] = UPGRADE_GROUP
    for version in crd["spec"]["versions"]:
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status.get("x-kubernetes-map-type") == "atomic", "the CRD as generated"
        if not atomic:
            del status["x-kubernetes-map-type"]
    return crd


def test_a_run_stored_with_a_field_per_leaf_takes_status_writes_whole(kube: KubeEnv, namespace: str) -> None:
    """The upgrade: runs stored under the previous release's CRD carry managedFields naming each
    leaf of their status. Once the CRD makes the status atomic, their status writes still succeed
    and replace the status whole, and the field set collapses to one field."""
    ext = client.ApiextensionsV1Api(kube.api)
    crd = upgrade_probe_crd(atomic=False)
    name = crd["metadata"]["name"]
    ext.create_custom_resource_definition(crd)
    try:
        custom = kube.custom()
        body = sample("agentrun-read-ask-complete.yaml")
        body["apiVersion"] = f"{UPGRADE_GROUP}/{VERSION}"

        def created() -> dict[str, Any] | None:
            try:
                out: dict[str, Any] = custom.create_namespaced_custom_object(
                    UPGRADE_GROUP, VERSION, namespace, "agentruns", body
                )
            except ApiException as err:
                if err.status == 404:  # not served yet
                    return None
                raise
            return out

        run = eventually(created, Within.TAKEOVER, "the probe CRD to serve", interval=0.1)
        run_name = run["metadata"]["name"]
        status = {"state": "ready", "stateVersion": 1, "checkpoint": CHECKPOINT, "conditions": [CONDITION]}
        run["status"] = status
        run = custom.replace_namespaced_custom_object_status(
            UPGRADE_GROUP, VERSION, namespace, "agentruns", run_name, run
        )
        leaves = status_fields(run)["f:status"]
        assert "f:schemaVersion" in leaves["f:checkpoint"], "stored as the previous release stores it"
        assert 'k:{"type":"Ready"}' in leaves["f:conditions"]

        current = ext.read_custom_resource_definition(name)
        atomic = upgrade_probe_crd(atomic=True)
        atomic["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(name, atomic)

        version = 1

        def written_whole() -> bool:
            # Each write under either schema must succeed; the field set says which one served it.
            nonlocal run, version
            version += 1
            later = {"state": "completed", "stateVersion": version, "checkpoint": {"schemaVersion": 1}}
            run["status"] = later
            run = custom.replace_namespaced_custom_object_status(
                UPGRADE_GROUP, VERSION, namespace, "agentruns", run_name, run
            )
            assert run["status"] == later, "the status is replaced whole, nothing merged from before"
            return status_fields(run) == {"f:status": {}}

        eventually(written_whole, Within.TAKEOVER, "a status write under the atomic status", interval=0.1)
        stored = custom.get_namespaced_custom_object(UPGRADE_GROUP, VERSION, namespace, "agentruns", run_name)
        assert stored["status"] == run["status"]
        assert "conditions" not in stored["status"]
    finally:
        ext.delete_custom_resource_definition(name)
