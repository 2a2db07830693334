"""The AgentRun spec policy and its second line.

The spec's CEL rules are checked by a ValidatingAdmissionPolicy on writes of the spec (not in the
CRD, where the API server would evaluate them on every status write: api/spec_policy.py). A
cluster can lack the policy (CRDs applied without the chart): then a change of what a run was
accepted to do reaches the operator, which must not act on it (core/plan_guard.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from durable_agents_testkit.cluster import SPEC_POLICY, KubeEnv, install_spec_policy
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

REPO = Path(__file__).resolve().parents[1]
POLICY_BODY = REPO / "charts/durable-agents/files/agentrun-spec-policy.yaml"


def asking() -> dict[str, Any]:
    return {
        "taskType": "e2e",
        "objective": "ask, then finish",
        "steps": [{"name": "confirm", "ask": {"question": "go on?"}}, {"name": "done", "complete": {}}],
    }


def with_an_effect(url: str) -> list[dict[str, Any]]:
    """The steps someone would slip in: an effect the run's creator never asked for."""
    pay = {
        "name": "pay",
        "effect": {
            "effect": "http.post",
            "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
            "arguments": {"amount": 120},
        },
    }
    return [{"name": "confirm", "ask": {"question": "go on?"}}, pay, {"name": "done", "complete": {}}]


@pytest.fixture
def policy_removed(kube: KubeEnv) -> Iterator[Callable[[], None]]:
    """Deletes the spec policy's binding when called (as on a cluster without it); put back after."""
    api = client.AdmissionregistrationV1Api(kube.api)

    def remove() -> None:
        api.delete_validating_admission_policy_binding(SPEC_POLICY)

    yield remove
    install_spec_policy(kube.api, POLICY_BODY)


def test_without_the_spec_policy_a_changed_spec_is_quarantined_and_nothing_is_sent(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    policy_removed: Callable[[], None],
) -> None:
    start_operator("op", 2)
    name = runs.create(asking(), name="changed")
    runs.wait_state(name, "waiting_input")
    changed = {"steps": with_an_effect(refsystem.url)}

    # The first line: the policy refuses the change, naming the field.
    with pytest.raises(client.ApiException) as refused:
        runs.patch_spec(name, changed, stamped=False)
    message = str(json.loads(refused.value.body)["message"])
    assert refused.value.status == 422, message
    assert "spec.steps: steps is immutable" in message

    # Without it, the change is stored; the operator acts on nothing of it.
    policy_removed()

    def stored() -> bool:
        try:
            runs.patch_spec(name, changed, stamped=False)
        except client.ApiException as err:
            if err.status == 422 and "ValidatingAdmissionPolicy" in str(err.body):
                return False  # the API server still has the binding
            raise
        return True

    eventually(stored, Within.COMMIT, "the API server to stop enforcing the spec policy")
    runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    run = runs.wait_state(name, "quarantined", timeout=Within.COMMIT)
    assert run["status"]["outcome"]["reason"] == "SpecChanged", run["status"]["outcome"]
    assert "cannot change once the run exists" in run["status"]["outcome"]["message"]
    assert refsystem.counts() == {}, "an effect the run was never accepted to send was sent"
    assert (
        runs.custom.list_namespaced_custom_object(
            "durable-agents.io", "v1alpha1", runs.namespace, "actionrecords"
        )["items"]
        == []
    )
