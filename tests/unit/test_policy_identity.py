"""A policy's content digest: its rules, not its version label."""

from __future__ import annotations

from durable_agents.core.policy_identity import content_digest


def test_the_version_label_is_not_content() -> None:
    rules = {"approvalRequiredTiers": ["consequential"], "retry": {"maxAttempts": 2}}
    assert content_digest({"version": "v1", **rules}) == content_digest({"version": "v2", **rules})


def test_any_change_of_rules_changes_the_digest() -> None:
    before = {"version": "v1", "approvalRequiredTiers": ["consequential"]}
    after = {"version": "v1", "approvalRequiredTiers": ["consequential", "unknown"]}
    assert content_digest(before) != content_digest(after)
    assert content_digest(before).startswith("sha256:")
