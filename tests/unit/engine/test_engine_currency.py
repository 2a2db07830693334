"""A decision taken from the policy holds at the write that carries it and at the send: the rules
of :mod:`durable_agents.core.engine.currency` and where the engine and the dispatcher use them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tests.unit.builders import (
    DONE,
    KEYRING,
    PLANNER,
    at,
    checkpoint_of,
    cp_of,
    decision,
    effect,
    evidence_for,
    expect,
    new_run,
    patch_spec,
    settings_with,
    snap,
    walk,
)

from durable_agents.api.v1alpha1 import ActionTier, AgentPolicySpec
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import Commit, Settings
from durable_agents.core.engine.actions import POLICY_CHANGED, Refused, intent_refusal
from durable_agents.core.engine.currency import (
    batch_outdated,
    evidence_outdated,
    evidence_to_recheck,
    intent_outdated,
    policy_moved,
)
from durable_agents.core.ledger import action_record_name
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit

V1 = replace(settings_with(tier=ActionTier.CONSEQUENTIAL), keyring=KEYRING)


def under(version: str, **freshness: str) -> Settings:
    """``V1``'s policy rolled out as ``version`` (its freshness rules changed as given)."""
    assert V1.policy is not None
    wire = V1.policy.model_dump(by_alias=True, mode="json")
    policy = AgentPolicySpec.model_validate(
        {**wire, "version": version, "freshness": {**wire["freshness"], **freshness}}
    )
    return replace(V1, policy_version=version, policy=policy)


def approved() -> dict[str, Any]:
    """A run whose approval of ``pay`` (asked and decided under v1) was just taken in."""
    obj = walk(new_run(steps=[effect("pay"), DONE]), RunState.WAITING_APPROVAL, settings=V1)
    request = obj["status"]["approvalRequest"]
    assert request["policyVersion"] == "v1"
    obj = patch_spec(obj, approvals={"pay-1": decision(obj, "pay-1", request["digest"])})
    obj, _ = expect(obj, at(2), RunEvent.APPROVAL_DECIDED, RunState.RESUME_VALIDATION, settings=V1)
    return obj


def the_batch() -> tuple[list[Commit], dict[str, Any]]:
    """What one batch decides under v1 from the approval: revalidation, then the intent."""
    obj = approved()
    obj, revalidated = expect(obj, at(3), RunEvent.REVALIDATED, RunState.READY, settings=V1)
    obj, intent = expect(obj, at(4), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL, settings=V1)
    assert len(intent.intents) == 1
    return [revalidated, intent], obj


# --- policy_moved: the rule revalidation and the intent share --------------------------------------


def test_a_new_policy_version_moves_an_approval_unless_the_policy_calls_it_immaterial() -> None:
    assert policy_moved("v1", V1) is None
    assert policy_moved("v1", under("v2")) == "policy changed from v1 to v2"
    assert policy_moved("v1", under("v2", policyChanged="immaterial")) is None
    assert policy_moved("v1", replace(V1, policy=None)) is None, "no policy: nothing to move"
    assert policy_moved("unversioned", replace(V1, policy_version=None)) is None


# --- batch_outdated: the worker's check right before the status write -------------------------------


def test_a_batch_decided_under_the_policy_it_is_written_under_is_written() -> None:
    commits, _ = the_batch()
    assert V1.policy is not None
    decided = [V1.policy, V1.policy]
    assert batch_outdated(commits, decided, V1.policy, "team-policy") is None
    # The watch cache replaced the object with an equal one (a resync): still the same policy.
    copy = V1.policy.model_copy(deep=True)
    assert batch_outdated(commits, decided, copy, "team-policy") is None


def test_a_batch_whose_policy_changed_before_its_write_is_not_written() -> None:
    commits, _ = the_batch()
    assert V1.policy is not None
    v2 = under("v2").policy
    why = batch_outdated(commits, [V1.policy, V1.policy], v2, "team-policy")
    assert why is not None
    assert "revalidated was decided under AgentPolicy 'team-policy' version v1" in why
    assert "before its write the policy is version v2" in why
    # Revalidated under v1, the intent already under v2 (the cache moved mid-batch): not written.
    assert batch_outdated(commits, [V1.policy, v2], v2, "team-policy") is not None
    # Deleted meanwhile: not written either (decided again, the run waits for its policy).
    assert "deleted" in (batch_outdated(commits, [V1.policy, V1.policy], None, "team-policy") or "")


def test_a_content_change_under_the_same_version_counts_too() -> None:
    """A tier can change without a new version: the intent's tier was decided from the old one."""
    commits, _ = the_batch()
    assert V1.policy is not None
    retiered = V1.policy.model_copy(update={"approval_required_tiers": []})
    assert batch_outdated(commits, [V1.policy, V1.policy], retiered, "team-policy") is not None


