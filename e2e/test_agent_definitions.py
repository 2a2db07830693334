"""Runs of an Agent (spec.agentRef): the definition pinned at acceptance, and what a change of
the Agent under a running run does (the policy's freshness.definitionChanged).

Real API server, the operator as a separate process (its own user, the chart's RBAC: get on
agents and modelconfigs), the reference model server (which records every request, the system
prompt included) and the reference authoritative system (which counts applications). The Agent,
ModelConfig and run are config/samples/agent-refunds.yaml's; the prompt, key, RBAC and policy
config/samples/agentrun-model.yaml's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.policy_integrity import FORCE_DELETE
from durable_agents.kubectl import main as kubectl_plugin
from durable_agents_testkit.agent_sample import API_KEY, install_sample, script
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.rbac import grant, rule
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "config/samples/agent-refunds.yaml"
OLD_PROMPT_LINE = "You are a refunds agent."
NEW_PROMPT = "You are a NEW refunds agent. Refund whatever is asked."


def sample_of(kind: str) -> dict[str, Any]:
    docs = [doc for doc in yaml.safe_load_all(SAMPLE.read_text()) if doc]
    found: dict[str, Any] = next(doc for doc in docs if doc["kind"] == kind)
    return found


@pytest.fixture
def model() -> Iterator[ModelServerThread]:
    with ModelServerThread(script(), api_key=API_KEY) as server:
        yield server


@pytest.fixture
def agent_namespace(kube: KubeEnv, namespace: str) -> str:
    install_sample(kube.api, namespace)
    return namespace


def define_agent(
    runs: Runs, model: ModelServerThread, refsystem: ReferenceSystemThread, policy: str | None = None
) -> None:
    """The sample's ModelConfig and Agent, pointed at the reference servers; the sample policy's
    freshness.definitionChanged set to ``policy`` (unset: its default, keep)."""
    config = sample_of("ModelConfig")
    config["spec"]["baseUrl"] = model.base_url
    agent = sample_of("Agent")
    for tool in agent["spec"]["tools"]:
        if "effect" in tool:
            tool["effect"]["target"] = {
                "url": f"{refsystem.url}/effects",
                "queryUrl": f"{refsystem.url}/effects",
            }
    for plural, body in (("modelconfigs", config), ("agents", agent)):
        runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, plural, body)
    if policy is not None:
        runs.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            runs.namespace,
            "agentpolicies",
            "refunds",
            {"spec": {"version": "2026-12-01.2", "freshness": {"definitionChanged": policy}}},
        )


def run_of_agent(runs: Runs) -> str:
    return runs.create(sample_of("AgentRun")["spec"])


def change_agent(kube: KubeEnv, runs: Runs) -> None:
    """The Agent's prompt (its ConfigMap) and its model (the ModelConfig) changed."""
    client.CoreV1Api(kube.api).patch_namespaced_config_map(
        "refund-agent-prompt", runs.namespace, {"data": {"v1": NEW_PROMPT}}
    )
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "modelconfigs", "refunds-model", {"spec": {"model": "another-model"}}
    )


def approve(runs: Runs, name: str, request: dict[str, Any]) -> None:
    runs.patch_spec(
        name, {"approvals": {request["requestId"]: {"digest": request["digest"], "decision": "approve"}}}
    )


def system_prompts(model: ModelServerThread) -> list[str]:
    requests: list[dict[str, Any]] = model.calls()["requests"]  # type: ignore[assignment]
    return [str(r["messages"][0]["content"]) for r in requests]


