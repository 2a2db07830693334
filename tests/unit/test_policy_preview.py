"""The policy preview (core/policy_preview.py) says what the engine itself then does.

For generated runs waiting for approval (evidence from reads that changed or not, a request
expired or not) and generated pairs of policies (v1 the run lives under, v2 proposed: freshness,
tiers, approval tiers, version), the preview under v2 is compared with what :func:`decide` does
once v2 is in force: the request approved through the webhook's stamp (unless it has expired:
the webhook refuses those), the evidence read again as it is now, the engine driven until it
commits what the policy decides. The preview is also a pure function of its inputs.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.builders import (
    DONE,
    EPOCH,
    KEYRING,
    PLANNER,
    T0,
    apply,
    commit_of,
    decision,
    effect,
    evidence_for,
    new_run,
    patch_spec,
    snap,
)

from durable_agents.api.v1alpha1 import ActionState, ActionTier, AgentPolicySpec
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import KubernetesEvidenceRef
from durable_agents.core.digest import canonical_digest
from durable_agents.core.engine import (
    ActionObservation,
    Commit,
    NeedEvidence,
    NeedRead,
    Observations,
    ReadResult,
    Settings,
    decide,
)
from durable_agents.core.policy_preview import Prediction, preview_run
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit

TIERS = st.sampled_from(list(ActionTier))
CHANGE = st.sampled_from(["reapprove", "refresh", "immaterial"])


@st.composite
def policies(draw: st.DrawFn, version: str) -> Settings:
    tier = draw(TIERS)
    required = draw(st.sets(TIERS, min_size=0, max_size=3))
    if draw(st.booleans()):  # as often as not, the effect's tier still needs an approval
        required.add(tier)
    spec = AgentPolicySpec.model_validate(
        {
            "version": version,
            "tiers": {"http.post": tier.value},
            "approvalRequiredTiers": [t.value for t in required],
            "approvalExpiry": "10m",
            "freshness": {
                "evidenceChanged": draw(CHANGE),
                "policyChanged": draw(CHANGE),
                "approvalExpired": draw(st.sampled_from(["expire", "reapprove"])),
            },
        }
    )
    return Settings(
        policy_name="payments",
        policy_version=version,
        tiers={"http.post": spec.tiers["http.post"]},
        policy=spec,
        available_effects=frozenset({"http.post"}),
        keyring=KEYRING,
    )


def read_step(name: str) -> dict[str, Any]:
    return {"name": name, "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": name}}}


def waiting(reads: int, v1: Settings) -> dict[str, Any] | None:
    """The run driven under v1 until it waits for approval (None: v1 asks none for it)."""
    obj = new_run(steps=[*(read_step(f"limits-{i}") for i in range(reads)), effect("pay"), DONE])
    for _ in range(12):
        if obj.get("status", {}).get("state") == RunState.WAITING_APPROVAL.value:
            return obj
        got = decide(snap(obj), now=T0, epoch=EPOCH, planner=PLANNER, settings=v1)
        if isinstance(got, NeedRead):
            result = ReadResult(got.step_index, evidence_for(got.step_index, got.step_name))
            got = decide(
                snap(obj),
                now=T0,
                epoch=EPOCH,
                planner=PLANNER,
                settings=v1,
                observed=Observations(read=result),
            )
        if not isinstance(got, Commit) or got.intents:
            return None
        obj = apply(obj, got)
    return None


def changed(ref: KubernetesEvidenceRef) -> KubernetesEvidenceRef:
    return ref.model_copy(
        update={
            "resource_version": f"{ref.resource_version}1",
            "content_digest": canonical_digest({"x": ref.id}),
        }
    )


def engine_does(obj: dict[str, Any], now: datetime, v2: Settings, fresh: dict[str, Any]) -> Prediction:
    """What the engine commits under v2 once the request is decided (approved through the webhook,
    unless expired) and the evidence read again: the first thing the policy decides."""
    request = obj["status"]["approvalRequest"]
    if now < datetime.fromisoformat(request["expiresAt"].replace("Z", "+00:00")):
        obj = patch_spec(
            obj, approvals={request["requestId"]: decision(obj, request["requestId"], request["digest"])}
        )
    for _ in range(6):
        got = decide(snap(obj), now=now, epoch=EPOCH, planner=PLANNER, settings=v2)
        if isinstance(got, NeedEvidence):
            got = decide(
                snap(obj),
                now=now,
                epoch=EPOCH,
                planner=PLANNER,
                settings=v2,
                observed=Observations(fresh_evidence=fresh),
            )
        commit = commit_of(got)
        if commit.event is RunEvent.WAIT_EXPIRED:
            return Prediction.EXPIRES
        if commit.event in (RunEvent.REAPPROVAL_REQUIRED, RunEvent.APPROVAL_REQUESTED):
            return Prediction.NEEDS_REAPPROVAL
        if commit.event is RunEvent.REFRESH_REQUIRED:
            return Prediction.NEEDS_REFRESHED_EVIDENCE
        if commit.intents:
            pending = commit.checkpoint["pendingActions"][-1] if commit.checkpoint else {}
            return (
                Prediction.STAYS_VALID
                if pending.get("approvalRequestId")
                else Prediction.NO_LONGER_NEEDS_APPROVAL
            )
        if commit.state in (RunState.FAILED, RunState.WAITING_RETRY):
            return Prediction.REFUSED
        obj = apply(obj, commit)
    raise AssertionError("the engine decided nothing the policy decides")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    v1=policies("v1"),
    v2=st.one_of(policies("v2"), policies("v1")),
    reads=st.integers(min_value=0, max_value=2),
    evidence=st.lists(st.sampled_from(["same", "changed", "gone"]), min_size=2, max_size=2),
    late=st.booleans(),
)
def test_the_preview_is_what_the_engine_then_does(
    v1: Settings, v2: Settings, reads: int, evidence: list[str], late: bool
) -> None:
    compare(v1, v2, reads, evidence, late)


def settings_of(version: str, tier: str = "consequential", **spec: Any) -> Settings:
    policy = AgentPolicySpec.model_validate(
        {"version": version, "tiers": {"http.post": tier}, "approvalExpiry": "10m", **spec}
    )
    return Settings(
        policy_name="payments",
        policy_version=version,
        tiers={"http.post": policy.tiers["http.post"]},
        policy=policy,
        available_effects=frozenset({"http.post"}),
        keyring=KEYRING,
    )


@pytest.mark.parametrize(
    ("v2", "evidence", "late", "expected"),
    [
        (settings_of("v1"), ["same", "same"], False, Prediction.STAYS_VALID),
        (settings_of("v2"), ["same", "same"], False, Prediction.NEEDS_REAPPROVAL),
        (
            settings_of("v2", freshness={"policyChanged": "immaterial", "evidenceChanged": "refresh"}),
            ["changed", "same"],
            False,
            Prediction.NEEDS_REFRESHED_EVIDENCE,
        ),
        (
            settings_of("v2", freshness={"policyChanged": "immaterial", "evidenceChanged": "refresh"}),
            ["same", "gone"],
            False,
            Prediction.NEEDS_REFRESHED_EVIDENCE,
        ),
        (
            settings_of("v2", freshness={"policyChanged": "immaterial"}),
            ["changed", "same"],
            False,
            Prediction.NEEDS_REAPPROVAL,
        ),
        (
            settings_of("v2", freshness={"approvalExpired": "expire"}),
            ["same", "same"],
            True,
            Prediction.EXPIRES,
        ),
        (
            settings_of("v2", freshness={"approvalExpired": "reapprove"}),
            ["same", "same"],
            True,
            Prediction.NEEDS_REAPPROVAL,
        ),
        (settings_of("v2", "reversible"), ["changed", "changed"], False, Prediction.NO_LONGER_NEEDS_APPROVAL),
    ],
)
def test_each_prediction_is_what_the_engine_then_does(
    v2: Settings, evidence: list[str], late: bool, expected: Prediction
) -> None:
    assert compare(settings_of("v1"), v2, 2, evidence, late) is expected


def compare(v1: Settings, v2: Settings, reads: int, evidence: list[str], late: bool) -> Prediction:
    """The preview under v2 of a run waiting under v1, checked against what the engine does."""
    v1 = replace(v1, tiers={"http.post": ActionTier.CONSEQUENTIAL})
    assert v1.policy is not None
    v1 = replace(
        v1, policy=v1.policy.model_copy(update={"approval_required_tiers": [ActionTier.CONSEQUENTIAL]})
    )
    obj = waiting(reads, v1)
    assert obj is not None, "v1 asks for approval of a consequential effect"
    refs = [
        KubernetesEvidenceRef.model_validate(r) for r in obj["status"]["checkpoint"].get("evidence") or []
    ]
    fresh = {
        ref.id: {"same": ref, "changed": changed(ref), "gone": None}[how]
        for ref, how in zip(refs, evidence, strict=False)
    }
    now = T0 + (timedelta(minutes=11) if late else timedelta(minutes=1))
    before = copy.deepcopy(obj)
    said = preview_run(snap(obj), now=now, planner=PLANNER, current=v1, proposed=v2, fresh_evidence=fresh)
    again = preview_run(snap(obj), now=now, planner=PLANNER, current=v1, proposed=v2, fresh_evidence=fresh)
    assert said == again, "the same inputs, the same preview"
    assert obj == before, "the preview changes nothing it reads"
    assert said.request_id == "pay-1"
    assert said.prediction == engine_does(obj, now, v2, fresh), said
    return said.prediction


def test_a_retiered_effect_goes_on_without_the_approval_and_is_sent_once() -> None:
    """The engine's rule the preview relies on: an approval taken in after the policy stopped
    requiring one for the action's tier lets the intent go without it, once."""
    v1 = Settings(
        policy_name="payments",
        policy_version="v1",
        tiers={"http.post": ActionTier.CONSEQUENTIAL},
        policy=AgentPolicySpec.model_validate({"version": "v1", "tiers": {"http.post": "consequential"}}),
        keyring=KEYRING,
    )
    v2_spec = AgentPolicySpec.model_validate({"version": "v2", "tiers": {"http.post": "reversible"}})
    v2 = replace(v1, policy_version="v2", policy=v2_spec, tiers={"http.post": ActionTier.REVERSIBLE})
    obj = waiting(0, v1)
    assert obj is not None
    said = preview_run(snap(obj), now=T0, planner=PLANNER, current=v1, proposed=v2)
    assert said.prediction is Prediction.NO_LONGER_NEEDS_APPROVAL
    assert engine_does(obj, T0, v2, {}) is Prediction.NO_LONGER_NEEDS_APPROVAL
    # Approved, then driven to its end under v2: one intent, without the approval, sent once.
    request = obj["status"]["approvalRequest"]
    obj = patch_spec(obj, approvals={"pay-1": decision(obj, "pay-1", request["digest"])})
    intents: list[Any] = []
    for _ in range(12):
        if obj["status"]["state"] == RunState.COMPLETED.value:
            break
        actions = {
            p["actionRecordName"]: ActionObservation(ActionState.SUCCEEDED, {"status": 201})
            for p in obj["status"]["checkpoint"].get("pendingActions") or []
        }
        got = decide(
            snap(obj),
            now=T0,
            epoch=EPOCH,
            planner=PLANNER,
            settings=v2,
            observed=Observations(actions=actions),
        )
        commit = commit_of(got)
        intents += commit.intents
        obj = apply(obj, commit)
    assert obj["status"]["state"] == RunState.COMPLETED.value
    assert len(intents) == 1, "sent once"
    events = [h["event"] for h in obj["status"]["history"]]
    assert "reapproval_required" not in events


