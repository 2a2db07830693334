"""One read of a run is validated and verified once, however often the worker decides on it (model
turns, observations): the memo on :class:`RunSnapshot` (issue 38 item 2). What it keeps must never
outlive the read: a new read, another keyring, or a tampered record is looked at anew."""

from __future__ import annotations

import base64
import copy
from dataclasses import replace
from typing import Any

import pytest
from tests.unit.builders import DONE, EPOCH, PLANNER, T0, ask, at, checkpoint_of, expect, new_run, snap

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import Loaded, Quarantine, seal_field, stamp_checkpoint
from durable_agents.core.checkpoint import versions as checkpoint_versions
from durable_agents.core.engine import Commit, RunSnapshot, Settings, decide
from durable_agents.core.engine import snapshot as snapshot_module
from durable_agents.core.engine.commits import committed_read
from durable_agents.core.engine.fencing import recorded_epoch, snapshot_epoch
from durable_agents.core.engine.loading import load_stored
from durable_agents.core.sealing import Keyring
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit

KEYRING = Keyring(keys={"k2030": bytes(range(32))}, active_key_id="k2030")
KEYED = Settings(keyring=KEYRING)


def waiting() -> dict[str, Any]:
    obj, _ = expect(
        new_run(steps=[ask("confirm"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY, settings=KEYED
    )
    obj, _ = expect(obj, at(1), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT, settings=KEYED)
    return obj


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a checkpoint was validated (each call of load_checkpoint from a snapshot)."""
    calls: list[int] = []
    real = checkpoint_versions.load_checkpoint

    def counted(raw: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(raw, *args, **kwargs)

    monkeypatch.setattr(snapshot_module, "load_checkpoint", counted)
    return calls


def test_one_read_is_validated_once_for_its_epoch_and_every_decision(loads: list[int]) -> None:
    run = snap(waiting())
    loads.clear()  # the decisions that parked it
    first = load_stored(run, KEYED)
    assert isinstance(first, Loaded)
    assert snapshot_epoch(run) == first.checkpoint.fencing
    assert recorded_epoch(run) is not None
    for _ in range(3):  # decided again on the same read: model turns
        assert load_stored(run, KEYED) is first
    assert len(loads) == 1


def test_a_new_read_is_validated_again(loads: list[int]) -> None:
    obj = waiting()
    loads.clear()
    load_stored(snap(obj), KEYED)
    load_stored(snap(obj), KEYED)
    run = snap(obj)
    load_stored(replace(run, data_key=run.data_key), KEYED)  # replace: a new read, a new memo
    assert len(loads) == 3


def test_another_keyring_is_verified_again_not_served_from_the_memo() -> None:
    obj = waiting()
    cp = seal_field(
        checkpoint_of(obj["status"]["checkpoint"]),
        "apiToken",
        b"s3cret",
        keyring=KEYRING,
        run_uid=obj["metadata"]["uid"],
        entropy=lambda n: bytes(n),
    )
    obj["status"]["checkpoint"] = stamp_checkpoint(
        cp, keyring=KEYRING, run_id=obj["metadata"]["uid"]
    ).model_dump(mode="json", by_alias=True, exclude_none=True)
    run = snap(obj)
    assert isinstance(load_stored(run, KEYED), Loaded)
    other = Keyring(keys={"k2031": bytes(range(1, 33))}, active_key_id="k2031")
    refused = load_stored(run, Settings(keyring=other))
    assert isinstance(refused, Quarantine), "a keyring that cannot unseal it is asked, not the memo"
    assert isinstance(load_stored(run, KEYED), Loaded)


def test_a_tampered_record_read_again_is_quarantined_though_the_first_read_verified() -> None:
    obj = waiting()
    assert isinstance(load_stored(snap(obj), KEYED), Loaded)
    tampered = copy.deepcopy(obj)
    tampered["status"]["checkpoint"]["answers"] = {"confirm": base64.b64encode(b"forged").decode()}
    assert isinstance(load_stored(snap(tampered), KEYED), Quarantine)


def test_the_next_transition_takes_the_validated_spec_when_it_shares_the_record_s_spec() -> None:
    obj = waiting()
    first = snap(obj)
    after_commit = {**obj, "status": {**obj["status"], "stateVersion": obj["status"]["stateVersion"] + 1}}
    again = RunSnapshot.from_object(after_commit, prior=first)
    assert again.spec is first.spec, "the same spec object: not validated again"
    assert again.status.state_version == first.status.state_version + 1, "the status is read anew"


def test_a_spec_read_anew_is_validated_anew_even_with_a_prior() -> None:
    obj = waiting()
    first = snap(obj)
    changed = copy.deepcopy(obj)
    changed["spec"]["answers"] = {"confirm": "no"}
    again = RunSnapshot.from_object(changed, prior=first)
    assert again.spec is not first.spec
    assert again.spec.answers == {"confirm": "no"}


def test_a_unit_s_chain_of_commits_decides_as_reads_from_the_api_server_would(loads: list[int]) -> None:
    """The worker decides on after a commit without reading it back (``committed_read``): each
    decision must be the one a fresh read of the same record gives, and take no load of its own."""
    body = waiting()
    body["spec"]["answers"] = {"confirm": "yes"}
    base = snap(body)
    commits = 0
    for i in range(12):
        now = at(2 + i)
        decision = decide(base, now=now, epoch=EPOCH, planner=PLANNER, settings=KEYED)
        fresh = decide(snap(copy.deepcopy(body)), now=now, epoch=EPOCH, planner=PLANNER, settings=KEYED)
        assert decision == fresh, f"decision {i} differs from a fresh read's"
        if not isinstance(decision, Commit):
            break
        assert decision.stamped is not None
        assert checkpoint_of(decision) == decision.stamped, "the stamped model is what its dump loads as"
        body = {**body, "status": decision.wire_status()}
        base = committed_read(body, decision, prior=base)
        assert base.status == snap(copy.deepcopy(body)).status, (
            "the commit's status is what its dump validates as"
        )
        loads.clear()
        assert isinstance(load_stored(base, KEYED), Loaded)
        assert loads == [], "the committed checkpoint is not loaded back"
        commits += 1
    assert commits >= 3, "the chain went through several commits (answer, validation, completion)"


def test_a_committed_read_of_another_checkpoint_is_loaded_as_any_read() -> None:
    body = waiting()
    body["spec"]["answers"] = {"confirm": "yes"}
    decision = decide(snap(body), now=at(2), epoch=EPOCH, planner=PLANNER, settings=KEYED)
    assert isinstance(decision, Commit)
    other = {**body, "status": {**decision.wire_status(), "checkpoint": copy.deepcopy(decision.checkpoint)}}
    read = committed_read(other, decision, prior=snap(body))
    assert "loaded" not in read._memo, "a checkpoint that is not the commit's own object is read as stored"
    assert read.status is not decision.status, "and so is the status beside it"
