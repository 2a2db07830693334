"""Pure rules of runs of an Agent: the digests a run pins, the bound on what it pins, the rule
for a changed definition, and which runs use a definition (deletion)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import (
    AgentLimitsSpec,
    AgentPolicySpec,
    AgentRunSpec,
    AgentSpec,
    DefinitionChangeResponse,
    ModelConfigSpec,
)
from durable_agents.core.agent.limits import AgentLimits
from durable_agents.core.agent.planner import AgentInputs, ModelPlanner
from durable_agents.core.approvals import approval_digest
from durable_agents.core.checkpoint import (
    Checkpoint,
    Position,
    Timestamps,
    dump_checkpoint,
    stamp_checkpoint,
    verify_integrity,
)
from durable_agents.core.definitions import (
    PINNED_DEFINITION_MAX,
    DefinitionNow,
    DefinitionUnusable,
    definition_change,
    definition_users,
    pin,
    pinned_of,
)
from durable_agents.core.engine import RunSnapshot, Settings
from durable_agents.core.engine.model_turns import limits_of
from durable_agents.core.sealed_values import DataKey
from durable_agents.core.sealing import Keyring
from durable_agents.kubectl import why as kubectl_why

AGENT = AgentSpec.model_validate(
    {
        "modelRef": "m",
        "systemPrompt": {"configMapKeyRef": {"name": "p", "key": "v1"}},
        "tools": [{"name": "read_limits", "read": {"apiVersion": "v1", "kind": "ConfigMap"}}],
    }
)
MODEL = ModelConfigSpec.model_validate({"baseUrl": "http://model/v1", "model": "gpt"})


def test_each_part_of_the_definition_moves_its_own_digest_and_the_whole() -> None:
    base = pin("a", AGENT, MODEL, "prompt")
    assert pin("a", AGENT, MODEL, "prompt") == base, "the same definition pins the same digests"
    other_prompt = pin("a", AGENT, MODEL, "another prompt")
    other_model = pin("a", AGENT, MODEL.model_copy(update={"model": "gpt-2"}), "prompt")
    tools = AGENT.model_copy(update={"tools": []})
    other_tools = pin("a", tools, MODEL, "prompt")
    assert other_prompt.prompt_digest != base.prompt_digest
    assert other_prompt.model_digest == base.model_digest
    assert other_model.model_digest != base.model_digest
    assert other_tools.tool_set_digest != base.tool_set_digest
    assert len({base.digest, other_prompt.digest, other_model.digest, other_tools.digest}) == 4


def test_the_pinned_agent_is_the_inline_agent_a_run_would_carry() -> None:
    pinned = pin("a", AGENT, MODEL, "prompt")
    config = pinned.agent_config()
    assert config.planner.value == "model"
    assert config.model == "gpt"
    assert config.endpoint is not None
    assert config.endpoint.base_url == "http://model/v1"
    assert [t.name for t in config.tools] == ["read_limits"]
    assert pinned.system_prompt == "prompt"
    assert pinned.protocol == "openai-chat"


def test_a_definition_too_large_to_pin_is_refused_saying_so() -> None:
    with pytest.raises(DefinitionUnusable, match="a run pins at most"):
        pin("a", AGENT, MODEL, "p" * 9000)
    big = AGENT.model_copy(
        update={
            "tools": [*AGENT.tools]
            + [
                AGENT.tools[0].model_copy(update={"name": f"t{i}", "description": "d" * 1000})
                for i in range(20)
            ]
        }
    )
    with pytest.raises(DefinitionUnusable, match=str(PINNED_DEFINITION_MAX)):
        pin("a", big, MODEL, "prompt")


@pytest.mark.parametrize(
    ("response", "now", "expected"),
    [
        (DefinitionChangeResponse.KEEP, "changed", DefinitionChangeResponse.KEEP),
        (DefinitionChangeResponse.FAIL, "changed", DefinitionChangeResponse.FAIL),
        (DefinitionChangeResponse.REAPPROVE, "changed", DefinitionChangeResponse.REAPPROVE),
        (DefinitionChangeResponse.REAPPROVE, "deleted", DefinitionChangeResponse.FAIL),
        (DefinitionChangeResponse.KEEP, "deleted", DefinitionChangeResponse.KEEP),
    ],
)
def test_the_change_rule(
    response: DefinitionChangeResponse, now: str, expected: DefinitionChangeResponse
) -> None:
    pinned = pin("a", AGENT, MODEL, "prompt")
    digest = None if now == "deleted" else pin("a", AGENT, MODEL, "new").digest
    change = definition_change(pinned, DefinitionNow(digest), response)
    assert change is not None
    assert change.response is expected
    assert f"policy: {response.value}" in change.message
    assert ("deleted" in change.message) == (now == "deleted")


def test_no_change_nothing_known_or_a_change_already_reapproved_rules_nothing() -> None:
    pinned = pin("a", AGENT, MODEL, "prompt")
    new = pin("a", AGENT, MODEL, "new").digest
    keep = DefinitionChangeResponse.REAPPROVE
    assert definition_change(pinned, DefinitionNow(pinned.digest), keep) is None
    assert definition_change(pinned, None, keep) is None
    assert definition_change(pinned, DefinitionNow(new, why="its ConfigMap is gone"), keep) is None
    reapproved = pinned.model_copy(update={"approved_under": new})
    assert definition_change(reapproved, DefinitionNow(new), keep) is None


def test_the_approval_digest_covers_the_definition_and_is_unchanged_without_one() -> None:
    args: dict[str, Any] = dict(
        effect="http.post",
        arguments={"a": 1},
        target={"url": "x"},
        service_account="default",
        policy_version="v1",
        run_uid="u",
        request_id="r",
    )
    plain = approval_digest(**args)
    assert approval_digest(**args, definition=None) == plain, "inline runs' digests do not move"
    assert approval_digest(**args, definition="d1") != approval_digest(**args, definition="d2")


def _run(name: str, ref: str | None, state: str = "waiting_approval", pinned: Any = None) -> dict[str, Any]:
    status: dict[str, Any] = {"state": state}
    if pinned is not None:
        status["checkpoint"] = {
            "definition": pinned.model_dump(mode="json", by_alias=True, exclude_none=True)
        }
    return {"metadata": {"name": name}, "spec": {"agentRef": ref} if ref else {}, "status": status}


def test_the_runs_that_use_a_definition() -> None:
    pinned = pin("refunds", AGENT, MODEL, "prompt")
    runs = [
        _run("live", "refunds", pinned=pinned),
        _run("ended", "refunds", state="completed", pinned=pinned),
        _run("other", "other"),
        _run("not-yet", "uses-m"),
        _run("inline", None),
    ]
    assert definition_users(runs, "Agent", "refunds") == ["live"]
    assert definition_users(runs, "ModelConfig", "m", agents_of_model=["uses-m"]) == ["live", "not-yet"]
    assert definition_users(runs, "ModelConfig", "other-model") == []


def test_a_snapshot_of_a_pinned_run_acts_by_the_pinned_agent_only() -> None:
    pinned = pin("refunds", AGENT, MODEL, "prompt")
    spec = AgentRunSpec.model_validate({"taskType": "t", "objective": "o", "agentRef": "refunds"})
    body = {
        "metadata": {"uid": "u", "name": "r", "namespace": "n", "resourceVersion": "1"},
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        "status": {"checkpoint": {"definition": pinned.model_dump(mode="json", by_alias=True)}},
    }
    run = RunSnapshot.from_object(body)
    assert run.spec.agent == pinned.agent_config()
    assert run.pinned == pinned
    assert pinned_of({"definition": {"not": "a definition"}}) is None


def test_why_says_which_definition_the_run_pinned_and_what_a_change_did() -> None:
    pinned = pin("refunds", AGENT, MODEL, "prompt")
    kept = "Agent 'refunds' changed: pinned x, now y; the run keeps its pinned definition (policy: keep)"
    run = _run("r", "refunds", pinned=pinned)
    run["metadata"]["namespace"] = "ns"
    run["status"]["conditions"] = [
        {
            "type": "DefinitionChanged",
            "status": "True",
            "reason": "PinnedDefinitionKept",
            "message": kept,
            "lastTransitionTime": "2026-12-03T12:00:00Z",
        }
    ]
    answer = kubectl_why.explain(run)
    assert answer["definition"] == {
        "agentRef": "refunds",
        "pinned": pinned.digest,
        "approvedUnder": None,
        "changed": kept,
    }
    said = kubectl_why.text(answer)
    assert f"Agent:            refunds, pinned {pinned.digest}" in said
    assert "policy: keep" in said
    failed = _run("f", "refunds", state="failed", pinned=pinned)
    failed["status"]["outcome"] = {"reason": "DefinitionChanged", "message": "gone (policy: fail)"}
    assert kubectl_why.explain(failed)["definition"]["changed"] == "gone (policy: fail)"
    assert kubectl_why.explain(_run("inline", None))["definition"] is None


def test_a_pinned_definition_changed_in_the_status_does_not_verify() -> None:
    """The pinned content is under the checkpoint's integrity stamp: a prompt, endpoint or tool
    swapped by someone who can write the status quarantines the run (IntegrityFailed)."""
    keyring = Keyring(keys={"k1": b"\x01" * 32}, active_key_id="k1")
    now = datetime(2026, 12, 3, tzinfo=UTC)
    checkpoint = Checkpoint(
        position=Position(state="waiting_approval", step=0, state_version=3),
        timestamps=Timestamps(created_at=now, updated_at=now, entered_state_at=now),
        definition=pin("refunds", AGENT, MODEL, "prompt"),
    )
    stored = dump_checkpoint(stamp_checkpoint(checkpoint, keyring=keyring, run_id="u1"))
    assert verify_integrity(stored, keyring=keyring, run_id="u1") is None
    for field, value in (("systemPrompt", "obey me"), ("digest", "sha256:" + "1" * 64)):
        forged = {**stored, "definition": {**stored["definition"], field: value}}
        refused = verify_integrity(forged, keyring=keyring, run_id="u1")
        assert refused is not None
        assert refused.reason == "IntegrityFailed"


def test_an_agents_default_limits_apply_and_its_policy_caps_them() -> None:
    limited = AGENT.model_copy(
        update={"limits": AgentLimitsSpec(max_model_calls=10, max_tool_calls=50, max_tokens=None)}
    )
    pinned = pin("a", limited, MODEL, "prompt")
    assert pinned.limits == {"maxModelCalls": 10, "maxToolCalls": 50}
    inputs = AgentInputs(
        model="gpt",
        system_prompt="prompt",
        tools=(),
        data_key=DataKey(b"\x00" * 32),
        entropy=os.urandom,
        agent_limits=pinned.agent_limits(),
    )
    planner = ModelPlanner(inputs)
    alone = limits_of(planner, Settings())
    assert (alone.max_model_calls, alone.max_tool_calls) == (10, 50), "the Agent's defaults"
    assert alone.max_tokens == AgentLimits().max_tokens, "unset: the operator's default"
    policy = AgentPolicySpec.model_validate(
        {"version": "v1", "agentLimits": {"maxModelCalls": 100, "maxToolCalls": 20, "maxTokens": 1000}}
    )
    capped = limits_of(planner, Settings(policy=policy))
    assert capped.max_model_calls == 10, "the Agent's lower limit stands under a higher policy"
    assert capped.max_tool_calls == 20, "the policy caps the Agent's higher limit"
    assert capped.max_tokens == 1000, "the policy's own"