def test_a_run_without_a_pending_policy_decision_is_unaffected() -> None:
    obj = new_run(steps=[effect("pay"), DONE])
    v1 = Settings(policy_name="payments", policy_version="v1", keyring=KEYRING)
    said = preview_run(snap(obj), now=T0, planner=PLANNER, current=v1, proposed=v1)
    assert said.prediction is Prediction.UNAFFECTED


# --- the warnings and what kubectl agentrun policy diff reads back ----------------------------------


def test_the_webhook_warnings_read_back_run_by_run_and_stay_short() -> None:
    from durable_agents.core.policy_preview import RunPreview
    from durable_agents.kubectl import policy as kubectl_policy
    from durable_agents.shell.admission import policy_preview as admission

    assert kubectl_policy.RUN_PREFIX == admission.RUN_PREFIX, "the plugin parses what the webhook writes"
    previews = [
        RunPreview(
            "team-a", f"run-{i}", "waiting_approval", Prediction.NEEDS_REAPPROVAL, "x" * 400, f"pay-{i}"
        )
        for i in range(admission.MAX_NAMED + 3)
    ] + [RunPreview("team-a", "idle", "ready", Prediction.UNAFFECTED, "ready: nothing pending")]
    warnings = admission.warnings_for("team-a", "payments", "v1", "v2", previews)
    assert all(len(w) <= 256 for w in warnings[1:]), "the API server passes each on whole"
    assert f"{admission.MAX_NAMED + 3} need re-approval" in warnings[0]
    # As the API server sends them: 299 warn-agent "text", joined by the HTTP client.
    header = ", ".join('299 - "' + w.replace("\\", "\\\\").replace('"', '\\"') + '"' for w in warnings)
    parsed = kubectl_policy.parse(kubectl_policy.warnings_of({"Warning": header}))
    assert parsed["summary"] == warnings[0]
    assert [r["name"] for r in parsed["runs"]] == [f"run-{i}" for i in range(admission.MAX_NAMED)]
    assert {r["prediction"] for r in parsed["runs"]} == {"needsReapproval"}
    assert parsed["runs"][0]["requestId"] == "pay-0"
    assert parsed["unnamed"] == 3, "the rest counted, not named"