def condition(run: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (run.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def test_keep_both_runs_complete_with_the_pinned_prompt_and_model(
    start_operator: Any,
    kube: KubeEnv,
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    op = start_operator("defs")
    define_agent(runs, model, refsystem)
    names = [run_of_agent(runs), run_of_agent(runs)]
    requests = {name: runs.wait_state(name, "waiting_approval", timeout=90)["status"] for name in names}
    pinned = {name: runs.get(name)["status"]["checkpoint"]["definition"] for name in names}
    assert len({p["digest"] for p in pinned.values()}) == 1, "both runs pinned the same definition"
    assert OLD_PROMPT_LINE in pinned[names[0]]["systemPrompt"]
    assert pinned[names[0]]["limits"] == {"maxModelCalls": 16}, "the Agent's default limits"

    change_agent(kube, runs)
    for name in names:  # the operator sees the change and says it kept the pinned definition
        kept = eventually(
            lambda n=name: condition(runs.get(n), "DefinitionChanged"),
            Within.TAKEOVER * 3,
            f"{name} to say its Agent changed",
        )
        assert kept["reason"] == "PinnedDefinitionKept"
        assert "policy: keep" in kept["message"]
    for name in names:
        approve(runs, name, requests[name]["approvalRequest"])
    for name in names:
        done = runs.wait_state(name, "completed", timeout=90)
        assert done["status"]["checkpoint"]["definition"]["digest"] == pinned[name]["digest"]
        assert done["status"]["checkpoint"]["agent"]["model"] == "scripted-refunds", "the pinned model"
    prompts = system_prompts(model)
    assert prompts, "the model was called"
    assert all(OLD_PROMPT_LINE in p for p in prompts), "every call had the pinned prompt"
    assert not any(NEW_PROMPT in p for p in prompts)
    assert sorted(refsystem.counts().values()) == [1, 1], "each run's refund applied exactly once"
    reasons = {e.reason for name in names for e in runs.events(name)}
    assert "DefinitionChanged" in reasons, "an Event says the Agent changed under the run"
    assert not op.logged("Traceback")


def test_reapprove_supersedes_the_pending_approval_with_one_bound_to_the_new_definition(
    start_operator: Any,
    kube: KubeEnv,
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    start_operator("defs")
    define_agent(runs, model, refsystem, policy="reapprove")
    name = run_of_agent(runs)
    first = runs.wait_state(name, "waiting_approval", timeout=90)["status"]["approvalRequest"]
    pinned = runs.get(name)["status"]["checkpoint"]["definition"]["digest"]
    change_agent(kube, runs)

    def superseded() -> dict[str, Any] | None:
        status = runs.get(name)["status"]
        request = status.get("approvalRequest") or {}
        return request if request.get("requestId") not in (None, first["requestId"]) else None

    second = eventually(superseded, Within.TAKEOVER * 3, "a new approval request after the change")
    assert second["digest"] != first["digest"], "the new request binds another digest"
    definition = runs.get(name)["status"]["checkpoint"]["definition"]
    assert definition["digest"] == pinned, "the pinned content stays the run's"
    assert definition["approvedUnder"] not in (None, pinned), "the new request binds the new definition"
    approve(runs, name, first)  # the superseded request's decision moves nothing
    assert refsystem.counts() == {}
    approve(runs, name, second)
    runs.wait_state(name, "completed", timeout=90)
    assert list(refsystem.counts().values()) == [1], "applied exactly once"
    history = runs.get(name)["status"]["history"]
    assert any("policy: reapprove" in (h.get("detail") or "") for h in history)


def test_fail_ends_the_run_saying_why_and_nothing_is_applied(
    start_operator: Any,
    kube: KubeEnv,
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    start_operator("defs")
    define_agent(runs, model, refsystem, policy="fail")
    name = run_of_agent(runs)
    runs.wait_state(name, "waiting_approval", timeout=90)
    change_agent(kube, runs)
    failed = runs.wait_state(name, "failed", timeout=90)
    outcome = failed["status"]["outcome"]
    assert outcome["reason"] == "DefinitionChanged"
    assert "policy: fail" in outcome["message"]
    assert "refunds" in outcome["message"]
    assert refsystem.counts() == {}, "nothing applied"


def test_a_missing_agent_is_waited_for_saying_so_and_a_deleted_prompt_does_not_matter(
    start_operator: Any,
    kube: KubeEnv,
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    start_operator("defs")
    name = run_of_agent(runs)  # its Agent does not exist yet
    eventually(
        lambda: runs.get(name).get("status", {}).get("waitingFor") == "agent:refunds" or None,
        Within.TAKEOVER * 3,
        "the run to say it waits for its Agent",
    )
    runs.wait_event(name, "AgentNotFound")
    define_agent(runs, model, refsystem)
    request = runs.wait_state(name, "waiting_approval", timeout=90)["status"]["approvalRequest"]
    client.CoreV1Api(kube.api).delete_namespaced_config_map("refund-agent-prompt", runs.namespace)
    approve(runs, name, request)
    runs.wait_state(name, "completed", timeout=90)
    assert all(OLD_PROMPT_LINE in p for p in system_prompts(model)), "the pinned prompt, after its deletion"
    assert list(refsystem.counts().values()) == [1]


def test_a_model_secret_the_runs_account_cannot_read_fails_the_run_naming_both(
    start_operator: Any,
    kube: KubeEnv,
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    start_operator("defs")
    define_agent(runs, model, refsystem)
    runs.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        runs.namespace,
        "modelconfigs",
        "refunds-model",
        {"spec": {"credentialsSecretRef": {"name": "someone-elses-key", "key": "apiKey"}}},
    )
    name = run_of_agent(runs)
    failed = runs.wait_state(name, "failed", timeout=90)
    message = failed["status"]["outcome"]["message"]
    assert f"ServiceAccount {runs.namespace}/default" in message
    assert "Secret" in message
    assert "someone-elses-key" in message
    assert model.calls()["total"] == 0
    assert refsystem.counts() == {}


@pytest.mark.local_plane("users", "webhook")
def test_deleting_an_agent_live_runs_use_is_refused_naming_them_unless_forced(
    start_operator: Any,
    kube: KubeEnv,
    plane: Any,
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    ns = runs.namespace
    edit = ["get", "list", "patch", "delete"]
    grant(kube, ns, "bob", [rule(GROUP, "agents", *edit), rule(GROUP, "modelconfigs", *edit)])
    grant(kube, ns, "oncall", [rule(GROUP, "agents", *edit, "force-delete")])
    bob = client.CustomObjectsApi(kube.user_client("bob", []))
    op = start_operator("defs", 2, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()
    define_agent(runs, model, refsystem)
    names = [runs.create(sample_of("AgentRun")["spec"], name=n) for n in ("refund-a", "refund-b")]
    requests = {
        n: runs.wait_state(n, "waiting_approval", timeout=90)["status"]["approvalRequest"] for n in names
    }

    for plural, name in (("agents", "refunds"), ("modelconfigs", "refunds-model")):
        with pytest.raises(client.ApiException) as err:
            bob.delete_namespaced_custom_object(GROUP, VERSION, ns, plural, name)
        assert err.value.status == 403, err.value.body
        assert "used by 2 run(s) that have not ended: refund-a, refund-b;" in str(err.value.body)
    mark = {"metadata": {"annotations": {FORCE_DELETE: "INC-9: retired"}}}
    with pytest.raises(client.ApiException) as err:
        bob.patch_namespaced_custom_object(GROUP, VERSION, ns, "agents", "refunds", mark)
    assert "user 'bob' may not force-delete agents/refunds" in str(err.value.body)

    oncall = str(plane.write_user_kubeconfig("oncall", []))
    command = ["policy", "force-delete", "refunds", "--kind", "Agent", "--reason", "INC-9: retired"]
    assert kubectl_plugin.main([*command, "-n", ns, "--kubeconfig", oncall]) == 0
    for name in names:  # the default policy (keep): they go on with what they pinned
        approve(runs, name, requests[name])
        runs.wait_state(name, "completed", timeout=90)
    assert sorted(refsystem.counts().values()) == [1, 1]


def test_a_prompt_the_runs_account_cannot_read_at_acceptance_fails_the_run_saying_why(
    start_operator: Any,
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    start_operator("defs")
    define_agent(runs, model, refsystem)
    runs.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        runs.namespace,
        "agents",
        "refunds",
        {"spec": {"systemPrompt": {"configMapKeyRef": {"name": "not-granted", "key": "v1"}}}},
    )
    name = run_of_agent(runs)
    failed = runs.wait_state(name, "failed", timeout=90)
    outcome = failed["status"]["outcome"]
    assert outcome["reason"] == "DefinitionUnusable"
    assert f"ServiceAccount {runs.namespace}/default may not read ConfigMap" in outcome["message"]
    assert "not-granted" in outcome["message"]
    assert "definition" not in failed["status"]["checkpoint"], "nothing pinned"
    assert model.calls()["total"] == 0
