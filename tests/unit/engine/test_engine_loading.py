"""The checkpoint a decision starts from: the initial one, and a stored one with sealed values and
an integrity stamp (a checkpoint the operator did not commit is quarantined, untouched)."""

from __future__ import annotations

import base64
import copy
import os
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from tests.unit.builders import (
    DONE,
    EPOCH,
    T0,
    UID,
    apply,
    apply_status,
    ask,
    at,
    checkpoint_of,
    commit_of,
    condition_view,
    decide_on,
    effect,
    expect,
    new_run,
    patch_spec,
    retry_request,
    settings_with,
    snap,
    step,
    walk,
)

from durable_agents.api.v1alpha1 import ActionTier
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import (
    Loaded,
    Quarantine,
    RuntimeConfig,
    dump_checkpoint,
    seal_field,
    stamp_checkpoint,
    verify_integrity,
)
from durable_agents.core.engine import Commit, Idle, Settings, fence
from durable_agents.core.engine.loading import load_stored
from durable_agents.core.sealing import Keyring
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit


# --- the initial checkpoint ----------------------------------------------------------------------


def test_without_a_policy_the_checkpoint_names_none_and_runtime_config_is_empty() -> None:
    commit = commit_of(step(new_run(), T0, settings=Settings()))
    assert commit.checkpoint is not None
    assert "policy" not in commit.checkpoint
    assert checkpoint_of(commit).runtime_config == RuntimeConfig()


# --- sealed values: a checkpoint this operator cannot unseal is quarantined ----------------------

KEYRING = Keyring(keys={"k2030": bytes(range(32))}, active_key_id="k2030")

RETIRED = Keyring(keys={"k2025": bytes(range(1, 33))}, active_key_id="k2025")

KEYED = Settings(keyring=KEYRING)


