"""The pure rules for answers and events: a value's seal is its proof; a refused key is asked again."""

from __future__ import annotations

import os
import re

import pytest

from durable_agents.api.v1alpha1.meta import REQUEST_ID_PATTERN
from durable_agents.core.deliveries import (
    KEY_MAX,
    SEAL_INVALID,
    UNSEALED,
    base_key,
    delivery_label,
    delivery_unproven,
    next_key,
)
from durable_agents.core.sealed_values import new_data_key, seal_value

pytestmark = pytest.mark.unit

KEY = new_data_key(entropy=os.urandom)


@pytest.mark.parametrize("field", ["answers", "events"])
def test_only_a_value_sealed_for_its_own_key_is_proven(field: str) -> None:
    label = delivery_label(field, "confirm")  # type: ignore[arg-type]
    assert label == f"{field}/confirm"
    proven = seal_value(KEY, "yes", label, entropy=os.urandom)
    assert delivery_unproven(KEY, field, "confirm", proven) is None  # type: ignore[arg-type]

    unsealed = delivery_unproven(KEY, field, "confirm", "yes")  # type: ignore[arg-type]
    assert unsealed is not None
    assert unsealed.reason == UNSEALED
    assert "not sealed" in unsealed.message

    cases = {
        "another key's seal": seal_value(KEY, "yes", delivery_label(field, "other"), entropy=os.urandom),  # type: ignore[arg-type]
        "another field's seal": seal_value(KEY, "yes", "steps/confirm/question", entropy=os.urandom),
        "another run tree's seal": seal_value(
            new_data_key(entropy=os.urandom), "yes", label, entropy=os.urandom
        ),
        "a tampered seal": proven[:-4] + ("AAAA" if not proven.endswith("AAAA") else "BBBB"),
        "a sealed-looking string that is not": "sealed:v1:not-base64!",
    }
    for what, value in cases.items():
        problem = delivery_unproven(KEY, field, "confirm", value)  # type: ignore[arg-type]
        assert problem is not None
        assert problem.reason == SEAL_INVALID, what
        assert label in problem.message


def test_a_run_without_a_data_key_believes_what_is_written() -> None:
    """Legacy: a run created before sealing has no data key; its values are in clear."""
    assert delivery_unproven(None, "answers", "confirm", "yes") is None
    assert delivery_unproven(None, "events", "go", "sealed:v1:anything") is None


@pytest.mark.parametrize(
    ("key", "taken", "expected"),
    [
        ("confirm", {"confirm"}, "confirm.2"),
        ("confirm.2", {"confirm", "confirm.2"}, "confirm.3"),
        ("confirm", {"confirm", "confirm.2"}, "confirm.3"),  # a key forged in advance is skipped
        ("confirm.3", {"confirm", "confirm.2", "confirm.3", "confirm.4"}, "confirm.5"),
        ("agent-4", {"agent-4"}, "agent-4.2"),
        ("v1.0", {"v1.0"}, "v1.0.2"),  # ".0" is part of the name, not a counter
        ("release.2", {"release.2"}, "release.3"),  # never the key just refused
    ],
)
def test_the_next_key(key: str, taken: set[str], expected: str) -> None:
    assert next_key(key, taken) == expected


def test_the_next_key_stays_within_the_request_id_pattern_and_length() -> None:
    for key in ("a" * 63, "a" * 60 + "-bc", "x" * 61 + ".9", "a" * 59 + "-" + "b" * 3):
        taken = {key}
        for _ in range(12):
            new = next_key(key, taken)
            assert len(new) <= KEY_MAX, new
            assert re.fullmatch(REQUEST_ID_PATTERN, new), new
            assert new not in taken
            taken.add(new)
            key = new


def test_the_base_key() -> None:
    assert [base_key(k) for k in ("confirm", "confirm.2", "confirm.17", "v1.0", "v1.1", "a.b")] == [
        "confirm",
        "confirm",
        "confirm",
        "v1.0",
        "v1.1",
        "a.b",
    ]
