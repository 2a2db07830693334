"""The run as the engine reads it: what the API types refuse, and the run ID that survives a restore."""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError
from tests.unit.builders import DONE, EFFECTS, T0, UID, ask, at, effect, expect, new_run

from durable_agents.api import crdgen
from durable_agents.api.v1alpha1 import AgentRunSpec
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import RunSnapshot
from durable_agents.core.ledger import idempotency_key
from durable_agents.core.statemachine import RunEvent

pytestmark = pytest.mark.unit


# --- input the engine must never see: refused by the API types (and so by the CRD schema) --------


def test_an_empty_question_is_refused_by_the_api_types() -> None:
    with pytest.raises(ValidationError, match="question"):
        RunSnapshot.from_object(new_run(steps=[{"name": "confirm", "ask": {"question": ""}}]))


def test_an_empty_agent_identifier_is_refused_by_the_api_types() -> None:
    with pytest.raises(ValidationError, match="model"):
        RunSnapshot.from_object(new_run(agent={"model": ""}))


def test_duplicate_step_names_are_refused_by_the_crd() -> None:
    steps = crdgen.openapi_schema(AgentRunSpec)["properties"]["steps"]
    rules = [r["rule"] for r in steps["x-kubernetes-validations"]]
    assert "self.all(s, self.exists_one(t, t.name == s.name))" in rules


# --- restore from a backup: the run keeps its identity -------------------------------------------


def test_the_first_commit_records_the_run_id_and_every_commit_keeps_it() -> None:
    obj, accepted = expect(
        new_run(steps=[effect("pay"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY, settings=EFFECTS
    )
    assert accepted.status.run_id == UID
    obj, intent = expect(obj, at(1), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL, settings=EFFECTS)
    assert intent.status.run_id == UID


def test_a_run_restored_from_a_backup_keeps_its_idempotency_keys() -> None:
    """A restore re-creates the AgentRun with its status, but the API server gives it a new uid.
    Keys derive from the recorded run ID, so the authoritative system recognises the effect the
    run applied after the backup was taken, instead of being asked to pay again under a new key."""
    original, _ = expect(
        new_run(steps=[ask("confirm"), effect("pay"), DONE]), T0, RunEvent.ACCEPTED, RunState.READY
    )
    original, _ = expect(original, at(1), RunEvent.INPUT_REQUESTED, RunState.WAITING_INPUT)
    backup = copy.deepcopy(original)
    original["spec"]["answers"] = {"confirm": "yes"}
    original, _ = expect(original, at(2), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION)
    original, _ = expect(original, at(3), RunEvent.REVALIDATED, RunState.READY)
    original, paid = expect(
        original, at(4), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL, settings=EFFECTS
    )
    (before_disaster,) = paid.intents

    restored = copy.deepcopy(backup)
    restored["metadata"]["uid"] = "3f0c2a4e-0000-4000-8000-restored0001"
    restored["spec"]["answers"] = {"confirm": "yes"}
    restored, _ = expect(restored, at(20), RunEvent.INPUT_RECEIVED, RunState.RESUME_VALIDATION)
    restored, _ = expect(restored, at(21), RunEvent.REVALIDATED, RunState.READY)
    restored, again = expect(
        restored, at(22), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL, settings=EFFECTS
    )
    (after_restore,) = again.intents
    assert after_restore.idempotency_key == before_disaster.idempotency_key == idempotency_key(UID, 1, "pay")
    assert again.status.run_id == UID
    assert after_restore.run_ref.uid == restored["metadata"]["uid"], "ownership follows the live object"
