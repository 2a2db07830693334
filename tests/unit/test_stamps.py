"""Stamps: only the keyring's holder can make one; any change to the stamped fields breaks it."""

from __future__ import annotations

import pytest

from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp, stamp_key_id, verify

pytestmark = pytest.mark.unit

OLD = Keyring(keys={"k1": bytes(32)}, active_key_id="k1")
ROTATED = Keyring(keys={"k1": bytes(32), "k2": bytes(range(32))}, active_key_id="k2")
DECISION = {"requestId": "r1", "digest": "sha256:ab", "decision": "approve", "approver": "alice"}


def test_a_stamp_verifies_for_exactly_its_payload_and_purpose() -> None:
    value = stamp(OLD, Purpose.DECISION, DECISION)
    assert verify(OLD, Purpose.DECISION, DECISION, value)
    assert not verify(OLD, Purpose.DECISION, {**DECISION, "approver": "mallory"}, value)
    assert not verify(OLD, Purpose.DECISION, {**DECISION, "extra": "x"}, value)
    assert not verify(OLD, Purpose.CONTROL, DECISION, value)


def test_no_key_no_stamp_and_garbage_never_verifies() -> None:
    value = stamp(OLD, Purpose.DECISION, DECISION)
    assert not verify(None, Purpose.DECISION, DECISION, value)
    other = Keyring(keys={"k1": bytes(range(1, 33))}, active_key_id="k1")
    assert not verify(other, Purpose.DECISION, DECISION, value)
    for forged in ("", "k1", "k1:", "k1:not-base64!", "k9:" + value.split(":")[1], None):
        assert not verify(OLD, Purpose.DECISION, DECISION, forged)


def test_stamps_rotate_with_the_keyring() -> None:
    old = stamp(OLD, Purpose.CHECKPOINT, DECISION)
    new = stamp(ROTATED, Purpose.CHECKPOINT, DECISION)
    assert stamp_key_id(old) == "k1"
    assert stamp_key_id(new) == "k2"
    assert verify(ROTATED, Purpose.CHECKPOINT, DECISION, old)  # the old key still verifies
    retired = Keyring(keys={"k2": bytes(range(32))}, active_key_id="k2")
    assert not verify(retired, Purpose.CHECKPOINT, DECISION, old)
