"""The position stamp: a state the operator did not write (a forged end, a forged quarantine or
cancellation) is never believed: quarantined ``IntegrityFailed``, nothing intended, the checkpoint
untouched, and a retry resumes from the verified checkpoint, not from the claim."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from tests.unit.builders import (
    DONE,
    EPOCH,
    KEYRING,
    T0,
    UID,
    apply,
    ask,
    at,
    cancel,
    commit_of,
    decide_on,
    drive,
    effect,
    expect,
    new_run,
    patch_spec,
    retry_request,
    settings_with,
    walk,
)

from durable_agents.api.v1alpha1 import ActionTier, AgentRunStatus
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import Idle, Settings
from durable_agents.core.engine.loading import forged_object, forged_position, unverified_record
from durable_agents.core.key_use import keys_in_use
from durable_agents.core.positions import position_verifies, restamped_position
from durable_agents.core.sealing import Keyring
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit

KEYED = Settings(keyring=KEYRING)


def waiting() -> dict[str, Any]:
    """A run waiting for a person's answer, committed by the operator (stamped)."""
    return walk(new_run(steps=[ask("confirm"), DONE]), RunState.WAITING_INPUT, settings=KEYED)


def forge(
    obj: dict[str, Any], state: str, *, outcome: str | None = "Completed", keep_stamp: bool = True
) -> dict:
    """What a user with ``patch`` on ``agentruns/status`` can write: another state (and version)."""
    out = copy.deepcopy(obj)
    status = out["status"]
    status.update(state=state, stateVersion=status["stateVersion"] + 1)
    if outcome is not None:
        status["outcome"] = {"reason": outcome, "message": "done"}
    if not keep_stamp:
        status.pop("positionStamp", None)
    return out


def test_every_commit_stamps_the_position_it_claims() -> None:
    obj = waiting()
    status = AgentRunStatus.model_validate({k: v for k, v in obj["status"].items() if k != "checkpoint"})
    assert status.position_stamp is not None
    assert position_verifies(KEYRING, UID, status)
    assert obj["status"]["checkpoint"]["positionStamped"] is True
    assert forged_object(obj, KEYRING) is None


@pytest.mark.parametrize("state", ["completed", "failed", "canceled"])
@pytest.mark.parametrize("keep_stamp", [True, False], ids=["old-stamp", "stamp-removed"])
def test_a_forged_end_is_quarantined_integrity_failed_and_nothing_happens(
    state: str, keep_stamp: bool
) -> None:
    obj = waiting()
    forged = forge(obj, state, keep_stamp=keep_stamp)
    stored = copy.deepcopy(forged["status"]["checkpoint"])
    commit = commit_of(decide_on(forged, at(5), settings=KEYED))
    assert (commit.event, commit.state) == (RunEvent.QUARANTINE, RunState.QUARANTINED), commit.detail
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "IntegrityFailed"
    assert "written by someone other than the operator" in commit.status.outcome.message
    assert commit.intents == ()
    assert commit.children == ()
    assert commit.checkpoint == stored, "the checkpoint is kept exactly as stored"
    assert commit.status.state_version == forged["status"]["stateVersion"] + 1
    # The quarantine itself is the operator's (stamped): it stays parked, it is not forged again.
    quarantined = apply(forged, commit)
    assert forged_object(quarantined, KEYRING) is None
    assert isinstance(decide_on(quarantined, at(3600), settings=KEYED), Idle)
    # A reader of the forged state (a parent, retention) does not believe it either.
    assert forged_object(forged, KEYRING) is not None


def test_a_forged_outcome_on_a_real_end_is_not_believed() -> None:
    obj, _, idle = drive(new_run(steps=[DONE]), T0, settings=KEYED)
    assert obj["status"]["state"] == "completed"
    assert isinstance(idle, Idle)
    assert forged_object(obj, KEYRING) is None
    relabelled = copy.deepcopy(obj)
    relabelled["status"]["outcome"] = {"reason": "Rejected", "message": "forged"}
    assert "does not verify" in (forged_object(relabelled, KEYRING) or "")


@pytest.mark.parametrize("state", ["quarantined", "cancel_requested"])
@pytest.mark.parametrize("keep_stamp", [True, False], ids=["old-stamp", "stamp-removed"])
def test_a_forged_quarantine_or_cancellation_is_not_acted_on(state: str, keep_stamp: bool) -> None:
    forged = forge(waiting(), state, outcome=None, keep_stamp=keep_stamp)
    if state == "quarantined" and not keep_stamp:
        # Unstamped, a quarantine is believed (an older operator's, after a downgrade): it only
        # parks the run, which a person's stamped retry resumes from the checkpoint.
        assert isinstance(decide_on(forged, at(5), settings=KEYED), Idle)
        return
    commit = commit_of(decide_on(forged, at(5), settings=KEYED))
    assert commit.state is RunState.QUARANTINED
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "IntegrityFailed"
    assert commit.intents == ()


def test_a_retry_after_a_forged_end_resumes_from_the_checkpoint_not_the_claim() -> None:
    obj = waiting()
    forged = forge(obj, "completed")
    quarantined = apply(forged, commit_of(decide_on(forged, at(5), settings=KEYED)))
    retried = patch_spec(quarantined, **retry_request(quarantined, "after-forgery"))
    resumed, _ = expect(
        retried, at(6), RunEvent.RELEASE_QUARANTINE, RunState.RESUME_VALIDATION, settings=KEYED
    )
    # Resume validation goes back to the checkpoint's own position: the question, still unanswered.
    back = commit_of(decide_on(resumed, at(7), settings=KEYED))
    assert back.state is RunState.WAITING_INPUT, back.detail
    assert back.status.waiting_for is not None
    assert "confirm" in back.status.waiting_for


