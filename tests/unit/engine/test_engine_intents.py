"""The dispatcher's rule: only an intent its run's committed, verified checkpoint holds is sent."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from tests.unit.builders import (
    DONE,
    EFFECTS,
    PLANNER,
    UID,
    at,
    effect,
    expect,
    snap,
    waiting_on_action,
)

from durable_agents.api.v1alpha1 import ActionRecordSpec, ActionState
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import ActionObservation, RunSnapshot, Settings
from durable_agents.core.engine.actions import Refused, Unverified, intent_digest, intent_refusal
from durable_agents.core.ledger import action_record_name
from durable_agents.core.sealing import Keyring
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit

KEYRING = Keyring(keys={"k2030": bytes(range(32))}, active_key_id="k2030")
KEYED = replace(EFFECTS, keyring=KEYRING)


def intent() -> tuple[dict[str, Any], ActionRecordSpec]:
    """A run waiting on its effect's intent (every commit stamped), and that intent."""
    return waiting_on_action(KEYED, [effect("pay"), DONE])


def verdict(
    obj: dict[str, Any] | None,
    record: ActionRecordSpec,
    *,
    name: str | None = None,
    settings: Settings = KEYED,
) -> Refused | Unverified | None:
    run: RunSnapshot | None = snap(obj) if obj is not None else None
    name = name or action_record_name(record.idempotency_key)
    return intent_refusal(run, name, record, PLANNER, settings)


def refused(obj: dict[str, Any] | None, record: ActionRecordSpec, **kwargs: Any) -> str:
    answer = verdict(obj, record, **kwargs)
    assert isinstance(answer, Refused), answer
    return answer.message


def test_the_runs_own_intent_may_be_sent() -> None:
    obj, spec = intent()
    assert verdict(obj, spec) is None
    # As the API server hands the record back (target and arguments as plain JSON): the same.
    assert verdict(obj, ActionRecordSpec.model_validate(spec.wire())) is None


def test_a_record_whose_run_does_not_exist_is_refused() -> None:
    _, spec = intent()
    assert "its run 'run-1' does not exist" in refused(None, spec)


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"arguments": {"amount": 1000000}}, "differs from the intent"),
        ({"target": {"url": "https://attacker.example/api"}}, "differs from the intent"),
        ({"effect": "kubernetes.apply"}, "differs from the intent"),
        ({"service_account_name": "cluster-admin"}, "acts as ServiceAccount 'cluster-admin'"),
        ({"idempotency_key": f"{UID}/0/pay/attempt-7"}, "holds no pending action with key"),
    ],
    ids=["arguments", "target", "effect", "service-account", "key"],
)
def test_a_record_that_is_not_exactly_the_committed_intent_is_refused(
    change: dict[str, Any], complaint: str
) -> None:
    obj, spec = intent()
    forged = spec.model_copy(update=change)
    assert complaint in refused(obj, forged, name=action_record_name(spec.idempotency_key))


def test_the_digest_covers_effect_target_arguments_and_service_account() -> None:
    _, spec = intent()
    base = intent_digest(spec)
    for change in (
        {"effect": "x"},
        {"target": {"url": "y"}},
        {"arguments": {"step": "z"}},
        {"service_account_name": "other"},
    ):
        assert intent_digest(spec.model_copy(update=change)) != base, change
    # Bookkeeping that does not change what is asked for does not change the digest.
    assert intent_digest(spec.model_copy(update={"step_index": 9})) == base


def test_the_same_intent_under_another_record_name_is_refused() -> None:
    obj, spec = intent()
    assert "recorded as 'act-copy'" in refused(obj, spec, name="act-copy")


def test_an_intent_the_run_has_already_reconciled_is_refused() -> None:
    obj, spec = intent()
    name = action_record_name(spec.idempotency_key)
    outcome = {name: ActionObservation(ActionState.SUCCEEDED, {"status": 201})}
    obj, _ = expect(
        obj, at(2), RunEvent.EXTERNAL_RECEIVED, RunState.RESUME_VALIDATION, settings=KEYED, actions=outcome
    )
    assert "holds no pending action" in refused(obj, spec)


def test_a_forged_checkpoint_holds_no_intent_it_can_vouch_for() -> None:
    """Someone who can write the run's status adds an intent to its checkpoint, and creates the
    matching record: the checkpoint does not verify, so nothing is sent (and nothing failed: the
    run is quarantined and a person looks at it)."""
    obj, spec = intent()
    forged = copy.deepcopy(obj)
    cp = forged["status"]["checkpoint"]
    other = spec.model_copy(update={"idempotency_key": f"{UID}/0/pay/attempt-1"})
    cp["pendingActions"].append(
        {
            **cp["pendingActions"][0],
            "idempotencyKey": other.idempotency_key,
            "actionRecordName": action_record_name(other.idempotency_key),
        }
    )
    answer = verdict(forged, other)
    assert isinstance(answer, Unverified), answer
    assert answer.problem.reason == "IntegrityFailed"
    # Without keys (pure tests only) the stamp cannot be checked: the plan still says no.
    assert isinstance(verdict(forged, other, settings=EFFECTS), Refused)


def test_a_legacy_checkpoint_holding_the_intent_is_adopted() -> None:
    obj, spec = intent()
    legacy = copy.deepcopy(obj)
    del legacy["status"]["checkpoint"]["integrity"]
    legacy["status"]["checkpoint"]["schemaVersion"] = 2
    assert verdict(legacy, spec) is None


def test_without_a_planner_for_the_run_nothing_is_sent() -> None:
    obj, spec = intent()
    answer = intent_refusal(snap(obj), action_record_name(spec.idempotency_key), spec, None, KEYED)
    assert isinstance(answer, Refused)
    assert "does not intend" in answer.message