def test_runs_under_a_policy_are_those_that_name_it() -> None:
    from durable_agents.shell.admission.policy_preview import runs_under_policy

    def run(ns: str, policy: str | None) -> dict[str, Any]:
        spec = {"policyRef": {"name": policy}} if policy else {}
        return {"metadata": {"namespace": ns, "name": f"{ns}-{policy}"}, "spec": spec}

    listed = [
        run("team-a", "payments"),
        run("team-a", "other"),
        run("team-b", "payments"),
        run("team-a", None),
    ]
    assert runs_under_policy(listed, "team-a", "payments") == [listed[0]]


def test_an_intent_the_new_version_requires_an_approval_for_is_refused_by_the_dispatcher_as_predicted() -> (
    None
):
    """A pending action (committed, not sent) of a tier v1 let go without approval: v2 requires
    one, so the dispatcher refuses it (PolicyChanged) and the retry asks: as predicted."""
    from tests.unit.builders import waiting_on_action

    from durable_agents.core.engine.actions import POLICY_CHANGED, Refused, intent_refusal
    from durable_agents.core.ledger import action_record_name

    v1 = settings_of("v1", "reversible")
    v2 = settings_of("v2", "consequential")
    obj, spec = waiting_on_action(v1, [effect("pay"), DONE])
    said = preview_run(snap(obj), now=T0, planner=PLANNER, current=v1, proposed=v2)
    assert said.prediction is Prediction.NEWLY_NEEDS_APPROVAL
    name = action_record_name(spec.idempotency_key)
    assert said.request_id == name
    refused = intent_refusal(snap(obj), name, spec, PLANNER, v2)
    assert isinstance(refused, Refused)
    assert refused.reason == POLICY_CHANGED
    assert intent_refusal(snap(obj), name, spec, PLANNER, v1) is None
    unchanged = preview_run(
        snap(obj), now=T0, planner=PLANNER, current=v1, proposed=settings_of("v2", "reversible")
    )
    assert unchanged.prediction is Prediction.UNAFFECTED


