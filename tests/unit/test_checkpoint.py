"""The checkpoint contract: round trips, camelCase JSON, migration chains, quarantine, recorded fixtures."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from durable_agents.core.checkpoint import (
    CURRENT_SCHEMA_VERSION,
    MIGRATIONS,
    ApprovalRecord,
    Checkpoint,
    ExternalEvidenceRef,
    Fencing,
    KubernetesEvidenceRef,
    Loaded,
    PendingAction,
    PendingExternal,
    PendingInput,
    PolicyRef,
    Position,
    Quarantine,
    RetryState,
    RuntimeConfig,
    Timestamps,
    ToolCallRecord,
    dump_checkpoint,
    integrity_payload,
    load_checkpoint,
    migrate_v1_to_v2,
    migrate_v2_to_v3,
    seal_field,
    stamp_checkpoint,
    unseal_field,
    verify_integrity,
    verify_sealed,
)
from durable_agents.core.sealing import Keyring, SealedField, UndecryptableError
from durable_agents.core.stamps import Purpose, stamp

pytestmark = pytest.mark.unit

_M = TypeVar("_M", bound=BaseModel)

FIXTURES = Path(__file__).parent / "fixtures" / "checkpoints"
# The recorded fixtures' sealed values were sealed with this key, bound to this run UID.
RECORDED_KEYRING = Keyring(keys={"sealing-2025-01": bytes(range(32))}, active_key_id="sealing-2025-01")
RECORDED_RUN_UID = "9d2a7c4e-1f3b-4e8a-b6d5-0c7e9f2a1b34"

T0 = datetime(2025, 3, 4, 9, 0, tzinfo=UTC)


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _checkpoint() -> Checkpoint:
    """A run waiting for approval of a consequential action, with evidence behind it."""
    return Checkpoint(
        position=Position(state="waiting_approval", step=3, state_version=7),
        fencing=Fencing(holder="operator-0/worker-1", lease_transitions=2),
        input_refs=[
            KubernetesEvidenceRef(
                id="in-1",
                step_index=0,
                recorded_at=T0,
                api_version="v1",
                kind="ConfigMap",
                namespace="team-a",
                name="objective",
                uid="0b8f6a44-5a3e-4c55-9d0e-2f1c6f1d9a10",
                resource_version="1001",
                content_digest=_digest("objective"),
            )
        ],
        evidence=[
            ExternalEvidenceRef(
                id="ev-1", step_index=1, recorded_at=T0 + timedelta(seconds=5), uri="https://tickets/INC-1"
            )
        ],
        tool_calls=[
            ToolCallRecord(
                id="tc-1",
                tool="tickets.lookup",
                step_index=1,
                started_at=T0 + timedelta(seconds=4),
                finished_at=T0 + timedelta(seconds=5),
                outcome="succeeded",
                result_ref="ev-1",
            )
        ],
        pending_actions=[
            PendingAction(
                idempotency_key="run-1/step-3/refund",
                action_record_name="run-1-step-3-a1b2c3",
                effect="http",
                tier="consequential",
                step_index=3,
                approval_request_id="apr-1",
            )
        ],
        approvals=[
            ApprovalRecord(
                request_id="apr-1",
                digest=_digest("refund 125 EUR"),
                expires_at=T0 + timedelta(days=1),
                policy_version="7",
            )
        ],
        policy=PolicyRef(name="refunds", version="7"),
        runtime_config=RuntimeConfig(model="model-2025-01", prompt="refunds@v3", tool_set="payments@v1"),
        trace_link="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        retry=RetryState(attempts=1),
        timestamps=Timestamps(
            created_at=T0, updated_at=T0 + timedelta(seconds=9), entered_state_at=T0 + timedelta(seconds=9)
        ),
    )


def _raw() -> dict[str, Any]:
    return dump_checkpoint(_checkpoint())


def _raw_v1() -> dict[str, Any]:
    """The same checkpoint as schema version 1 stored it (``attempt`` was a top-level count)."""
    raw = _raw()
    attempts = raw.pop("retry")["attempts"]
    for field in ("children", "cancellations"):
        assert not raw.pop(field, [])
    raw["runtimeConfig"].pop("operator", None)
    return {**raw, "schemaVersion": 1, "attempt": attempts}


def _loaded(result: Loaded | Quarantine) -> Loaded:
    assert isinstance(result, Loaded), result
    return result


def _quarantined(result: Loaded | Quarantine, reason: str) -> Quarantine:
    assert isinstance(result, Quarantine), result
    assert result.reason == reason, result
    return result


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {key for item in value.values() for key in _keys(item)}
    if isinstance(value, list):
        return {key for item in value for key in _keys(item)}
    return set()


# --- round trip and JSON shape ---------------------------------------------------------------


def test_model_to_dict_to_json_and_back_is_equal() -> None:
    checkpoint = _checkpoint()
    raw = json.loads(json.dumps(dump_checkpoint(checkpoint)))
    loaded = _loaded(load_checkpoint(raw))
    assert loaded.checkpoint == checkpoint
    assert loaded.migrated_from is None
    assert dump_checkpoint(loaded.checkpoint) == raw


def test_dump_is_camel_case_and_omits_none() -> None:
    raw = _raw()
    keys = _keys(raw)
    assert {
        "schemaVersion",
        "stateVersion",
        "leaseTransitions",
        "inputRefs",
        "apiVersion",
        "resourceVersion",
        "contentDigest",
        "toolCalls",
        "resultRef",
        "pendingActions",
        "idempotencyKey",
        "actionRecordName",
        "approvalRequestId",
        "expiresAt",
        "policyVersion",
        "runtimeConfig",
        "toolSet",
        "traceLink",
        "enteredStateAt",
    } <= keys
    assert not [key for key in keys if "_" in key]
    assert "decision" not in raw["approvals"][0]  # None is omitted, not stored as null
    assert "pendingInput" not in raw
    assert raw["schemaVersion"] == CURRENT_SCHEMA_VERSION == 3
    assert raw["timestamps"]["createdAt"] == "2025-03-04T09:00:00Z"


def test_snake_case_input_is_accepted_too() -> None:
    raw = _raw()
    raw["position"] = {"state": "ready", "step": 3, "state_version": 8}
    assert _loaded(load_checkpoint(raw)).checkpoint.position.state_version == 8


def test_timestamps_are_normalised_to_utc() -> None:
    raw = _raw()
    raw["timestamps"]["createdAt"] = "2025-03-04T11:00:00+02:00"
    created = _loaded(load_checkpoint(raw)).checkpoint.timestamps.created_at
    assert created == T0
    assert created.utcoffset() == timedelta(0)


# --- quarantine ------------------------------------------------------------------------------


@pytest.mark.parametrize("instant", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"])
def test_an_instant_outside_the_utc_range_is_invalid_not_a_crash(instant: str) -> None:
    raw = _raw()
    raw["timestamps"]["createdAt"] = instant
    assert "timestamps.createdAt" in _quarantined(load_checkpoint(raw), "InvalidCheckpoint").message


def test_no_checkpoint_is_quarantined_as_missing() -> None:
    _quarantined(load_checkpoint(None), "MissingCheckpoint")


def test_newer_unknown_schema_version_is_quarantined_and_not_rewritten() -> None:
    raw = _raw()
    raw["schemaVersion"] = CURRENT_SCHEMA_VERSION + 1
    raw["somethingFromTheFuture"] = {"nested": [1, 2, {"deep": True}]}
    before = copy.deepcopy(raw)
    quarantine = _quarantined(load_checkpoint(raw), "UnknownSchemaVersion")
    assert str(CURRENT_SCHEMA_VERSION + 1) in quarantine.message
    assert raw == before


@pytest.mark.parametrize("version", [None, "1", 1.0, True, [1]], ids=repr)
def test_non_integer_schema_version_is_quarantined(version: object) -> None:
    raw = _raw()
    raw["schemaVersion"] = version
    quarantine = _quarantined(load_checkpoint(raw), "InvalidCheckpoint")
    assert "schemaVersion" in quarantine.message


def test_missing_schema_version_is_quarantined() -> None:
    raw = _raw()
    del raw["schemaVersion"]
    quarantine = _quarantined(load_checkpoint(raw), "InvalidCheckpoint")
    assert "schemaVersion" in quarantine.message


def test_schema_version_older_than_any_migration_is_unknown() -> None:
    raw = _raw()
    raw["schemaVersion"] = 0
    _quarantined(load_checkpoint(raw), "UnknownSchemaVersion")


def test_non_json_content_is_quarantined() -> None:
    raw = _raw()
    raw["position"] = {"state": "ready", "step": {1, 2}, "stateVersion": 1}
    _quarantined(load_checkpoint(raw), "InvalidCheckpoint")


def _set(path: str, value: Any) -> Any:
    def mutate(raw: dict[str, Any]) -> None:
        *parents, last = re.findall(r"[A-Za-z]+|\d+", path)
        target: Any = raw
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "named"),
    [
        (_set("position.stateVersion", -1), "position.stateVersion"),
        (_set("position.stateVersion", 2**53), "position.stateVersion"),  # beyond what JSON carries exactly
        (_set("position.step", "next"), "position.step"),
        (_set("approvals[0].digest", "sha256:abc"), "approvals[0].digest"),
        (_set("inputRefs[0].contentDigest", "md5:" + "0" * 32), "inputRefs[0].kubernetes.contentDigest"),
        (_set("inputRefs[0].source", "ftp"), "inputRefs[0]"),
        (_set("pendingActions[0].tier", "dangerous"), "pendingActions[0].tier"),
        (_set("toolCalls[0].outcome", "maybe"), "toolCalls[0].outcome"),
        (_set("timestamps.createdAt", "2025-03-04T09:00:00"), "timestamps.createdAt"),
        (_set("traceLink", "not-a-traceparent"), "traceLink"),
        (_set("transcript", ["a whole conversation"]), "transcript"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_invalid_field_is_quarantined_naming_the_field(mutate: Any, named: str) -> None:
    raw = _raw()
    mutate(raw)
    before = copy.deepcopy(raw)
    quarantine = _quarantined(load_checkpoint(raw), "InvalidCheckpoint")
    assert named in quarantine.message
    assert raw == before


@pytest.mark.parametrize(
    ("mutate", "complaint"),
    [
        (_set("toolCalls[0].resultRef", "nowhere"), "unknown evidence reference 'nowhere'"),
        (_set("pendingActions[0].approvalRequestId", "apr-9"), "unknown approval request 'apr-9'"),
        (_set("evidence[0].id", "in-1"), "duplicate evidence reference id 'in-1'"),
        (_set("approvals[0].decision", "approved"), "set together"),
    ],
)
def test_inconsistent_checkpoint_is_quarantined(mutate: Any, complaint: str) -> None:
    raw = _raw()
    mutate(raw)
    assert complaint in _quarantined(load_checkpoint(raw), "InvalidCheckpoint").message


def test_a_run_waits_on_input_or_an_external_event_not_both() -> None:
    raw = _raw()
    raw["pendingInput"] = {"requestId": "q-1", "question": "Proceed?", "expiresAt": "2025-03-05T00:00:00Z"}
    _loaded(load_checkpoint(raw))
    raw["pendingExternal"] = {"requestId": "e-1", "event": "done", "expiresAt": "2025-03-05T00:00:00Z"}
    assert "not both" in _quarantined(load_checkpoint(raw), "InvalidCheckpoint").message


def test_duplicate_idempotency_keys_are_refused() -> None:
    raw = _raw()
    raw["pendingActions"].append({**raw["pendingActions"][0], "actionRecordName": "other"})
    message = _quarantined(load_checkpoint(raw), "InvalidCheckpoint").message
    assert "duplicate pending action idempotencyKey" in message


# --- migrations ------------------------------------------------------------------------------


def test_the_registry_migrates_every_older_version() -> None:
    assert CURRENT_SCHEMA_VERSION == 3
    assert set(MIGRATIONS) == set(range(1, CURRENT_SCHEMA_VERSION))


def test_version_one_migrates_attempt_into_retry() -> None:
    raw = _raw_v1()
    before = copy.deepcopy(raw)
    loaded = _loaded(load_checkpoint(raw))
    assert loaded.migrated_from == 1
    assert loaded.checkpoint.retry == RetryState(attempts=1)
    assert loaded.checkpoint == _checkpoint()  # nothing else changed meaning
    assert raw == before


@pytest.mark.parametrize("attempt", [-1, "1", True, None])
def test_version_one_with_a_bad_attempt_fails_migration(attempt: object) -> None:
    raw = {**_raw_v1(), "attempt": attempt}
    quarantine = _quarantined(load_checkpoint(raw), "MigrationFailed")
    assert "attempt" in quarantine.message


def test_version_two_fields_in_a_version_one_checkpoint_are_invalid() -> None:
    # A v1 document cannot smuggle v2 fields past the migration: the result must validate.
    raw = {**_raw_v1(), "retry": {"attempts": 5}}
    assert migrate_v1_to_v2(raw)["retry"] == {"attempts": 1}  # attempt wins, as v1 defined it
    raw = {**_raw_v1(), "bogus": 1}
    _quarantined(load_checkpoint(raw), "InvalidCheckpoint")


def test_migration_chain_runs_in_order() -> None:
    calls: list[int] = []

    def one_to_two(doc: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        attempt = doc.pop("attempt")  # pops from its argument: must be a copy
        return {**doc, "schemaVersion": 2, "retry": {"attempts": attempt * 10}}

    def two_to_three(doc: dict[str, Any]) -> dict[str, Any]:
        calls.append(2)
        return {**doc, "schemaVersion": 3, "retry": {"attempts": doc["retry"]["attempts"] + 1}}

    raw = _raw_v1()
    before = copy.deepcopy(raw)
    result = load_checkpoint(raw, migrations={2: two_to_three, 1: one_to_two}, current=3, model=Checkpoint)
    loaded = _loaded(result)
    assert calls == [1, 2]
    assert loaded.migrated_from == 1
    assert isinstance(loaded.checkpoint, Checkpoint)
    assert loaded.checkpoint.retry.attempts == 1 * 10 + 1  # in the opposite order: (1 + 1) * 10
    assert raw == before  # one_to_two popped from its argument: a copy, never the stored mapping


def test_a_checkpoint_already_at_a_middle_version_runs_only_the_rest() -> None:
    calls: list[int] = []

    def step(version: int) -> Any:
        def migrate(doc: dict[str, Any]) -> dict[str, Any]:
            calls.append(version)
            return {**doc, "schemaVersion": version + 1}

        return migrate

    raw = {**_raw(), "schemaVersion": 2}
    loaded = _loaded(load_checkpoint(raw, migrations={1: step(1), 2: step(2)}, current=3, model=Checkpoint))
    assert calls == [2]
    assert loaded.migrated_from == 2


def test_a_raising_migration_is_quarantined_and_leaves_the_input_alone() -> None:
    def broken(doc: dict[str, Any]) -> dict[str, Any]:
        doc["position"]["state"] = "half-migrated"
        raise KeyError("toolCallz")

    raw = _raw_v1()
    before = copy.deepcopy(raw)
    quarantine = _quarantined(
        load_checkpoint(raw, migrations={1: broken}, current=2, model=Checkpoint), "MigrationFailed"
    )
    assert "from schemaVersion 1" in quarantine.message
    assert "KeyError" in quarantine.message
    assert raw == before


@pytest.mark.parametrize("output", [{"schemaVersion": 3}, {"schemaVersion": 1}, None, ["not", "a", "dict"]])
def test_a_migration_that_produces_the_wrong_version_is_quarantined(output: Any) -> None:
    quarantine = load_checkpoint(_raw_v1(), migrations={1: lambda _doc: output}, current=2, model=Checkpoint)
    _quarantined(quarantine, "MigrationFailed")


def test_a_gap_in_the_chain_is_an_unknown_version() -> None:
    quarantine = load_checkpoint(
        _raw_v1(), migrations={2: lambda doc: {**doc, "schemaVersion": 3}}, current=3, model=Checkpoint
    )
    assert "no migration from schemaVersion 1" in _quarantined(quarantine, "UnknownSchemaVersion").message


def test_a_migrated_checkpoint_that_does_not_validate_is_invalid() -> None:
    quarantine = load_checkpoint(
        _raw_v1(), migrations={1: lambda doc: {**doc, "schemaVersion": 2}}, current=2, model=Checkpoint
    )
    assert "attempt" in _quarantined(quarantine, "InvalidCheckpoint").message  # v1's field, not migrated


# --- sealed fields ---------------------------------------------------------------------------


def test_sealed_field_survives_the_round_trip_and_unseals() -> None:
    keyring = Keyring(keys={"k1": b"\x01" * 32}, active_key_id="k1")
    checkpoint = seal_field(
        _checkpoint(),
        "actionArguments",
        b'{"amount": 125}',
        keyring=keyring,
        run_uid="u1",
        entropy=os.urandom,
    )
    raw = json.loads(json.dumps(dump_checkpoint(checkpoint)))
    assert b"amount" not in json.dumps(raw).encode()
    loaded = _loaded(load_checkpoint(raw)).checkpoint
    assert unseal_field(loaded, "actionArguments", keyring=keyring, run_uid="u1") == b'{"amount": 125}'
    assert verify_sealed(loaded, keyring=keyring, run_uid="u1") is None


def test_an_undecryptable_sealed_field_quarantines() -> None:
    old = Keyring(keys={"k1": b"\x01" * 32}, active_key_id="k1")
    new = Keyring(keys={"k2": b"\x02" * 32}, active_key_id="k2")
    checkpoint = seal_field(
        _checkpoint(), "question", b"secret", keyring=old, run_uid="u1", entropy=os.urandom
    )
    quarantine = verify_sealed(checkpoint, keyring=new, run_uid="u1")
    assert quarantine is not None
    assert quarantine.reason == "Undecryptable"
    assert "'question'" in quarantine.message
    moved = verify_sealed(checkpoint, keyring=old, run_uid="another-run")
    assert moved is not None
    assert moved.reason == "Undecryptable"
    with pytest.raises(UndecryptableError):
        unseal_field(checkpoint, "question", keyring=new, run_uid="u1")


def test_a_sealed_field_name_must_be_acceptable() -> None:
    keyring = Keyring(keys={"k1": b"\x01" * 32}, active_key_id="k1")
    with pytest.raises(ValueError, match="sealed"):
        seal_field(_checkpoint(), "not a name", b"x", keyring=keyring, run_uid="u1", entropy=os.urandom)


# --- recorded checkpoints of every version ---------------------------------------------------

_FIXTURE_FILES = sorted(FIXTURES.glob("v*.json"))


def test_every_schema_version_has_recorded_checkpoints() -> None:
    versions = {int(re.match(r"v(\d+)-", path.name).group(1)) for path in _FIXTURE_FILES}  # type: ignore[union-attr]
    assert versions == set(range(1, CURRENT_SCHEMA_VERSION + 1))


@pytest.mark.parametrize("path", _FIXTURE_FILES, ids=lambda path: path.name)
def test_recorded_checkpoint_loads(path: Path) -> None:
    raw = json.loads(path.read_text())
    version = int(path.name.split("-")[0].removeprefix("v"))
    assert raw["schemaVersion"] == version, "a fixture's file name states its schema version"
    before = copy.deepcopy(raw)

    loaded = _loaded(load_checkpoint(raw))

    assert raw == before
    if version == CURRENT_SCHEMA_VERSION:
        assert loaded.migrated_from is None
        assert dump_checkpoint(loaded.checkpoint) == raw  # the recorded form is exactly the stored form
    else:
        assert loaded.migrated_from == version
    assert verify_sealed(loaded.checkpoint, keyring=RECORDED_KEYRING, run_uid=RECORDED_RUN_UID) is None
    if version >= 3:  # stamped since version 3: the recorded stamp verifies as recorded
        assert verify_integrity(raw, keyring=RECORDED_KEYRING, run_id=RECORDED_RUN_UID) is None
    else:
        assert loaded.checkpoint.integrity is None


@pytest.mark.parametrize("name", ["waiting-approval", "waiting-external-approved", "waiting-input"])
def test_a_recorded_version_two_checkpoint_migrates_to_three_unstamped(name: str) -> None:
    v2 = json.loads((FIXTURES / f"v2-{name}.json").read_text())
    v3 = json.loads((FIXTURES / f"v3-{name}.json").read_text())
    loaded = _loaded(load_checkpoint(v2))
    assert loaded.migrated_from == 2
    assert loaded.checkpoint.integrity is None, "a version-2 operator never stamped"
    # The same fields: stamped (as the operator does at its next commit), it is the v3 recording.
    restamped = stamp_checkpoint(loaded.checkpoint, keyring=RECORDED_KEYRING, run_id=RECORDED_RUN_UID)
    assert dump_checkpoint(restamped) == v3
    assert migrate_v2_to_v3(v2) == {**v2, "schemaVersion": 3}


def test_a_version_two_checkpoint_that_claims_a_stamp_fails_migration() -> None:
    v3 = json.loads((FIXTURES / "v3-waiting-input.json").read_text())
    forged = {**v3, "schemaVersion": 2}
    quarantine = _quarantined(load_checkpoint(forged), "MigrationFailed")
    assert "carries no integrity stamp" in quarantine.message


# --- integrity: the stamp covers every decisive field ----------------------------------------

_STAMPED = json.loads((FIXTURES / "v3-waiting-external-approved.json").read_text())


def _changed(path: str, value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(_STAMPED)
    _set(path, value)(raw)
    return raw


def _without(path: str) -> dict[str, Any]:
    raw = copy.deepcopy(_STAMPED)
    *parents, last = re.findall(r"[A-Za-z]+|\d+", path)
    target: Any = raw
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    del target[int(last) if last.isdigit() else last]
    return raw


_CANCELLATION = {
    "requestId": "c9",
    "scope": "toolCall",
    "stepIndex": 5,
    "handledAt": "2025-03-04T13:50:00Z",
    "effective": True,
}

_DECISIVE = {
    "schema version": _changed("schemaVersion", 4),
    "state": _changed("position.state", "resume_validation"),
    "step": _changed("position.step", 6),
    "state version": _changed("position.stateVersion", 15),
    "pending intent's key": _changed("pendingActions[0].idempotencyKey", "other/4/scale"),
    "pending intent's record": _changed("pendingActions[0].actionRecordName", "act-0000"),
    "pending intent's effect": _changed("pendingActions[0].effect", "http.post"),
    "pending intent's tier": _changed("pendingActions[0].tier", "read-only"),
    "pending intent's approval": _without("pendingActions[0].approvalRequestId"),
    "a pending intent added": _changed(
        "pendingActions",
        [*_STAMPED["pendingActions"], {**_STAMPED["pendingActions"][0], "idempotencyKey": "k2"}],
    ),
    "no pending intent": _changed("pendingActions", []),
    "approval request digest": _changed("approvals[0].digest", "sha256:" + "1" * 64),
    "approval request expiry": _changed("approvals[0].expiresAt", "2099-01-01T00:00:00Z"),
    "recorded decision": _changed("approvals[0].decision", "rejected"),
    "recorded approver": _changed("approvals[0].decidedBy", "mallory"),
    "a pending request approved": _changed(
        "approvals",
        [
            *_STAMPED["approvals"],
            {
                "requestId": "apr-2",
                "digest": "sha256:" + "2" * 64,
                "expiresAt": "2099-01-01T00:00:00Z",
                "policyVersion": "2025.02.3",
                "decision": "approved",
                "decidedBy": "mallory",
                "decidedAt": "2025-03-04T13:47:09Z",
            },
        ],
    ),
    "tool call outcome": _changed("toolCalls[2].outcome", "succeeded"),
    "a tool call removed": _changed("toolCalls", _STAMPED["toolCalls"][:-1]),
    "evidence": _changed("evidence[0].resourceVersion", "1"),
    "input reference": _changed("inputRefs[0].contentDigest", "sha256:" + "3" * 64),
    "output reference": _changed("outputRefs", []),
    "awaited event": _changed("pendingExternal.event", "something-else"),
    "wait expiry": _changed("pendingExternal.expiresAt", "2099-01-01T00:00:00Z"),
    "awaited input instead": _changed(
        "pendingInput", {"requestId": "q", "question": "?", "expiresAt": "2099-01-01T00:00:00Z"}
    ),
    "retry attempts": _changed("retry.attempts", 0),
    "retry window": _changed("retry.retryAt", "2025-03-04T13:48:00Z"),
    "child outcome": _changed("children[0].outcome", "failed"),
    "handled cancellation": _changed("cancellations", [_CANCELLATION]),
    "policy version": _changed("policy.version", "2025.03.1"),
    "operator version": _changed("runtimeConfig.operator", "9.9.9"),
    "model": _changed("runtimeConfig.model", "another-model"),
    "sealed value": _changed("sealed.actionArguments.nonce", "AAAAAAAAAAAAAAAA"),
    "an unknown field": _changed("transcript", ["smuggled"]),
}


def test_the_unchanged_recording_verifies() -> None:
    assert verify_integrity(_STAMPED, keyring=RECORDED_KEYRING, run_id=RECORDED_RUN_UID) is None


@pytest.mark.parametrize("raw", list(_DECISIVE.values()), ids=list(_DECISIVE))
def test_changing_any_decisive_field_fails_verification(raw: dict[str, Any]) -> None:
    assert raw != _STAMPED
    before = copy.deepcopy(raw)
    quarantine = verify_integrity(raw, keyring=RECORDED_KEYRING, run_id=RECORDED_RUN_UID)
    assert quarantine is not None
    assert quarantine.reason == "IntegrityFailed"
    assert "does not verify" in quarantine.message
    assert raw == before


def test_the_stamp_is_bound_to_the_run_id() -> None:
    quarantine = verify_integrity(_STAMPED, keyring=RECORDED_KEYRING, run_id="another-run")
    assert quarantine is not None
    assert "another-run" in quarantine.message


@pytest.mark.parametrize(
    "raw",
    [
        _changed("fencing", {"holder": "someone-else", "leaseTransitions": 99}),
        _without("fencing"),
        _changed("timestamps.updatedAt", "2030-01-01T00:00:00Z"),
        _without("traceLink"),
    ],
    ids=["fencing", "no fencing", "timestamps", "trace link"],
)
def test_fields_that_decide_nothing_are_not_stamped(raw: dict[str, Any]) -> None:
    # The fencing epoch is rewritten by a takeover without a transition (checked against the Lease).
    assert verify_integrity(raw, keyring=RECORDED_KEYRING, run_id=RECORDED_RUN_UID) is None


def test_an_unstamped_current_checkpoint_fails() -> None:
    quarantine = verify_integrity(_without("integrity"), keyring=RECORDED_KEYRING, run_id=RECORDED_RUN_UID)
    assert quarantine is not None
    assert "carries no integrity stamp" in quarantine.message


def test_a_stamp_by_a_key_this_operator_lacks_names_the_key() -> None:
    other = Keyring(keys={"k2030": b"\x07" * 32}, active_key_id="k2030")
    quarantine = verify_integrity(_STAMPED, keyring=other, run_id=RECORDED_RUN_UID)
    assert quarantine is not None
    assert "'sealing-2025-01'" in quarantine.message
    assert "put the key back" in quarantine.message
    # A rotated keyring that still holds the old key verifies; new stamps use the active key.
    rotated = Keyring(keys={**other.keys, **RECORDED_KEYRING.keys}, active_key_id="k2030")
    assert verify_integrity(_STAMPED, keyring=rotated, run_id=RECORDED_RUN_UID) is None
    restamped = stamp_checkpoint(_loaded(load_checkpoint(_STAMPED)).checkpoint, keyring=rotated, run_id="r")
    assert (restamped.integrity or "").startswith("k2030:")


def test_a_stamp_made_for_another_purpose_or_by_another_key_does_not_verify() -> None:
    payload = integrity_payload(_STAMPED, RECORDED_RUN_UID)
    for purpose in Purpose:
        tag = stamp(RECORDED_KEYRING, purpose, payload)
        assert (purpose is Purpose.CHECKPOINT) == (tag == _STAMPED["integrity"])
    same_id = Keyring(keys={"sealing-2025-01": b"\x09" * 32}, active_key_id="sealing-2025-01")
    forged = {**_STAMPED, "integrity": stamp(same_id, Purpose.CHECKPOINT, payload)}
    assert verify_integrity(forged, keyring=RECORDED_KEYRING, run_id=RECORDED_RUN_UID) is not None
    garbage = {**_STAMPED, "integrity": "sealing-2025-01:not base64!"}
    assert verify_integrity(garbage, keyring=RECORDED_KEYRING, run_id=RECORDED_RUN_UID) is not None


# --- property: any checkpoint round-trips exactly --------------------------------------------

# Some instants arrive with another offset: the contract stores them as UTC, still equal.
_instants = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2100, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30))]),
)
_ids = st.text(min_size=1, max_size=24)
_small = st.integers(min_value=0, max_value=2**53 - 1)
_digests = st.binary(max_size=16).map(lambda data: "sha256:" + hashlib.sha256(data).hexdigest())


def _b64(min_size: int, max_size: int) -> st.SearchStrategy[str]:
    return st.binary(min_size=min_size, max_size=max_size).map(lambda data: base64.b64encode(data).decode())


_LOWER = "abcdefghijklmnopqrstuvwxyz0123456789"


def _word(first: str, rest: str, last: str, max_size: int) -> st.SearchStrategy[str]:
    """Cheaper than st.from_regex: first character, middle, last character, each from its alphabet."""
    return st.tuples(st.sampled_from(first), st.text(rest, max_size=max_size), st.text(last, max_size=1)).map(
        "".join
    )


def _hex(size: int) -> st.SearchStrategy[str]:
    return st.binary(min_size=size, max_size=size).map(bytes.hex)


def _build(model: type[_M], /, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[_M]:
    # Not st.builds: it reads the camelCase aliases from the signature and invents values for them.
    return st.fixed_dictionaries(fields).map(lambda values: model(**values))


_kubernetes_refs = _build(
    KubernetesEvidenceRef,
    id=_ids,
    step_index=_small,
    recorded_at=_instants,
    api_version=_ids,
    kind=st.text(min_size=1, max_size=20),
    namespace=st.none() | _word(_LOWER, _LOWER + "-", _LOWER, 10).filter(lambda ns: not ns.endswith("-")),
    name=_ids,
    uid=st.none() | _ids,
    resource_version=_ids,
    content_digest=_digests,
)
_external_refs = _build(
    ExternalEvidenceRef,
    id=_ids,
    step_index=_small,
    recorded_at=_instants,
    uri=st.text(min_size=1, max_size=60),
    content_digest=st.none() | _digests,
)


@st.composite
def _approvals(draw: st.DrawFn) -> ApprovalRecord:
    decided = draw(st.booleans())
    return ApprovalRecord(
        request_id=draw(_ids),
        digest=draw(_digests),
        expires_at=draw(_instants),
        policy_version=draw(_ids),
        decision=draw(st.sampled_from(["approved", "rejected"])) if decided else None,
        decided_by=draw(_ids) if decided else None,
        decided_at=draw(_instants) if decided else None,
    )


@st.composite
def _checkpoints(draw: st.DrawFn) -> Checkpoint:
    refs = draw(st.lists(_kubernetes_refs | _external_refs, max_size=6, unique_by=lambda ref: ref.id))
    buckets = draw(st.lists(st.sampled_from([0, 1, 2]), min_size=len(refs), max_size=len(refs)))
    ref_ids = st.sampled_from([ref.id for ref in refs]) if refs else st.nothing()
    approvals = draw(st.lists(_approvals(), max_size=3, unique_by=lambda approval: approval.request_id))
    request_ids = st.sampled_from([a.request_id for a in approvals]) if approvals else st.nothing()
    tool_calls = _build(
        ToolCallRecord,
        id=_ids,
        tool=_ids,
        step_index=_small,
        started_at=_instants,
        finished_at=_instants,
        outcome=st.sampled_from(["succeeded", "failed"]),
        result_ref=st.none() | ref_ids,
    )
    pending_actions = _build(
        PendingAction,
        idempotency_key=_ids,
        action_record_name=_word(_LOWER, _LOWER + "-.", _LOWER, 20).filter(lambda n: n[-1] in _LOWER),
        effect=_ids,
        tier=st.sampled_from(["read-only", "reversible", "consequential"]),
        step_index=_small,
        approval_request_id=st.none() | request_ids,
    )
    waiting_on = draw(st.sampled_from(["nothing", "input", "external"]))
    sealed_fields = _build(
        SealedField,
        key_id=st.text(_LOWER + "ABCXYZ-._", min_size=1, max_size=20),
        nonce=_b64(12, 12),
        ciphertext=_b64(16, 80),
    )
    return Checkpoint(
        position=Position(
            state=draw(st.text(min_size=1, max_size=20)), step=draw(_small), state_version=draw(_small)
        ),
        fencing=draw(st.none() | _build(Fencing, holder=_ids, lease_transitions=_small)),
        input_refs=[ref for ref, bucket in zip(refs, buckets, strict=True) if bucket == 0],
        output_refs=[ref for ref, bucket in zip(refs, buckets, strict=True) if bucket == 1],
        evidence=[ref for ref, bucket in zip(refs, buckets, strict=True) if bucket == 2],
        tool_calls=draw(st.lists(tool_calls, max_size=4, unique_by=lambda call: call.id)),
        pending_actions=draw(st.lists(pending_actions, max_size=3, unique_by=lambda a: a.idempotency_key)),
        approvals=approvals,
        policy=draw(st.none() | _build(PolicyRef, name=_ids, version=st.none() | _ids)),
        runtime_config=draw(
            _build(RuntimeConfig, model=st.none() | _ids, prompt=st.none() | _ids, tool_set=st.none() | _ids)
        ),
        trace_link=draw(st.none() | st.tuples(_hex(1), _hex(16), _hex(8), _hex(1)).map("-".join)),
        retry=draw(_build(RetryState, attempts=_small, retry_at=st.none() | _instants)),
        timestamps=draw(
            _build(Timestamps, created_at=_instants, updated_at=_instants, entered_state_at=_instants)
        ),
        pending_input=draw(
            _build(
                PendingInput, request_id=_ids, question=st.text(min_size=1, max_size=80), expires_at=_instants
            )
        )
        if waiting_on == "input"
        else None,
        pending_external=draw(_build(PendingExternal, request_id=_ids, event=_ids, expires_at=_instants))
        if waiting_on == "external"
        else None,
        sealed=draw(
            st.none() | st.dictionaries(_word("aZ", _LOWER + "ABC_.-", _LOWER, 14), sealed_fields, max_size=3)
        ),
    )


@settings(max_examples=40)
@given(_checkpoints())
def test_any_checkpoint_round_trips_exactly(checkpoint: Checkpoint) -> None:
    raw = json.loads(json.dumps(dump_checkpoint(checkpoint)))
    loaded = _loaded(load_checkpoint(raw))
    assert loaded.checkpoint == checkpoint
    assert dump_checkpoint(loaded.checkpoint) == raw


@settings(max_examples=30)
@given(_checkpoints(), st.text(min_size=1, max_size=40))
def test_any_stamped_checkpoint_verifies_once_stored_and_read_back(
    checkpoint: Checkpoint, run_id: str
) -> None:
    stamped = stamp_checkpoint(checkpoint, keyring=RECORDED_KEYRING, run_id=run_id)
    stored = json.loads(json.dumps(dump_checkpoint(stamped)))  # what the API server hands back
    assert verify_integrity(stored, keyring=RECORDED_KEYRING, run_id=run_id) is None
    reread = _loaded(load_checkpoint(stored)).checkpoint
    assert stamp_checkpoint(reread, keyring=RECORDED_KEYRING, run_id=run_id) == stamped


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    children: list[tuple[str | int, ...]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            children += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            children += _paths(item, (*prefix, index))
    return [prefix, *children]


_RECORDED = [json.loads(path.read_text()) for path in _FIXTURE_FILES]


@settings(max_examples=80)
@given(st.data())
def test_a_corrupted_checkpoint_never_raises(data: st.DataObject) -> None:
    raw = copy.deepcopy(data.draw(st.sampled_from(_RECORDED)))
    path = data.draw(st.sampled_from(_paths(raw)[1:]))
    target: Any = raw
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = data.draw(_json)
    before = copy.deepcopy(raw)
    assert isinstance(load_checkpoint(raw), Loaded | Quarantine)
    assert raw == before