def test_a_legacy_end_is_believed_only_where_its_checkpoint_says_the_same() -> None:
    """Runs ended before position stamps: no stamp, no ``positionStamped``; the verified checkpoint
    must name the end itself (a builder commit did), else the end is not believed."""
    ended, _, _ = drive(new_run(steps=[DONE]), T0, settings=KEYED)
    legacy = _without_position_stamps(ended)
    assert forged_position(_snap(legacy), KEYED) is None
    forged = _without_position_stamps(forge(waiting(), "completed"))
    problem = forged_position(_snap(forged), KEYED)
    assert problem is not None
    assert "checkpoint says waiting_input" in problem.message


def test_without_a_keyring_nothing_is_verified() -> None:
    forged = forge(waiting(), "completed")
    assert forged_position(_snap(forged), Settings()) is None


def test_key_rotation_restamps_a_position_and_keeps_a_forged_one_unblessed() -> None:
    obj = waiting()
    rotated = Keyring(keys={**KEYRING.keys, "k2031": bytes(range(1, 33))}, active_key_id="k2031")
    status = AgentRunStatus.model_validate({k: v for k, v in obj["status"].items() if k != "checkpoint"})
    assert "k2030" in keys_in_use(obj)
    assert keys_in_use(obj)["k2030"].count("checkpoint integrity") == 1, "both integrity stamps, once"
    unstamped = copy.deepcopy(obj)
    unstamped["status"]["checkpoint"].pop("integrity")
    assert "checkpoint integrity" in keys_in_use(unstamped)["k2030"], "the position stamp still needs it"
    again = restamped_position(rotated, UID, status)
    assert again is not None
    assert again.startswith("k2031:")
    assert position_verifies(rotated, UID, status.model_copy(update={"position_stamp": again}))
    forged = status.model_copy(update={"state": RunState.COMPLETED})
    assert restamped_position(rotated, UID, forged) is None


def _without_position_stamps(obj: dict[str, Any]) -> dict[str, Any]:
    """As an operator from before position stamps stored it (its checkpoint stamped without
    ``positionStamped``)."""
    from durable_agents.core.checkpoint import Checkpoint, dump_checkpoint, stamp_checkpoint

    out = copy.deepcopy(obj)
    out["status"].pop("positionStamp", None)
    cp = Checkpoint.model_validate(out["status"]["checkpoint"]).model_copy(update={"position_stamped": None})
    out["status"]["checkpoint"] = dump_checkpoint(stamp_checkpoint(cp, keyring=KEYRING, run_id=UID))
    return out


def _snap(obj: dict[str, Any]) -> Any:
    from durable_agents.core.engine import RunSnapshot

    return RunSnapshot.from_object(obj)


def test_a_reveal_is_answered_only_for_a_record_the_operator_wrote() -> None:
    """What an approver is shown (``status --reveal``) must be the run's own: its position, its
    checkpoint and its approval request, the one the stamped checkpoint holds."""
    settings = replace(settings_with(tier=ActionTier.CONSEQUENTIAL), keyring=KEYRING)
    obj = walk(new_run(steps=[effect("pay"), DONE]), RunState.WAITING_APPROVAL, settings=settings)
    assert unverified_record(obj, KEYRING) is None
    other = copy.deepcopy(obj)
    other["status"]["approvalRequest"]["digest"] = "sha256:" + "0" * 64
    assert "is not the request the run's stamped checkpoint holds" in (
        unverified_record(other, KEYRING) or ""
    )
    assert "does not verify" in (unverified_record(forge(obj, "completed"), KEYRING) or "")
    tampered = copy.deepcopy(obj)
    tampered["status"]["checkpoint"]["approvals"][0]["expiresAt"] = "2099-01-01T00:00:00Z"
    assert "integrity stamp does not verify" in (unverified_record(tampered, KEYRING) or "")


def test_an_unstamped_cancellation_counts_only_with_the_stamped_request_it_names() -> None:
    """An operator from before position stamps (a downgrade) cancels a quarantined run without a
    position stamp: believed, since a person's stamped request asked for it; the same state
    written without such a request is not."""
    obj = waiting()
    asked = cancel(obj, {"stop": {"scope": "task", "reason": "downgraded"}})
    unstamped = forge(asked, "canceled", outcome="Canceled", keep_stamp=False)
    unstamped["status"]["cancellation"] = {"requestId": "stop", "scope": "task", "reason": "downgraded"}
    assert forged_position(_snap(unstamped), KEYED) is None
    unstamped["status"]["cancellation"]["requestId"] = "nobody-asked"
    problem = forged_position(_snap(unstamped), KEYED)
    assert problem is not None
    assert "no position stamp" in problem.message


def test_an_internal_error_quarantine_made_outside_decide_is_stamped() -> None:
    """The worker quarantines a run it keeps failing on (not through decide): that status is the
    operator's too, so it must verify, not be taken for a forgery."""
    from durable_agents.core.engine.quarantine import internal_error

    obj = waiting()
    commit = internal_error(_snap(obj), at(5), EPOCH, "decide", "boom", keyring=KEYRING)
    assert commit is not None
    quarantined = apply(obj, commit)
    assert forged_object(quarantined, KEYRING) is None
    unstamped = internal_error(_snap(obj), at(5), EPOCH, "decide", "boom")
    assert unstamped is not None
    assert unstamped.status.position_stamp is None
