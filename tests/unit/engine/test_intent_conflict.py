"""A ledger record under an intent's key that asks for something else is not that intent's outcome.

The key is run, step and attempt: a run whose status was restored from before a call (its model
then proposing other arguments at the same step) meets the record of the call made the first time.
"""

from __future__ import annotations

import pytest

from durable_agents.api.v1alpha1 import ActionRecordSpec, ActionState, RunReference
from durable_agents.core.engine.actions import INTENT_CONFLICT, conflicting_record

pytestmark = pytest.mark.unit


def intent(**arguments: object) -> ActionRecordSpec:
    return ActionRecordSpec(
        idempotency_key="run-1/2/agent-2",
        run_ref=RunReference(name="refund", uid="u-1"),
        service_account_name="default",
        step_index=2,
        effect="http.post",
        tier="consequential",
        target={"url": "http://127.0.0.1:9/refunds"},
        arguments=dict(arguments),
    )


def test_the_record_of_this_very_intent_is_its_outcome() -> None:
    record = {"spec": intent(amount=120).wire(), "status": {"state": "succeeded"}}
    assert conflicting_record(record, intent(amount=120)) is None


def test_a_record_of_other_arguments_under_the_same_key_is_a_failed_action_not_a_success() -> None:
    record = {"spec": intent(amount=120).wire(), "status": {"state": "succeeded"}}
    seen = conflicting_record(record, intent(amount=100))
    assert seen is not None
    assert (seen.state, seen.reason) == (ActionState.FAILED, INTENT_CONFLICT)
    assert "run-1/2/agent-2" in (seen.message or "")


def test_a_record_whose_spec_does_not_parse_is_not_taken_for_the_intent() -> None:
    seen = conflicting_record({"spec": {"effect": 7}}, intent(amount=100))
    assert seen is not None
    assert seen.reason == INTENT_CONFLICT