def test_the_run_index_keeps_waiting_runs_whole_and_others_as_stubs() -> None:
    import asyncio

    from durable_agents.shell.admission.policy_preview import RunIndex

    def run(name: str, state: str) -> dict[str, Any]:
        meta = {"namespace": "team-a", "name": name}
        spec = {"policyRef": {"name": "payments"}, "steps": [effect("pay")]}
        return {"metadata": meta, "spec": spec, "status": {"state": state, "checkpoint": {"big": "x" * 100}}}

    index, synced = RunIndex(), asyncio.Event()
    index.follow(synced)
    index.observe(None, run("waits", "waiting_approval"))
    index.observe(None, run("done", "completed"))
    assert index.listed("team-a") is None, "not before the first list is delivered: the caller LISTs"
    synced.set()
    held = {r["metadata"]["name"]: r for r in index.listed("team-a") or []}
    assert held["waits"] == run("waits", "waiting_approval")
    assert held["done"] == {
        "metadata": {"namespace": "team-a", "name": "done"},
        "spec": {"policyRef": {"name": "payments"}},
        "status": {"state": "completed"},
    }
    index.observe("DELETED", run("waits", "waiting_approval"))
    assert [r["metadata"]["name"] for r in index.listed("team-a") or []] == ["done"]
    assert index.listed("team-b") == []


def test_an_update_that_leaves_the_rules_as_they_are_is_previewed_quietly() -> None:
    """An idempotent GitOps sync (or a label) changes nothing for any run: no warning, no work."""
    import asyncio

    from durable_agents.shell.admission.policy_preview import preview_warnings

    class Unused:
        async def preview(self, *args: Any) -> None:
            raise AssertionError("nothing to preview")

    spec = {"version": "v1", "tiers": {"http.post": "consequential"}}
    old = {"metadata": {"namespace": "team-a", "name": "payments"}, "spec": spec}
    new = {"metadata": {**old["metadata"], "labels": {"team": "a"}}, "spec": dict(spec)}
    said = asyncio.run(preview_warnings(Unused(), "UPDATE", old, new))  # type: ignore[arg-type]
    assert said == []
    assert asyncio.run(preview_warnings(Unused(), "DELETE", old, None)) == []  # type: ignore[arg-type]
