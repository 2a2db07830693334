"""No run stuck silently: an internal error quarantines (retry resumes it), a definite child
failure fails the step with its reason, a duration that does not parse fails the run with one."""

from __future__ import annotations

import copy

import pytest
from tests.unit.builders import (
    CHILD,
    DONE,
    EFFECTS,
    EPOCH,
    KEYRING,
    SETTINGS,
    T0,
    apply,
    ask,
    at,
    checkpoint_of,
    commit_of,
    decide_on,
    effect,
    expect,
    new_run,
    patch_spec,
    retry_request,
    settings_with,
    snap,
)

from durable_agents.api.v1alpha1 import ActionTier
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import ChildRecord
from durable_agents.core.engine import ChildObservation, Idle, Settings
from durable_agents.core.engine.children import CHILD_INVALID, CHILD_NOT_PERMITTED, child_failure
from durable_agents.core.engine.quarantine import INTERNAL_ERROR, internal_error
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit

OVERFLOW = "99999999999999999999h"


# --- InternalError: quarantined untouched, and a retry resumes -----------------------------------


def test_an_internal_error_quarantines_the_run_untouched_and_a_retry_resumes_it() -> None:
    obj, _ = expect(new_run(steps=[ask("q1"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY)
    stored = copy.deepcopy(obj["status"]["checkpoint"])
    commit = internal_error(
        snap(obj), at(1), EPOCH, "commit of the transition ready --input_requested-->", "KeyError: 'x'"
    )
    assert commit is not None
    assert (commit.event, commit.state) == (RunEvent.QUARANTINE, RunState.QUARANTINED)
    assert commit.checkpoint == stored, "the checkpoint is left as stored"
    outcome = commit.status.outcome
    assert outcome is not None
    assert outcome.reason == INTERNAL_ERROR
    assert "KeyError: 'x'" in outcome.message
    assert "ready --input_requested-->" in outcome.message
    assert "retryQuarantine" in outcome.message
    quarantined = {c.type: c for c in commit.status.conditions}["Quarantined"]
    assert (quarantined.status.value, quarantined.reason) == ("True", INTERNAL_ERROR)
    obj = apply(obj, commit)
    assert decide_on(obj, at(2)) == Idle(reason="quarantined: retry (spec.retryQuarantine) or cancel")

    obj = patch_spec(obj, retryQuarantine="t1")
    obj, _ = expect(obj, at(3), RunEvent.RELEASE_QUARANTINE, RunState.RESUME_VALIDATION)
    obj, _ = expect(obj, at(4), RunEvent.REVALIDATED, RunState.READY)
    obj, _ = expect(obj, at(5), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT)


def test_a_run_quarantined_before_acceptance_is_accepted_anew_on_retry() -> None:
    obj = new_run(steps=[DONE])
    commit = internal_error(snap(obj), T0, EPOCH, "lease", "ApiException: (422)")
    assert commit is not None
    assert commit.checkpoint is None
    obj = apply(obj, commit)
    assert obj["status"]["state"] == "quarantined"
    obj = patch_spec(obj, retryQuarantine="t1")
    obj, released = expect(obj, at(1), RunEvent.RELEASE_QUARANTINE, RunState.RESUME_VALIDATION)
    assert checkpoint_of(released).position.step == 0
    obj, _ = expect(obj, at(2), RunEvent.REVALIDATED, RunState.READY)
    obj, _ = expect(obj, at(3), RunEvent.SUCCEEDED, RunState.COMPLETED)


def test_a_run_never_accepted_stays_quarantined_on_retry_without_its_creators_stamp() -> None:
    obj = new_run(steps=[DONE], createdBy=None)
    commit = internal_error(snap(obj), T0, EPOCH, "decide", "ValueError")
    assert commit is not None
    obj = apply(obj, commit)
    obj = patch_spec(obj, **retry_request(obj, "t1"))  # a stamped retry: only the creator is unproven
    idle = decide_on(obj, at(1), settings=Settings(keyring=KEYRING))
    assert isinstance(idle, Idle)
    assert "ServiceAccountNotAuthorized" in idle.reason


@pytest.mark.parametrize("state", ["completed", "failed", "quarantined"])
def test_an_ended_or_quarantined_run_is_not_quarantined_again(state: str) -> None:
    obj, _ = expect(new_run(steps=[DONE]), T0, RunEvent.ACCEPTED, RunState.READY)
    obj["status"]["state"] = state
    assert internal_error(snap(obj), at(1), EPOCH, "decide", "boom") is None


# --- a child the ServiceAccount may not create fails the step ----------------------------------


@pytest.mark.parametrize("reason", [CHILD_NOT_PERMITTED, CHILD_INVALID])
def test_a_child_refused_at_creation_fails_the_parents_step_with_its_reason(reason: str) -> None:
    obj = new_run(steps=[CHILD, DONE], serviceAccountName="agent-sa")
    obj, _ = expect(obj, T0, RunEvent.ACCEPTED, RunState.READY)
    obj, _ = expect(obj, at(1), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL)
    seen = {"run-1-sub": ChildObservation(RunState.FAILED, reason)}
    obj, _ = expect(obj, at(2), RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION, children=seen)
    obj, failed = expect(obj, at(3), RunEvent.ATTEMPT_FAILED, RunState.FAILED)
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == reason
    assert "team-a/run-1-sub was never created" in failed.status.outcome.message


def test_the_outcome_of_a_child_not_permitted_says_why() -> None:
    record = ChildRecord(name="c", step_index=0, outcome="failed", reason=CHILD_NOT_PERMITTED)
    outcome = child_failure("ns", record)
    assert outcome.reason == CHILD_NOT_PERMITTED
    assert "may not create AgentRuns" in outcome.message


# --- a duration that does not parse fails the run with a reason --------------------------------


def test_an_overflowing_default_input_expiry_fails_the_run_with_invalid_duration() -> None:
    settings = copy.copy(SETTINGS)
    object.__setattr__(
        settings, "wait_expiries", SETTINGS.wait_expiries.model_copy(update={"input": OVERFLOW})
    )
    step = {"name": "q", "ask": {"question": "why?"}}  # no expiresIn: the policy's default applies
    obj, _ = expect(new_run(steps=[step, DONE]), T0, RunEvent.ACCEPTED, RunState.READY, settings=settings)
    obj, failed = expect(obj, at(1), RunEvent.ATTEMPT_FAILED, RunState.FAILED, settings=settings)
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "InvalidDuration"
    assert "maximum of 8760h" in failed.status.outcome.message


def test_an_overflowing_approval_expiry_fails_the_run_with_invalid_duration() -> None:
    settings = settings_with(tier=ActionTier.CONSEQUENTIAL)
    assert settings.policy is not None
    policy = settings.policy.model_copy(update={"approval_expiry": "9" * 60 + "h"})
    object.__setattr__(settings, "policy", policy)
    obj, _ = expect(
        new_run(steps=[effect("pay"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY, settings=settings
    )
    obj, failed = expect(obj, at(1), RunEvent.ATTEMPT_FAILED, RunState.FAILED, settings=settings)
    assert failed.status.outcome is not None
    assert failed.status.outcome.reason == "InvalidDuration"


def test_a_valid_run_with_the_same_steps_goes_on() -> None:
    obj, _ = expect(
        new_run(steps=[effect("pay"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY, settings=EFFECTS
    )
    decision = decide_on(obj, at(1), settings=EFFECTS)
    assert commit_of(decision).event is RunEvent.EXTERNAL_AWAITED