def test_a_batch_that_makes_no_policy_decision_binding_is_written_whatever_the_policy() -> None:
    commits, _ = the_batch()
    assert V1.policy is not None
    v2 = under("v2").policy
    obj = walk(new_run(steps=[effect("pay"), DONE]), RunState.WAITING_APPROVAL, settings=V1)
    request = obj["status"]["approvalRequest"]
    obj = patch_spec(obj, approvals={"pay-1": decision(obj, "pay-1", request["digest"])})
    _, taken_in = expect(obj, at(2), RunEvent.APPROVAL_DECIDED, RunState.RESUME_VALIDATION, settings=V1)
    assert batch_outdated([taken_in], [V1.policy], v2, "team-policy") is None
    assert batch_outdated(commits, [None, None], None, None) is None, "a run without a policy"


# --- the engine: an intent only under the version its approval binds --------------------------------


def test_a_revalidation_written_before_a_policy_change_does_not_carry_the_intent() -> None:
    """One transition per write: revalidated (and written) under v1, the intent decided under v2
    asks again instead of intending the effect."""
    obj = approved()
    obj, _ = expect(obj, at(3), RunEvent.REVALIDATED, RunState.READY, settings=V1)
    v2 = under("v2")
    obj, again = expect(obj, at(4), RunEvent.APPROVAL_REQUESTED, RunState.WAITING_APPROVAL, settings=v2)
    assert again.intents == ()
    request = again.status.approval_request
    assert request is not None
    assert (request.request_id, request.policy_version) == ("pay-2", "v2")
    assert "policy changed from v1 to v2" in request.policy_reason
    assert [a.request_id for a in cp_of(obj).approvals] == ["pay-1", "pay-2"]


def test_under_an_immaterial_change_the_revalidated_approval_still_carries_the_intent() -> None:
    obj = approved()
    obj, _ = expect(obj, at(3), RunEvent.REVALIDATED, RunState.READY, settings=V1)
    lenient = under("v2", policyChanged="immaterial")
    _, intent = expect(obj, at(4), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL, settings=lenient)
    assert len(intent.intents) == 1


# --- intent_outdated: the dispatcher's check before the send ----------------------------------------


def test_the_dispatcher_refuses_an_intent_whose_approval_the_current_policy_no_longer_accepts() -> None:
    commits, obj = the_batch()
    (spec,) = commits[-1].intents
    name = action_record_name(spec.idempotency_key)
    assert intent_refusal(snap(obj), name, spec, PLANNER, V1) is None, "under v1 it is sent"
    verdict = intent_refusal(snap(obj), name, spec, PLANNER, under("v2"))
    assert isinstance(verdict, Refused)
    assert verdict.reason == POLICY_CHANGED
    assert "approval pay-1 no longer binds: policy changed from v1 to v2" in verdict.message
    lenient = under("v2", policyChanged="immaterial")
    assert intent_refusal(snap(obj), name, spec, PLANNER, lenient) is None


def test_an_intent_without_an_approval_is_refused_once_the_policy_requires_one() -> None:
    commits, obj = the_batch()
    (spec,) = commits[-1].intents
    (pending,) = checkpoint_of(commits[-1]).pending_actions
    cp = cp_of(obj)
    unapproved = pending.model_copy(update={"approval_request_id": None})
    why = intent_outdated(cp, unapproved, spec, V1)
    assert why == "AgentPolicy 'team-policy' (version v1) requires an approval for a consequential effect"
    assert intent_outdated(cp, pending, spec, V1) is None
    no_approval_needed = replace(V1, policy=V1.policy.model_copy(update={"approval_required_tiers": []}))  # type: ignore[union-attr]
    assert intent_outdated(cp, unapproved, spec, no_approval_needed) is None


# --- evidence_to_recheck / evidence_outdated: the approved intent's evidence, read before the write --


def test_only_a_batch_with_an_approved_intent_reads_its_evidence_again() -> None:
    commits, _ = the_batch()
    assert evidence_to_recheck(commits) == (), "no evidence recorded: nothing to read"
    with_evidence = replace(
        commits[-1],
        checkpoint={
            **(commits[-1].checkpoint or {}),
            "evidence": [evidence_for(0, "limits").model_dump(by_alias=True, mode="json")],
        },
    )
    (ref,) = evidence_to_recheck([commits[0], with_evidence])
    assert (ref.kind, ref.name, ref.resource_version) == ("ConfigMap", "settings", "4711")
    cp = checkpoint_of(with_evidence)
    (pending,) = cp.pending_actions
    unapproved = cp.model_copy(
        update={"pending_actions": [pending.model_copy(update={"approval_request_id": None})]}
    )
    plain = replace(with_evidence, checkpoint=unapproved.model_dump(by_alias=True, mode="json"))
    assert evidence_to_recheck([plain]) == (), "an intent without an approval reads nothing"


def test_evidence_that_changed_before_the_write_outdates_the_batch_unless_immaterial() -> None:
    ref = evidence_for(0, "limits")
    policy = V1.policy
    assert evidence_outdated([ref], {ref.id: ref}, policy) is None
    moved = ref.model_copy(update={"resource_version": "4712"})
    why = evidence_outdated([ref], {ref.id: moved}, policy)
    assert why == (
        "evidence the approval was revalidated against changed before its write: ConfigMap/settings@4711"
    )
    assert evidence_outdated([ref], {ref.id: None}, policy) is not None, "gone counts as changed"
    lenient = under("v1", evidenceChanged="immaterial").policy
    assert evidence_outdated([ref], {ref.id: moved}, lenient) is None
