"""Sealed values: a run's data key, values bound to their field, and the webhook's sealing rules."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import ActionRecordSpec
from durable_agents.core.sealed_values import (
    DATA_KEY_ANNOTATION,
    SEALED_KEY,
    ValueSealingError,
    data_key_id,
    is_sealed,
    new_data_key,
    open_data_key,
    reveal_spec,
    rewrap,
    seal_spec,
    seal_value,
    unseal_value,
    wrap_data_key,
)
from durable_agents.core.sealing import Keyring, UndecryptableError, generate_key
from durable_agents.core.sealing_admission import LAST_APPLIED, SealingRefused, sealing_changes
from durable_agents.shell.ledger.unsealing import CannotUnseal, action_of, data_key_of, sealed_outcome

SECRET = "the-launch-code-7781"


@pytest.fixture
def keyring() -> Keyring:
    return Keyring({"a": generate_key(entropy=os.urandom), "b": generate_key(entropy=os.urandom)}, "a")


def _spec() -> dict[str, Any]:
    return {
        "taskType": "t",
        "objective": "o",
        "steps": [
            {"name": "ask", "ask": {"question": f"what is {SECRET}?"}},
            {"name": "pay", "effect": {"effect": "http.post", "arguments": {"note": SECRET, "amount": 5}}},
            {
                "name": "kid",
                "child": {
                    "taskType": "c",
                    "objective": "o",
                    "steps": [{"name": "inner", "ask": {"question": SECRET}}],
                },
            },
        ],
    }


def _run(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": "r1"}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": spec}


def test_the_data_key_opens_only_for_its_run_and_with_its_wrapping_key(keyring: Keyring) -> None:
    key = new_data_key(entropy=os.urandom)
    annotation = wrap_data_key(keyring, key, "ns", "r1", entropy=os.urandom)
    assert data_key_id(annotation) == "a"
    assert open_data_key(keyring, annotation, "ns", "r1").key == key.key
    with pytest.raises(UndecryptableError):
        open_data_key(keyring, annotation, "ns", "r2")  # copied to another run
    with pytest.raises(UndecryptableError):
        open_data_key(Keyring({"b": keyring.keys["b"]}, "b"), annotation, "ns", "r1")  # key retired
    rotated = Keyring(dict(keyring.keys), "b")
    rewrapped = rewrap(rotated, annotation, "ns", "r1", entropy=os.urandom)
    assert rewrapped is not None
    assert data_key_id(rewrapped) == "b"
    assert open_data_key(Keyring({"b": keyring.keys["b"]}, "b"), rewrapped, "ns", "r1").key == key.key
    assert rewrap(rotated, rewrapped, "ns", "r1", entropy=os.urandom) is None  # already under the active key


def test_a_value_is_bound_to_its_field_and_its_run_tree() -> None:
    key = new_data_key(entropy=os.urandom)
    sealed = seal_value(key, {"note": SECRET}, "steps/pay/arguments", entropy=os.urandom)
    assert set(sealed) == {SEALED_KEY}
    assert SECRET not in json.dumps(sealed)
    assert unseal_value(key, sealed, "steps/pay/arguments") == {"note": SECRET}
    with pytest.raises(ValueSealingError):
        unseal_value(key, sealed, "steps/other/arguments")
    with pytest.raises(ValueSealingError):
        unseal_value(new_data_key(entropy=os.urandom), sealed, "steps/pay/arguments")
    assert unseal_value(key, "plain", "answers/x") == "plain"  # values in clear pass through
    with pytest.raises(ValueSealingError, match="at most 4096"):
        seal_value(key, "x" * 4097, "answers/x", entropy=os.urandom)


def test_seal_spec_seals_every_sensitive_value_and_is_stable_when_re_sent(keyring: Keyring) -> None:
    key = new_data_key(entropy=os.urandom)
    spec = {**_spec(), "answers": {"ask": "yes " + SECRET}, "events": {"go": SECRET}}
    sealed = seal_spec(spec, key, entropy=os.urandom)
    assert SECRET not in json.dumps(sealed)
    assert sealed["objective"] == "o"
    assert sealed["steps"][1]["effect"]["effect"] == "http.post"
    revealed = reveal_spec(sealed, key)
    assert revealed["steps/pay/arguments"] == {"note": SECRET, "amount": 5}
    assert revealed["steps/inner/question"] == SECRET
    assert revealed["answers/ask"] == "yes " + SECRET
    assert seal_spec(spec, key, sealed, entropy=os.urandom) == sealed  # a re-applied manifest changes nothing
    assert seal_spec(sealed, key, entropy=os.urandom) == sealed
    other = seal_spec(spec, new_data_key(entropy=os.urandom), entropy=os.urandom)
    with pytest.raises(ValueSealingError):  # another run's sealed value is refused
        seal_spec({**spec, "steps": other["steps"]}, key, entropy=os.urandom)


def test_the_webhook_gives_a_new_run_its_data_key_and_seals_it(keyring: Keyring) -> None:
    changes = sealing_changes("CREATE", _run(_spec()), None, keyring, entropy=os.urandom)
    annotation = changes.annotations[DATA_KEY_ANNOTATION]
    assert annotation is not None
    assert SECRET not in json.dumps(changes.spec)
    key = open_data_key(keyring, annotation, "ns", "r1")
    assert reveal_spec(changes.spec, key)["steps/ask/question"] == f"what is {SECRET}?"
    with pytest.raises(SealingRefused, match="name the run"):
        sealing_changes(
            "CREATE", {"metadata": {"namespace": "ns"}, "spec": _spec()}, None, keyring, entropy=os.urandom
        )


def test_a_child_keeps_the_data_key_the_operator_wrapped_for_it(keyring: Keyring) -> None:
    key = new_data_key(entropy=os.urandom)
    spec = seal_spec(_spec(), key, entropy=os.urandom)
    child = _run(spec, {DATA_KEY_ANNOTATION: wrap_data_key(keyring, key, "ns", "r1", entropy=os.urandom)})
    changes = sealing_changes("CREATE", child, None, keyring, entropy=os.urandom)
    assert changes.annotations == {}
    assert changes.spec == {}


def test_updates_seal_new_answers_and_keep_the_data_key_as_the_operator_wrote_it(keyring: Keyring) -> None:
    created = sealing_changes("CREATE", _run(_spec()), None, keyring, entropy=os.urandom)
    annotation = created.annotations[DATA_KEY_ANNOTATION]
    assert annotation is not None
    old = _run({**_spec(), **created.spec}, {DATA_KEY_ANNOTATION: annotation})
    # Re-sent plaintext steps (a re-apply) map back to what is stored; a new answer is sealed.
    new = _run({**_spec(), "answers": {"ask": SECRET}}, {DATA_KEY_ANNOTATION: "a:Zm9yZ2Vk"})
    changes = sealing_changes("UPDATE", new, old, keyring, entropy=os.urandom)
    assert changes.spec["steps"] == old["spec"]["steps"]
    assert is_sealed(changes.spec["answers"]["ask"])
    assert changes.annotations[DATA_KEY_ANNOTATION] == annotation  # a forged key is put back
    rotated = Keyring(dict(keyring.keys), "b")
    rewrapped = rewrap(rotated, annotation, "ns", "r1", entropy=os.urandom)
    assert rewrapped is not None
    moved = sealing_changes(
        "UPDATE", _run(old["spec"], {DATA_KEY_ANNOTATION: rewrapped}), old, rotated, entropy=os.urandom
    )
    assert DATA_KEY_ANNOTATION not in moved.annotations  # the operator's rewrap stays


def test_a_run_created_before_sealing_keeps_its_steps_and_gets_a_data_key(keyring: Keyring) -> None:
    old = _run(_spec())
    changes = sealing_changes(
        "UPDATE", _run({**_spec(), "answers": {"ask": SECRET}}), old, keyring, entropy=os.urandom
    )
    assert "steps" not in changes.spec  # immutable: left as they are
    assert changes.annotations[DATA_KEY_ANNOTATION] is not None
    assert is_sealed(changes.spec["answers"]["ask"])


def test_kubectl_apply_last_applied_configuration_keeps_no_plaintext(keyring: Keyring) -> None:
    body = _run(_spec(), {LAST_APPLIED: json.dumps({"metadata": {"name": "r1"}, "spec": _spec()})})
    changes = sealing_changes("CREATE", body, None, keyring, entropy=os.urandom)
    last = changes.annotations[LAST_APPLIED]
    assert last is not None
    assert SECRET not in last
    assert json.loads(last)["spec"]["steps"] == changes.spec["steps"]


def test_the_dispatcher_unseals_arguments_and_seals_the_response(keyring: Keyring) -> None:
    created = sealing_changes("CREATE", _run(_spec()), None, keyring, entropy=os.urandom)
    annotation = created.annotations[DATA_KEY_ANNOTATION]
    assert annotation is not None
    run = _run({**_spec(), **created.spec}, {DATA_KEY_ANNOTATION: annotation})
    sealed_args = run["spec"]["steps"][1]["effect"]["arguments"]
    record = ActionRecordSpec.model_validate(
        {
            "idempotencyKey": "k",
            "runRef": {"name": "r1", "uid": "u1"},
            "stepIndex": 1,
            "effect": "http.post",
            "tier": "consequential",
            "arguments": sealed_args,
        }
    )
    assert action_of(record, run, keyring).arguments == {"note": SECRET, "amount": 5}
    wrong_step = record.model_copy(update={"step_index": 0})
    with pytest.raises(CannotUnseal):
        action_of(wrong_step, run, keyring)
    with pytest.raises(CannotUnseal):
        action_of(record, _run(run["spec"]), keyring)  # sealed, and the run has no data key
    key = data_key_of(run, keyring)
    outcome = sealed_outcome({"receipt": SECRET}, key, "rec-1")
    assert outcome is not None
    assert SECRET not in json.dumps(outcome)
    assert key is not None
    assert unseal_value(key, outcome, "actions/rec-1/outcome") == {"receipt": SECRET}
    assert sealed_outcome({"receipt": 1}, None, "rec-1") == {"receipt": 1}


def test_secret_references_are_found_wherever_they_are_and_only_in_their_exact_shape() -> None:
    from durable_agents.shell.ledger.references import _replaced, dotted, find_references

    ref = {"valueFrom": {"secretKeyRef": {"name": "tok", "key": "k"}}}
    arguments = {
        "headers": {"auth": ref},
        "items": [1, ref],
        "lookalike": {"valueFrom": {"secretKeyRef": {"name": "tok", "key": "k"}}, "x": 1},
        "wrong": {"valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
    }
    found = list(find_references(arguments))
    assert [(dotted(path), name, key) for path, name, key in found] == [
        ("headers.auth", "tok", "k"),
        ("items.1", "tok", "k"),
    ]
    replaced = _replaced(arguments, found[1][0], "VALUE")
    assert replaced["items"] == [1, "VALUE"]
    assert arguments["items"][1] == ref  # the record's arguments are never changed in place


def test_a_keyed_digest_compares_within_a_run_tree_only() -> None:
    from durable_agents.core.sealed_values import keyed_digest

    key = new_data_key(entropy=os.urandom)
    assert keyed_digest(key, "references/a", SECRET) == keyed_digest(key, "references/a", SECRET)
    assert keyed_digest(key, "references/a", SECRET) != keyed_digest(
        new_data_key(entropy=os.urandom), "references/a", SECRET
    )
    assert SECRET not in keyed_digest(key, "references/a", SECRET)


def test_a_value_stored_already_is_left_as_it_is_and_blocks_nothing(keyring: Keyring) -> None:
    """An answer written with the webhook off (in clear, or with a seal copied from another field)
    is neither sealed into validity nor a reason to refuse the next request through the webhook."""
    created = sealing_changes("CREATE", _run(_spec()), None, keyring, entropy=os.urandom)
    annotation = created.annotations[DATA_KEY_ANNOTATION]
    assert annotation is not None
    copied = created.spec["steps"][0]["ask"]["question"]  # sealed for steps/ask/question
    forged = {**_spec(), **created.spec, "answers": {"ask": "by hand", "ask.2": copied}}
    old = _run(forged, {DATA_KEY_ANNOTATION: annotation})
    new = _run(
        {**forged, "answers": {**forged["answers"], "ask.3": "the real one"}},
        {DATA_KEY_ANNOTATION: annotation},
    )
    changes = sealing_changes("UPDATE", new, old, keyring, entropy=os.urandom)
    answers = changes.spec["answers"]
    assert (answers["ask"], answers["ask.2"]) == ("by hand", copied), "left exactly as stored"
    key = open_data_key(keyring, annotation, "ns", "r1")
    assert unseal_value(key, answers["ask.3"], "answers/ask.3") == "the real one"


def test_a_run_whose_data_key_annotation_is_gone_gets_no_new_key(keyring: Keyring) -> None:
    """The checkpoint holds the fingerprint of the run's key: a new key would not be the run's.
    Nothing new is sealed; a request that brings a value to seal is refused, naming the repair;
    one that brings none (a cancellation) passes."""
    created = sealing_changes("CREATE", _run(_spec()), None, keyring, entropy=os.urandom)
    old = _run({**_spec(), **created.spec})  # the annotation removed
    old["status"] = {"checkpoint": {"dataKeyDigest": "hmac-sha256:" + "0" * 64}}
    with pytest.raises(SealingRefused, match="annotation is gone"):
        sealing_changes(
            "UPDATE", _run({**old["spec"], "answers": {"ask": "yes"}}), old, keyring, entropy=os.urandom
        )
    cancel = {**old["spec"], "cancellations": {"c1": {"scope": "task"}}}
    changes = sealing_changes("UPDATE", _run(cancel), old, keyring, entropy=os.urandom)
    assert (changes.spec, changes.annotations) == ({}, {})