def waiting_with_a_sealed_value(sealed_by: Keyring, run_id: str = UID) -> dict[str, Any]:
    """A run in waiting_input whose checkpoint carries one sealed value (sealed by ``sealed_by``),
    committed by this operator (stamped with its keyring)."""
    obj, _ = expect(
        new_run(steps=[ask("confirm"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY, settings=KEYED
    )
    obj, _ = expect(obj, at(1), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT, settings=KEYED)
    cp = seal_field(
        checkpoint_of(obj["status"]["checkpoint"]),
        "apiToken",
        b"s3cret",
        keyring=sealed_by,
        run_uid=run_id,
        entropy=os.urandom,
    )
    obj["status"]["checkpoint"] = dump_checkpoint(stamp_checkpoint(cp, keyring=KEYRING, run_id=UID))
    obj["spec"]["answers"] = {"confirm": "yes"}
    return obj


def quarantine(obj: dict[str, Any], now: datetime, *, settings: Settings) -> tuple[dict[str, Any], Commit]:
    """Decide, expect the quarantine commit (the checkpoint kept as stored), and store it."""
    stored = copy.deepcopy(obj["status"]["checkpoint"])
    commit = commit_of(decide_on(obj, now, settings=settings))
    assert (commit.event, commit.status.state) == (RunEvent.QUARANTINE, RunState.QUARANTINED), commit.detail
    assert commit.checkpoint == stored, "the checkpoint is kept exactly as stored"
    return apply(obj, commit), commit


def test_a_sealed_value_this_keyring_unseals_lets_the_run_go_on() -> None:
    obj = waiting_with_a_sealed_value(KEYRING)
    obj, received = expect(obj, at(2), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION, settings=KEYED)
    assert checkpoint_of(received).sealed == checkpoint_of(obj["status"]["checkpoint"]).sealed


@pytest.mark.parametrize(
    ("keyring", "message"),
    [(KEYRING, "'k2025' is not in the keyring"), (None, "no sealing keyring")],
    ids=["key-retired", "no-keyring"],
)
def test_a_sealed_value_that_cannot_be_unsealed_quarantines_untouched(
    keyring: Keyring | None, message: str
) -> None:
    obj = waiting_with_a_sealed_value(RETIRED)
    obj, commit = quarantine(obj, at(2), settings=Settings(keyring=keyring))
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "Undecryptable"
    assert "apiToken" in commit.status.outcome.message
    assert message in commit.status.outcome.message


def test_a_tampered_sealed_value_quarantines() -> None:
    obj = waiting_with_a_sealed_value(KEYRING)
    sealed = obj["status"]["checkpoint"]["sealed"]["apiToken"]
    flipped = bytearray(base64.b64decode(sealed["ciphertext"]))
    flipped[0] ^= 1
    sealed["ciphertext"] = base64.b64encode(bytes(flipped)).decode()
    _, commit = quarantine(obj, at(2), settings=KEYED)
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "Undecryptable"


def test_an_undecryptable_run_is_released_once_its_key_is_back() -> None:
    obj = waiting_with_a_sealed_value(RETIRED)
    obj, _ = quarantine(obj, at(2), settings=KEYED)
    obj["spec"].update(retry_request(obj, "key-restored"))
    still = decide_on(obj, at(3), settings=KEYED)
    assert isinstance(still, Idle)
    assert "still unreadable" in still.reason
    both = Keyring(keys={**KEYRING.keys, **RETIRED.keys}, active_key_id="k2030")
    obj, released = expect(
        obj, at(4), RunEvent.RELEASE_QUARANTINE, RunState.RESUME_VALIDATION, settings=Settings(keyring=both)
    )
    assert released.status.quarantine_retried == "key-restored"


def test_sealed_values_stay_bound_to_the_run_id_across_a_restore() -> None:
    """Sealed values are bound to the run (associated data): to its recorded run ID, so a run
    restored from a backup (a new uid) still unseals its own values, and another run cannot."""
    obj = waiting_with_a_sealed_value(KEYRING)
    obj["metadata"]["uid"] = "3f0c2a4e-0000-4000-8000-restored0001"
    _, received = expect(
        copy.deepcopy(obj), at(2), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION, settings=KEYED
    )
    assert received.status.run_id == UID, "the recorded run ID, not the restored object's uid"

    # Another run's ID: the values do not authenticate, and the run is quarantined for exactly that.
    obj["status"]["runId"] = "another-run"
    obj, commit = quarantine(obj, at(2), settings=KEYED)
    outcome = commit.status.outcome
    assert outcome is not None
    assert outcome.reason == "Undecryptable"
    assert outcome.message.startswith("sealed field 'apiToken': sealed value does not authenticate with key")
    assert "bound elsewhere" in outcome.message
    assert condition_view(commit.status)["Quarantined"] == ("True", "Undecryptable")
    entry = commit.status.history[-1]
    assert (entry.event, entry.from_state, entry.to_state, entry.detail) == (
        "quarantine",
        RunState.WAITING_INPUT,
        RunState.QUARANTINED,
        "Undecryptable",
    )
    assert commit.status.run_id == "another-run"


# --- integrity: only a checkpoint this operator committed is resumed -----------------------------

APPROVALS = replace(settings_with(tier=ActionTier.CONSEQUENTIAL), keyring=KEYRING)


def waiting_for_approval() -> dict[str, Any]:
    """A run waiting for approval of its consequential effect, every commit stamped."""
    obj = walk(new_run(steps=[effect("pay"), DONE]), RunState.WAITING_APPROVAL, settings=APPROVALS)
    assert verify_integrity(obj["status"]["checkpoint"], keyring=KEYRING, run_id=UID) is None
    return obj


def forge_approval(obj: dict[str, Any], *, by: str = "mallory") -> dict[str, Any]:
    """What a user with ``patch`` on ``agentruns/status`` can write: an approval recorded in the
    checkpoint, and the run moved to ``resume_validation`` (status and checkpoint agree)."""
    out = copy.deepcopy(obj)
    status, cp = out["status"], out["status"]["checkpoint"]
    cp["approvals"][0].update(decision="approved", decidedBy=by, decidedAt="2030-01-01T12:00:05Z")
    version = status["stateVersion"] + 1
    cp["position"].update(state="resume_validation", stateVersion=version)
    status.update(state="resume_validation", stateVersion=version, approvalRequest=None)
    return out


def test_a_forged_approval_quarantines_the_run_integrity_failed_and_nothing_is_intended() -> None:
    obj = forge_approval(waiting_for_approval())
    obj, commit = quarantine(obj, at(5), settings=APPROVALS)
    assert commit.intents == ()
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "IntegrityFailed"
    assert "does not verify" in commit.status.outcome.message
    assert condition_view(commit.status)["Quarantined"] == ("True", "IntegrityFailed")
    assert commit.status.history[-1].detail == "IntegrityFailed"
    # Parked: it waits for a person, whatever the clock says.
    assert decide_on(obj, at(3600), settings=APPROVALS) == Idle(
        reason="quarantined: retry (spec.retryQuarantine) or cancel"
    )


def test_after_restoring_the_checkpoint_from_a_backup_a_retry_resumes_and_asks_again() -> None:
    backup = waiting_for_approval()
    obj, _ = quarantine(forge_approval(backup), at(5), settings=APPROVALS)
    # Retried as it is: the forged checkpoint still does not verify, the run stays put.
    obj = patch_spec(obj, **retry_request(obj, "inspected"))
    still = decide_on(obj, at(6), settings=APPROVALS)
    assert isinstance(still, Idle)
    assert "still unreadable" in still.reason
    assert "does not verify" in still.reason
    # The admin restores the last checkpoint the operator committed (from the backup) and retries.
    obj["status"]["checkpoint"] = copy.deepcopy(backup["status"]["checkpoint"])
    obj = patch_spec(obj, **retry_request(obj, "restored"))
    obj, released = expect(
        obj, at(7), RunEvent.RELEASE_QUARANTINE, RunState.RESUME_VALIDATION, settings=APPROVALS
    )
    assert released.status.quarantine_retried == "restored"
    # The request was never decided: a new one is asked for, nothing is intended.
    obj, asked = expect(
        obj, at(8), RunEvent.REAPPROVAL_REQUIRED, RunState.WAITING_APPROVAL, settings=APPROVALS
    )
    assert asked.intents == ()
    assert asked.status.approval_request is not None
    assert asked.status.approval_request.request_id == "pay-2"


def test_a_status_moved_without_its_checkpoint_quarantines() -> None:
    obj = waiting_for_approval()
    obj["status"]["state"] = "resume_validation"  # the checkpoint, stamped, still says waiting_approval
    _, commit = quarantine(obj, at(5), settings=APPROVALS)
    assert commit.status.outcome is not None
    message = commit.status.outcome.message
    assert commit.status.outcome.reason == "IntegrityFailed"
    assert "status says resume_validation at stateVersion 2" in message
    assert "checkpoint says waiting_approval at stateVersion 2" in message


def test_a_checkpoint_copied_from_another_run_quarantines() -> None:
    obj = waiting_for_approval()
    obj["status"]["runId"] = "another-run"
    _, commit = quarantine(obj, at(5), settings=APPROVALS)
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "IntegrityFailed"
    assert "'another-run'" in commit.status.outcome.message


def test_an_unstamped_checkpoint_of_the_current_schema_quarantines() -> None:
    obj = waiting_for_approval()
    del obj["status"]["checkpoint"]["integrity"]
    _, commit = quarantine(obj, at(5), settings=APPROVALS)
    assert commit.status.outcome is not None
    assert "carries no integrity stamp" in commit.status.outcome.message


def test_a_stamp_by_a_retired_key_quarantines_until_the_key_is_back() -> None:
    obj = walk(new_run(steps=[ask("confirm"), DONE]), RunState.WAITING_INPUT, settings=KEYED)
    obj["spec"]["answers"] = {"confirm": "yes"}
    rotated = Settings(keyring=RETIRED)
    obj, commit = quarantine(obj, at(5), settings=rotated)
    assert commit.status.outcome is not None
    assert "'k2030', which is not in this operator's keyring" in commit.status.outcome.message
    both = Keyring(keys={**KEYRING.keys, **RETIRED.keys}, active_key_id="k2025")
    obj = patch_spec(obj, **retry_request(obj, "key-back"))
    obj, released = expect(
        obj, at(6), RunEvent.RELEASE_QUARANTINE, RunState.RESUME_VALIDATION, settings=Settings(keyring=both)
    )
    assert (checkpoint_of(released).integrity or "").startswith("k2025:"), "stamped with the active key"


def test_a_takeover_fencing_write_keeps_the_stamp_valid() -> None:
    obj = waiting_for_approval()
    status = fence(
        snap(obj), EPOCH.model_copy(update={"lease_transitions": 9}), now=at(5), settings=APPROVALS
    )
    assert status is not None
    fenced = apply_status(obj, status)
    assert fenced["status"]["checkpoint"]["fencing"]["leaseTransitions"] == 9
    assert isinstance(load_stored(snap(fenced), APPROVALS), Loaded)


def test_the_initial_checkpoint_a_fencing_write_stores_is_stamped() -> None:
    obj = new_run(steps=[DONE])
    status = fence(snap(obj), EPOCH, now=at(1), settings=KEYED)
    assert status is not None
    assert verify_integrity(status["checkpoint"], keyring=KEYRING, run_id=UID) is None
    fenced = apply_status(obj, status)
    expect(fenced, at(2), RunEvent.ACCEPTED, RunState.READY, settings=KEYED)


# --- legacy: a checkpoint the previous operator version wrote (schemaVersion 2, unstamped) -------


def as_legacy(obj: dict[str, Any]) -> dict[str, Any]:
    """The same run as the previous operator version stored it: schemaVersion 2, no stamp (and
    no position stamp, which came later still)."""
    out = copy.deepcopy(obj)
    cp = out["status"]["checkpoint"]
    cp.pop("integrity", None)
    cp.pop("positionStamped", None)
    out["status"].pop("positionStamp", None)
    cp["schemaVersion"] = 2
    return out


def test_a_legacy_checkpoint_is_adopted_and_stamped_at_the_next_commit() -> None:
    obj = walk(new_run(steps=[ask("confirm"), DONE]), RunState.WAITING_INPUT, settings=KEYED)
    legacy = as_legacy(obj)
    legacy["spec"]["answers"] = {"confirm": "yes"}
    loaded = load_stored(snap(legacy), KEYED)
    assert isinstance(loaded, Loaded), loaded
    assert loaded.migrated_from == 2
    # Adopted in memory already stamped: a takeover's fencing write stores a verifiable checkpoint.
    assert loaded.checkpoint.integrity is not None
    status = fence(snap(legacy), EPOCH, now=at(2), settings=KEYED)
    assert status is not None
    assert verify_integrity(status["checkpoint"], keyring=KEYRING, run_id=UID) is None
    obj, received = expect(legacy, at(3), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION, settings=KEYED)
    assert received.migrated_from == 2
    assert verify_integrity(obj["status"]["checkpoint"], keyring=KEYRING, run_id=UID) is None


def decided_legacy(*, in_spec: bool) -> dict[str, Any]:
    """A legacy run past its approval: the decision recorded in its checkpoint, and (if
    ``in_spec``) in spec.approvals as the webhook stamped it."""
    obj = forge_approval(waiting_for_approval(), by="alice")
    if in_spec:
        digest = obj["status"]["checkpoint"]["approvals"][0]["digest"]
        obj["spec"]["approvals"] = {
            "pay-1": {"digest": digest, "decision": "approve", "approver": {"username": "alice"}}
        }
    return as_legacy(obj)


def test_a_legacy_decision_that_spec_approvals_corroborates_is_adopted() -> None:
    loaded = load_stored(snap(decided_legacy(in_spec=True)), APPROVALS)
    assert isinstance(loaded, Loaded), loaded
    decision = commit_of(decide_on(decided_legacy(in_spec=True), at(5), settings=APPROVALS))
    assert decision.event is not RunEvent.QUARANTINE, decision.detail


@pytest.mark.parametrize(
    "spec_decision",
    [
        None,
        {"decision": "approve", "approver": {"username": "bob"}},
        {"decision": "reject", "approver": {"username": "alice"}},
        {"decision": "approve"},
    ],
    ids=["absent", "another-approver", "another-decision", "unstamped"],
)
def test_a_legacy_decision_spec_approvals_does_not_hold_quarantines(
    spec_decision: dict[str, Any] | None,
) -> None:
    obj = decided_legacy(in_spec=False)
    if spec_decision is not None:
        digest = obj["status"]["checkpoint"]["approvals"][0]["digest"]
        obj["spec"]["approvals"] = {"pay-1": {"digest": digest, **spec_decision}}
    loaded = load_stored(snap(obj), APPROVALS)
    assert isinstance(loaded, Quarantine)
    assert loaded.reason == "IntegrityFailed"
    assert "schemaVersion 2 checkpoint (from before checkpoints were stamped) not adopted" in loaded.message
    assert "approval 'pay-1' is recorded as approved by alice" in loaded.message


def test_a_legacy_intent_that_skips_its_approval_quarantines() -> None:
    obj = waiting_for_approval()
    cp = obj["status"]["checkpoint"]
    key = f"{UID}/0/pay"
    cp["pendingActions"] = [
        {
            "idempotencyKey": key,
            "actionRecordName": "act-" + "0" * 40,
            "effect": "http.post",
            "tier": "reversible",  # the record may say so: the policy's tier is what counts
            "stepIndex": 0,
        }
    ]
    version = obj["status"]["stateVersion"] + 1
    cp["position"].update(state="waiting_external", stateVersion=version)
    obj["status"].update(state="waiting_external", stateVersion=version)
    loaded = load_stored(snap(as_legacy(obj)), APPROVALS)
    assert isinstance(loaded, Quarantine)
    assert f"pending action '{key}' (consequential) needs an approval" in loaded.message


def test_a_legacy_checkpoint_whose_status_moved_on_quarantines() -> None:
    obj = as_legacy(walk(new_run(steps=[ask("confirm"), DONE]), RunState.WAITING_INPUT, settings=KEYED))
    obj["status"]["state"] = "ready"
    loaded = load_stored(snap(obj), KEYED)
    assert isinstance(loaded, Quarantine)
    assert "status says ready" in loaded.message


def test_without_keys_nothing_is_stamped_or_verified() -> None:
    keyed = walk(new_run(steps=[ask("confirm"), DONE]), RunState.WAITING_INPUT, settings=KEYED)
    keyed["spec"]["answers"] = {"confirm": "yes"}
    _, commit = expect(keyed, at(2), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION, settings=Settings())
    assert commit.checkpoint is not None
    assert "integrity" not in commit.checkpoint, "no stale stamp outlives a commit made without keys"
