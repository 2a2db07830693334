"""Key rotation, pure parts: which keys a run still uses, a checkpoint re-stamped under the active
key (only if it verifies), and which key IDs a change of a keyring Secret takes away."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from durable_agents.core.checkpoint import (
    Checkpoint,
    Loaded,
    Position,
    Timestamps,
    dump_checkpoint,
    load_checkpoint,
    seal_field,
    stamp_checkpoint,
    unseal_field,
    verify_integrity,
)
from durable_agents.core.key_use import keys_in_use, needs_restamp, restamp_stored
from durable_agents.core.sealed_values import DATA_KEY_ANNOTATION, new_data_key, wrap_data_key
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import stamp_key_id
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.keys.keyguard import KEYRING_LABEL, removed_keys
from durable_agents.shell.keys.resealer import PassReport, Resealer
from durable_agents_controllers.config import ConfigError, OperatorConfig

pytestmark = pytest.mark.unit

K1, K2 = bytes(32), bytes(range(32))
OLD = Keyring(keys={"k1": K1}, active_key_id="k1")
ROTATED = Keyring(keys={"k1": K1, "k2": K2}, active_key_id="k2")
RETIRED = Keyring(keys={"k2": K2}, active_key_id="k2")
RUN_ID = "run-uid-1"
T = datetime(2026, 1, 1, tzinfo=UTC)


def stored_checkpoint(keyring: Keyring, *, sealed: bytes | None = None) -> dict[str, Any]:
    cp = Checkpoint(
        position=Position(state="waiting_input", step=0, state_version=3),
        timestamps=Timestamps(created_at=T, updated_at=T, entered_state_at=T),
    )
    if sealed is not None:
        cp = seal_field(cp, "token", sealed, keyring=keyring, run_uid=RUN_ID, entropy=os.urandom)
    return dump_checkpoint(stamp_checkpoint(cp, keyring=keyring, run_id=RUN_ID))


def run(state: str | None, checkpoint: dict[str, Any] | None, **spec: Any) -> dict[str, Any]:
    annotations = {
        DATA_KEY_ANNOTATION: wrap_data_key(
            OLD, new_data_key(entropy=os.urandom), "ns", "r1", entropy=os.urandom
        )
    }
    status: dict[str, Any] = {"runId": RUN_ID}
    if state is not None:
        status["state"] = state
    if checkpoint is not None:
        status["checkpoint"] = checkpoint
    return {
        "metadata": {"namespace": "ns", "name": "r1", "annotations": annotations},
        "spec": spec,
        "status": status,
    }


SPEC_STAMPS = {
    "createdBy": {"username": "erin", "stamp": "k3:QUJD"},
    "approvals": {"pay-1": {"digest": "sha256:" + "0" * 64, "decision": "approve", "stamp": "k1:QUJD"}},
    "cancellations": {"c1": {"scope": "task", "stamp": "k3:QUJD"}},
    "retryQuarantineRequest": {"requestedBy": {"username": "on-call"}, "stamp": "k4:QUJD"},
}


def test_a_live_run_uses_its_data_key_checkpoint_and_the_stamps_still_to_verify() -> None:
    uses = keys_in_use(run("waiting_input", stored_checkpoint(ROTATED), **SPEC_STAMPS))
    assert uses == {
        "k1": ["data key", "spec.approvals['pay-1'] stamp"],
        "k2": ["checkpoint integrity"],
        "k3": ["spec.cancellations['c1'] stamp"],  # createdBy: the run was accepted, never checked again
        "k4": ["spec.retryQuarantineRequest stamp"],
    }


def test_the_creator_stamp_counts_until_the_run_is_accepted() -> None:
    for unaccepted in (run(None, None, **SPEC_STAMPS), run("pending", stored_checkpoint(OLD), **SPEC_STAMPS)):
        assert "spec.createdBy stamp" in keys_in_use(unaccepted)["k3"]


def test_a_terminal_run_keeps_its_data_key_and_checkpoint_in_use_and_nothing_else() -> None:
    sealed = stored_checkpoint(OLD, sealed=b"secret")
    uses = keys_in_use(run("completed", sealed, **SPEC_STAMPS))
    assert uses == {"k1": ["data key", "checkpoint integrity", "checkpoint sealed field 'token'"]}


def test_child_stamps_count_and_garbage_is_no_use() -> None:
    child = run("waiting_input", None)
    child["metadata"]["annotations"]["durable-agents.io/child-stamp"] = "k5:QUJD"
    assert keys_in_use(child)["k5"] == ["child stamp"]
    assert keys_in_use({}) == {}
    junk = {
        "metadata": {"annotations": {DATA_KEY_ANNOTATION: 7}},
        "spec": {"approvals": ["x"]},
        "status": "?",
    }
    assert keys_in_use(junk) == {}


def test_restamp_moves_the_checkpoint_to_the_active_key_without_changing_it() -> None:
    old = stored_checkpoint(OLD)
    assert needs_restamp(old, "k2")
    new = restamp_stored(old, ROTATED, RUN_ID, entropy=os.urandom)
    assert new is not None
    assert stamp_key_id(new["integrity"]) == "k2"
    assert {k: v for k, v in new.items() if k != "integrity"} == {
        k: v for k, v in old.items() if k != "integrity"
    }
    assert verify_integrity(new, keyring=RETIRED, run_id=RUN_ID) is None  # k1 no longer needed
    assert verify_integrity(old, keyring=RETIRED, run_id=RUN_ID) is not None
    assert verify_integrity(new, keyring=RETIRED, run_id="another-run") is not None
    assert not needs_restamp(new, "k2")
    assert restamp_stored(new, ROTATED, RUN_ID, entropy=os.urandom) is None  # already there: no write


def test_restamp_reseals_legacy_sealed_fields_too() -> None:
    old = stored_checkpoint(OLD, sealed=b"secret")
    new = restamp_stored(old, ROTATED, RUN_ID, entropy=os.urandom)
    assert new is not None
    assert new["sealed"]["token"]["keyId"] == "k2"
    loaded = load_checkpoint(new)
    assert isinstance(loaded, Loaded)
    assert verify_integrity(new, keyring=RETIRED, run_id=RUN_ID) is None
    assert unseal_field(loaded.checkpoint, "token", keyring=RETIRED, run_uid=RUN_ID) == b"secret"


def test_a_checkpoint_that_does_not_verify_is_never_restamped() -> None:
    tampered = {**stored_checkpoint(OLD), "position": {"state": "completed", "step": 9, "stateVersion": 3}}
    assert restamp_stored(tampered, ROTATED, RUN_ID, entropy=os.urandom) is None
    assert restamp_stored(stored_checkpoint(OLD), ROTATED, "another-run", entropy=os.urandom) is None
    unknown_key = stored_checkpoint(Keyring(keys={"k9": K2}, active_key_id="k9"))
    assert restamp_stored(unknown_key, ROTATED, RUN_ID, entropy=os.urandom) is None
    legacy = {"schemaVersion": 2, "position": {"state": "ready", "step": 0, "stateVersion": 1}}
    assert not needs_restamp(legacy, "k2")  # no stamp, no key: the engine's to adopt, not this pass's
    assert restamp_stored(legacy, ROTATED, RUN_ID, entropy=os.urandom) is None


def secret(labelled: bool = True, **data: str) -> dict[str, Any]:
    labels = {KEYRING_LABEL: "true"} if labelled else {}
    return {"metadata": {"name": "keys", "labels": labels}, "data": data}


def test_what_a_keyring_change_takes_away() -> None:
    old = secret(k1="QQ==", k2="Qg==")
    assert removed_keys(secret(k1="QQ==", k2="Qg==", k3="Qw=="), old, "UPDATE") == set()
    assert removed_keys(secret(k2="Qg=="), old, "UPDATE") == {"k1"}
    assert removed_keys(secret(k1="Wg==", k2="Qg=="), old, "UPDATE") == {"k1"}  # new bytes, same ID
    assert removed_keys(secret(False, k1="QQ==", k2="Qg=="), old, "UPDATE") == {"k1", "k2"}  # unguarded
    assert removed_keys(None, old, "DELETE") == {"k1", "k2"}


def test_the_rotation_pass_is_configured_by_interval_and_pace(tmp_path: Path) -> None:
    (tmp_path / "k1").write_bytes(K1)
    keys = {"DURABLE_AGENTS_SEALING_KEYS_DIR": str(tmp_path), "DURABLE_AGENTS_SEALING_ACTIVE_KEY": "k1"}
    default = OperatorConfig.from_env(keys)
    assert (default.reseal_interval, default.reseal_writes_per_second) == (600.0, 20.0)
    tuned = OperatorConfig.from_env(
        {**keys, "DURABLE_AGENTS_RESEAL_INTERVAL": "1h30m", "DURABLE_AGENTS_RESEAL_WRITES_PER_SECOND": "2.5"}
    )
    assert (tuned.reseal_interval, tuned.reseal_writes_per_second) == (5400.0, 2.5)
    for variable, value in (
        ("RESEAL_INTERVAL", "soon"),
        ("RESEAL_INTERVAL", "0s"),
        ("RESEAL_WRITES_PER_SECOND", "0"),
    ):
        with pytest.raises(ConfigError, match=f"DURABLE_AGENTS_{variable}="):
            OperatorConfig.from_env({**keys, f"DURABLE_AGENTS_{variable}": value})


class NoApiServer:
    """Any use of the API server fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API server was used: {name}")


@pytest.mark.parametrize(
    ("keyring", "passes"), [(RETIRED, False), (ROTATED, True)], ids=["one-key", "two-keys"]
)
async def test_a_keyring_of_one_key_runs_no_rotation_pass(keyring: Keyring, passes: bool) -> None:
    """Each pass lists every run (a second list beside the worker's at every start); with a keyring
    of one key nothing could be re-sealed, so none is made."""
    started = asyncio.Event()

    class Counted(Resealer):
        async def reseal_all(self) -> PassReport:
            started.set()
            return PassReport()

    resealer = Counted(cast(Kube, NoApiServer()), keyring)
    resealer.start()
    try:
        if passes:
            await asyncio.wait_for(started.wait(), 5)
        else:
            for _ in range(20):  # the task's first steps: it would have listed by now
                await asyncio.sleep(0)
            assert resealer.running
            assert not started.is_set()
    finally:
        await resealer.stop()
