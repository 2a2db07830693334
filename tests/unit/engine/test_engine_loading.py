"""The checkpoint a decision starts from: the initial one, and a stored one with sealed values."""

from __future__ import annotations

import base64
import copy
from datetime import datetime
from typing import Any

import pytest
from tests.unit.builders import (
    DONE,
    T0,
    UID,
    apply,
    ask,
    at,
    checkpoint_of,
    commit_of,
    condition_view,
    decide_on,
    expect,
    new_run,
    step,
)

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import RuntimeConfig, dump_checkpoint, seal_field
from durable_agents.core.engine import Commit, Idle, Settings
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


def waiting_with_a_sealed_value(sealed_by: Keyring, run_id: str = UID) -> dict[str, Any]:
    """A run in waiting_input whose checkpoint carries one sealed value (sealed by ``sealed_by``)."""
    keyed = Settings(keyring=KEYRING)
    obj, _ = expect(
        new_run(steps=[ask("confirm"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY, settings=keyed
    )
    obj, _ = expect(obj, at(1), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT, settings=keyed)
    cp = seal_field(
        checkpoint_of(obj["status"]["checkpoint"]), "apiToken", b"s3cret", keyring=sealed_by, run_uid=run_id
    )
    obj["status"]["checkpoint"] = dump_checkpoint(cp)
    obj["spec"]["answers"] = {"confirm": "yes"}
    return obj


def quarantine(obj: dict[str, Any], now: datetime, *, settings: Settings) -> tuple[dict[str, Any], Commit]:
    """Decide, expect the quarantine commit (the checkpoint kept as stored), and store it."""
    commit = commit_of(decide_on(obj, now, settings=settings))
    assert (commit.event, commit.status.state) == (RunEvent.QUARANTINE, RunState.QUARANTINED), commit.detail
    return apply(obj, commit), commit


def test_a_sealed_value_this_keyring_unseals_lets_the_run_go_on() -> None:
    obj = waiting_with_a_sealed_value(KEYRING)
    obj, received = expect(
        obj, at(2), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION, settings=Settings(keyring=KEYRING)
    )
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
    stored = copy.deepcopy(obj["status"]["checkpoint"])
    obj, commit = quarantine(obj, at(2), settings=Settings(keyring=keyring))
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "Undecryptable"
    assert "apiToken" in commit.status.outcome.message
    assert message in commit.status.outcome.message
    assert obj["status"]["checkpoint"] == stored, "the checkpoint is kept exactly as stored"


def test_a_tampered_sealed_value_quarantines() -> None:
    obj = waiting_with_a_sealed_value(KEYRING)
    sealed = obj["status"]["checkpoint"]["sealed"]["apiToken"]
    flipped = bytearray(base64.b64decode(sealed["ciphertext"]))
    flipped[0] ^= 1
    sealed["ciphertext"] = base64.b64encode(bytes(flipped)).decode()
    _, commit = quarantine(obj, at(2), settings=Settings(keyring=KEYRING))
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "Undecryptable"


def test_an_undecryptable_run_is_released_once_its_key_is_back() -> None:
    obj = waiting_with_a_sealed_value(RETIRED)
    obj, _ = quarantine(obj, at(2), settings=Settings(keyring=KEYRING))
    obj["spec"]["retryQuarantine"] = "key-restored"
    still = decide_on(obj, at(3), settings=Settings(keyring=KEYRING))
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
        copy.deepcopy(obj),
        at(2),
        RunEvent.INPUT_RECEIVED,
        RunState.RESUME_VALIDATION,
        settings=Settings(keyring=KEYRING),
    )
    assert received.status.run_id == UID, "the recorded run ID, not the restored object's uid"

    # Another run's ID: the values do not authenticate, and the run is quarantined for exactly that.
    obj["status"]["runId"] = "another-run"
    stored = copy.deepcopy(obj["status"]["checkpoint"])
    obj, commit = quarantine(obj, at(2), settings=Settings(keyring=KEYRING))
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
    assert obj["status"]["checkpoint"] == stored, "the checkpoint is kept exactly as stored"
