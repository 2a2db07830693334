"""The engine acts on an answer or event only when its seal proves the webhook admitted it.

A run with a data key (created through the webhook): a value that is not sealed, or not sealed for
its own key, is refused once (``refusedRequests``) and the run waits for the same question or event
under a new key. A run without one (created before sealing) believes what is written.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from tests.unit.builders import (
    KEYRING,
    T0,
    apply,
    at,
    checkpoint_of,
    commit_of,
    drive,
    new_run,
    patch_spec,
    step,
)

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import Idle, Settings
from durable_agents.core.engine.commits import Refusal
from durable_agents.core.engine.waits import awaited_key
from durable_agents.core.sealed_values import (
    DATA_KEY_ANNOTATION,
    fingerprint,
    new_data_key,
    seal_value,
    wrap_data_key,
)
from durable_agents.core.sealing import Keyring
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit

DATA_KEY = new_data_key(entropy=os.urandom)
SETTINGS = Settings(keyring=KEYRING)
WAITS: dict[str, tuple[dict[str, Any], str, str, RunState]] = {
    # kind: (step body, spec field, first key, waiting state)
    "ask": ({"question": "go on?"}, "answers", "confirm", RunState.WAITING_INPUT),
    "await": ({"event": "window"}, "events", "window", RunState.WAITING_EXTERNAL),
}


def sealed_run(kind: str) -> dict[str, Any]:
    body, _, _, _ = WAITS[kind]
    obj = new_run(steps=[{"name": "confirm", kind: body}, {"name": "done", "complete": {"result": "ok"}}])
    obj["metadata"]["annotations"] = {
        DATA_KEY_ANNOTATION: wrap_data_key(KEYRING, DATA_KEY, "team-a", "run-1", entropy=os.urandom)
    }
    return obj


def waiting(obj: dict[str, Any]) -> dict[str, Any]:
    obj, _, idle = drive(obj, T0, settings=SETTINGS)
    assert isinstance(idle, Idle)
    return obj


def deliver(obj: dict[str, Any], field: str, key: str, value: str) -> dict[str, Any]:
    return patch_spec(obj, **{field: {**obj["spec"].get(field, {}), key: value}})


def awaited_now(obj: dict[str, Any], kind: str) -> str:
    cp = checkpoint_of(obj["status"]["checkpoint"])
    pending = cp.pending_input if kind == "ask" else cp.pending_external
    assert pending is not None
    return awaited_key(pending)


@pytest.mark.parametrize("kind", sorted(WAITS))
@pytest.mark.parametrize(
    ("forged", "reason"),
    [
        (lambda field, key: "yes", "Unsealed"),
        (
            lambda field, key: seal_value(DATA_KEY, "yes", f"{field}/{key}-other", entropy=os.urandom),
            "SealInvalid",
        ),
        (
            lambda field, key: seal_value(
                new_data_key(entropy=os.urandom), "yes", f"{field}/{key}", entropy=os.urandom
            ),
            "SealInvalid",
        ),
    ],
    ids=["plaintext", "another-key's-seal", "another-run's-seal"],
)
def test_a_value_not_sealed_for_its_key_is_refused_and_asked_again(
    kind: str, forged: Any, reason: str
) -> None:
    _, field, key, state = WAITS[kind]
    obj = waiting(sealed_run(kind))
    prefix = "input" if kind == "ask" else "event"
    assert obj["status"]["waitingFor"] == f"{prefix}:{key}"
    obj = deliver(obj, field, key, forged(field, key))

    refusal = step(obj, at(1), settings=SETTINGS)
    assert isinstance(refusal, Refusal)
    assert refusal.moved
    assert refusal.event is RunEvent.REVALIDATION_REQUIRED, "never INPUT_RECEIVED/EXTERNAL_RECEIVED"
    assert (refusal.refused.field, refusal.refused.key, refusal.refused.reason) == (field, key, reason)
    assert refusal.refused.message.endswith(f"asked again as spec.{field}[{key}.2]")
    obj = apply(obj, refusal)
    assert awaited_now(obj, kind) == f"{key}.2"

    obj, commits, idle = drive(obj, at(2), settings=SETTINGS)
    assert [c.event for c in commits] == [
        RunEvent.INPUT_REQUESTED if kind == "ask" else RunEvent.EXTERNAL_AWAITED
    ]
    assert obj["status"]["state"] == state.value
    assert obj["status"]["waitingFor"] == f"{prefix}:{key}.2"
    assert isinstance(idle, Idle)
    assert idle.reason == "waiting"
    cp = checkpoint_of(obj["status"]["checkpoint"])
    assert cp.position.step == 0, "the step was not left"
    assert not cp.input_refs, "no answer recorded"
    assert [(r["field"], r["key"]) for r in obj["status"]["refusedRequests"]] == [(field, key)], "once"

    # The real one, sealed for the new key (as the webhook does): the run moves on and completes.
    obj = deliver(obj, field, f"{key}.2", seal_value(DATA_KEY, "yes", f"{field}/{key}.2", entropy=os.urandom))
    obj, commits, _ = drive(obj, at(3), settings=SETTINGS)
    assert obj["status"]["state"] == "completed"
    cp = checkpoint_of(obj["status"]["checkpoint"])
    assert [ref.uri.rsplit("/", 1)[1] for ref in cp.input_refs] == [f"{key}.2"]


@pytest.mark.parametrize("kind", sorted(WAITS))
def test_a_value_sealed_for_its_key_is_acted_on(kind: str) -> None:
    _, field, key, _ = WAITS[kind]
    obj = waiting(sealed_run(kind))
    obj = deliver(obj, field, key, seal_value(DATA_KEY, "yes", f"{field}/{key}", entropy=os.urandom))
    obj, _, _ = drive(obj, at(1), settings=SETTINGS)
    assert obj["status"]["state"] == "completed"
    assert not obj["status"].get("refusedRequests")


@pytest.mark.parametrize("kind", sorted(WAITS))
def test_a_run_without_a_data_key_believes_a_plaintext_value(kind: str) -> None:
    """Legacy: created before sealing (no data-key annotation)."""
    _, field, key, _ = WAITS[kind]
    obj = sealed_run(kind)
    del obj["metadata"]["annotations"]
    obj = deliver(waiting(obj), field, key, "yes")
    obj, _, _ = drive(obj, at(1), settings=SETTINGS)
    assert obj["status"]["state"] == "completed"


def test_a_key_forged_in_advance_is_skipped_and_each_refused_once() -> None:
    obj = waiting(sealed_run("ask"))
    obj = patch_spec(obj, answers={"confirm": "yes", "confirm.2": "yes too"})
    obj, _, idle = drive(obj, at(1), settings=SETTINGS)
    assert obj["status"]["waitingFor"] == "input:confirm.3"
    assert [r["key"] for r in obj["status"]["refusedRequests"]] == ["confirm"], "confirm.2 was never awaited"
    assert isinstance(idle, Idle)


def test_a_data_key_this_operator_cannot_open_quarantines_rather_than_believes() -> None:
    obj = waiting(sealed_run("ask"))
    obj = deliver(
        obj, "answers", "confirm", seal_value(DATA_KEY, "yes", "answers/confirm", entropy=os.urandom)
    )
    obj["metadata"]["annotations"][DATA_KEY_ANNOTATION] = "retired-key:AAAA"
    commit = commit_of(step(obj, at(1), settings=SETTINGS))
    assert commit.event is RunEvent.QUARANTINE
    assert commit.status.outcome is not None
    assert commit.status.outcome.reason == "Undecryptable"


def test_a_data_key_annotation_removed_by_hand_does_not_make_a_plaintext_answer_count() -> None:
    """With the webhook off, whoever may patch the run can delete its data-key annotation; the
    stamped checkpoint remembers that the run had one."""
    obj = waiting(sealed_run("ask"))
    assert checkpoint_of(obj["status"]["checkpoint"]).data_key_digest == fingerprint(DATA_KEY)
    del obj["metadata"]["annotations"][DATA_KEY_ANNOTATION]
    obj = deliver(obj, "answers", "confirm", "yes")
    commit = commit_of(step(obj, at(1), settings=SETTINGS))
    assert commit.event is RunEvent.QUARANTINE
    assert commit.status.outcome is not None
    assert "annotation is gone" in commit.status.outcome.message


def test_a_data_key_annotation_swapped_by_hand_does_not_make_another_key_s_answer_count() -> None:
    """An earlier run under the same name had its own data key (the annotation is bound to the
    namespace and name only): its annotation and one of its sealed answers, copied in with the
    webhook off, would open. The checkpoint's fingerprint says it is not this run's key."""
    obj = waiting(sealed_run("ask"))
    earlier = new_data_key(entropy=os.urandom)
    obj["metadata"]["annotations"][DATA_KEY_ANNOTATION] = wrap_data_key(
        KEYRING, earlier, "team-a", "run-1", entropy=os.urandom
    )
    obj = deliver(
        obj, "answers", "confirm", seal_value(earlier, "yes", "answers/confirm", entropy=os.urandom)
    )
    commit = commit_of(step(obj, at(1), settings=SETTINGS))
    assert commit.event is RunEvent.QUARANTINE
    assert commit.status.outcome is not None
    assert "another data key than the one it had" in commit.status.outcome.message


def test_a_key_rotation_rewrap_keeps_the_fingerprint() -> None:
    """The operator's rewrap under a new active key is the same data key: answers still count."""
    obj = waiting(sealed_run("ask"))
    rotated = Keyring(keys={**KEYRING.keys, "k2031": bytes(range(1, 33))}, active_key_id="k2031")
    obj["metadata"]["annotations"][DATA_KEY_ANNOTATION] = wrap_data_key(
        rotated, DATA_KEY, "team-a", "run-1", entropy=os.urandom
    )
    obj = deliver(
        obj, "answers", "confirm", seal_value(DATA_KEY, "yes", "answers/confirm", entropy=os.urandom)
    )
    obj, _, _ = drive(obj, at(1), settings=Settings(keyring=rotated))
    assert obj["status"]["state"] == "completed"
