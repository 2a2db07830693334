"""A policy's integrity and its deletion: the pure rules (core/policy_integrity.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from durable_agents.core.policy_integrity import (
    FORCE_DELETE,
    FORCE_DELETE_BY,
    FORCE_DELETE_STAMP,
    MAX_HISTORY,
    Identity,
    deletion_refusal,
    force_reason,
    force_stamps,
    force_unproven,
    history_of,
    identity_of,
    runs_using,
    version_conflict,
    with_version,
)
from durable_agents.core.sealing import Keyring


def policy(version: str, tiers: list[str], **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "payments"},
        "spec": {"version": version, "approvalRequiredTiers": tiers},
    }
    if status:
        body["status"] = status
    return body


def run(name: str, policy_name: str | None, state: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"policyRef": {"name": policy_name}} if policy_name else {}
    body: dict[str, Any] = {"metadata": {"name": name}, "spec": spec}
    if state is not None:
        body["status"] = {"state": state}
    return body


def test_a_change_of_content_under_the_same_version_is_a_conflict_naming_spec_version() -> None:
    old, new = identity_of(policy("v1", ["consequential"])), identity_of(policy("v1", []))
    assert old is not None
    assert new is not None
    why = version_conflict("payments", new, {old.version: old.digest})
    assert why is not None
    assert why.startswith("spec.version:")
    assert "'v1'" in why


def test_the_same_content_again_is_no_conflict_and_a_new_version_is_none_either() -> None:
    old = identity_of(policy("v1", ["consequential"]))
    assert old is not None
    history = {old.version: old.digest}
    assert version_conflict("payments", old, history) is None
    changed = identity_of(policy("v2", []))
    assert changed is not None
    assert version_conflict("payments", changed, history) is None


def test_an_old_version_reused_with_other_content_is_a_conflict_from_status_versions() -> None:
    v1 = identity_of(policy("v1", ["consequential"]))
    assert v1 is not None
    current = policy(
        "v2",
        [],
        versions=[
            {"version": "v1", "contentDigest": v1.digest},
            {"version": "v2", "contentDigest": "sha256:x"},
        ],
    )
    back = identity_of(policy("v1", ["unknown"]))
    assert back is not None
    assert version_conflict("payments", back, history_of(current)) is not None
    same_back = identity_of(policy("v1", ["consequential"]))
    assert same_back is not None
    assert version_conflict("payments", same_back, history_of(current)) is None


def test_without_status_versions_the_history_is_the_object_itself() -> None:
    body = policy("v3", ["consequential"])
    own = identity_of(body)
    assert own is not None
    assert history_of(body) == {"v3": own.digest}


@given(st.lists(st.tuples(st.integers(0, 40).map(str), st.sampled_from(("d1", "d2"))), max_size=120))
def test_status_versions_keep_the_newest_at_most_32_and_never_write_over_a_conflict(
    changes: list[tuple[str, str]],
) -> None:
    history: list[dict[str, str]] = []
    for version, digest in changes:
        before = {e["version"]: e["contentDigest"] for e in history}
        history = with_version(history, Identity(version, digest))
        if before.get(version, digest) == digest:
            assert history[-1] == {"version": version, "contentDigest": digest}
        else:  # the same version with another content: the history keeps what it had
            assert {e["version"]: e["contentDigest"] for e in history} == before
        assert len(history) <= MAX_HISTORY
        assert len({entry["version"] for entry in history}) == len(history)


def test_the_runs_using_a_policy_are_the_live_ones_that_name_it() -> None:
    listed = [
        run("b", "payments", "waiting_approval"),
        run("a", "payments"),  # not accepted yet: it will act under the policy
        run("c", "payments", "completed"),
        run("d", "other", "running"),
        run("e", None, "ready"),
        run("f", "payments", "quarantined"),
    ]
    assert runs_using(listed, "payments") == ["a", "b", "f"]


def test_a_refused_deletion_names_ten_runs_and_the_total() -> None:
    assert deletion_refusal("ns", "payments", []) is None
    names = [f"run-{i:02d}" for i in range(13)]
    why = deletion_refusal("ns", "payments", names)
    assert why is not None
    assert "13 run(s)" in why
    assert "run-09" in why
    assert "run-10" not in why
    assert "and 3 more" in why
    assert FORCE_DELETE in why
    assert "force-delete" in why


def test_the_force_mark_is_an_annotation_with_a_reason() -> None:
    assert force_reason(policy("v1", [])) is None
    marked = {
        **policy("v1", []),
        "metadata": {"name": "p", "annotations": {FORCE_DELETE: "INC-42 broken tiers"}},
    }
    assert force_reason(marked) == "INC-42 broken tiers"


KEYS = Keyring(keys={"k1": bytes(range(32))}, active_key_id="k1")


def marked(reason: str | None, **notes: str) -> dict[str, Any]:
    annotations = {**({FORCE_DELETE: reason} if reason else {}), **notes}
    meta = {"name": "payments", "namespace": "ns", "uid": "u-1", "annotations": annotations}
    return {"metadata": meta, "spec": {"version": "v1"}}


def test_a_new_mark_is_stamped_with_who_and_when_and_verifies() -> None:
    stamps = force_stamps(marked("INC-7"), marked(None), "oncall", "2026-12-03T10:00:00.000000Z", KEYS)
    assert stamps[FORCE_DELETE_BY] == "oncall"
    policy = marked("INC-7", **{k: v for k, v in stamps.items() if v is not None})
    assert force_unproven(KEYS, policy) is None
    # The stamp covers the reason and the policy's UID: neither can be changed under it.
    assert force_unproven(KEYS, {**policy, "metadata": {**policy["metadata"], "uid": "u-2"}}) is not None
    other = marked("another reason", **{k: v for k, v in stamps.items() if v is not None})
    assert force_unproven(KEYS, other) is not None


def test_a_mark_without_the_webhooks_stamp_does_not_verify() -> None:
    assert force_unproven(KEYS, marked("by hand")) is not None
    assert (
        force_unproven(KEYS, marked("by hand", **{FORCE_DELETE_BY: "oncall", FORCE_DELETE_STAMP: "k1:QUJD"}))
        is not None
    )


def test_the_stamp_is_written_once_per_mark_and_removed_with_it() -> None:
    stamps = force_stamps(marked("INC-7"), marked(None), "oncall", "t", KEYS)
    same = marked("INC-7", **{k: v for k, v in stamps.items() if v is not None})
    assert force_stamps(same, same, "someone-else", "t2", KEYS) == {}  # unchanged mark: nothing
    unmarked = {
        **same,
        "metadata": {**same["metadata"], "annotations": {k: v for k, v in stamps.items() if v}},
    }
    assert force_stamps(unmarked, same, "oncall", "t3", KEYS) == dict.fromkeys(stamps)
