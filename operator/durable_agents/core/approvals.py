"""Approvals bound to a digest: what is approved, and whether a decision may be accepted.

The digest is SHA-256 over RFC 8785 canonical JSON of the consequential fields (effect,
arguments, target, the ServiceAccount the effect runs as, policy version, run UID, request ID),
so an approval binds to exactly one action, done as one identity, under one policy version in one
run. :func:`check_decision` holds every rule the admission
webhook enforces except the RBAC question (a SubjectAccessReview, asked by the shell). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from durable_agents.api.v1alpha1 import ApprovalDecision, ApprovalRequest, Identity
from durable_agents.core.digest import canonical_digest

# A request's ID is ``<step>-<n>``. Under a quorum, the first decision goes under the request ID and
# each further one under ``<request ID>.<k>`` (k = 2, 3, ...): one key per decision, so two approvers
# deciding at once never overwrite each other (spec.approvals is append-only).
_QUORUM_KEY = re.compile(r"^(?P<request>.+-[0-9]+)\.(?P<k>[0-9]+)$")


def request_of_key(key: str) -> str:
    """The request ID a ``spec.approvals`` key decides (itself, or the part before ``.<k>``)."""
    match = _QUORUM_KEY.match(key)
    return match["request"] if match else key


def decision_keys(approvals: Mapping[str, Any], request_id: str) -> list[str]:
    """The ``spec.approvals`` keys that decide ``request_id``, in the order they were numbered."""
    keys = [key for key in approvals if request_of_key(key) == request_id]
    return sorted(keys, key=lambda key: 1 if key == request_id else int(key.rsplit(".", 1)[1]))


def next_decision_key(approvals: Mapping[str, Any], request_id: str) -> str:
    """Where a new decision on ``request_id`` goes: the request ID, or the next ``.<k>``."""
    keys = decision_keys(approvals, request_id)
    if not keys:
        return request_id
    numbered = [int(key.rsplit(".", 1)[1]) for key in keys if key != request_id]
    return f"{request_id}.{max([1, *numbered]) + 1}"


def approval_digest(
    *,
    effect: str,
    arguments: Mapping[str, Any] | None,
    target: Mapping[str, Any] | None,
    service_account: str,
    policy_version: str | None,
    run_uid: str,
    request_id: str,
    tool: str | None = None,
) -> str:
    # A model-proposed call's tool name is bound too (a scripted step has none: its digest is
    # what it always was, so approvals given before this field existed still verify).
    named = {"tool": tool} if tool is not None else {}
    return canonical_digest(
        {
            **named,
            "effect": effect,
            "arguments": dict(arguments or {}),
            "target": dict(target or {}),
            "serviceAccount": service_account,
            "policyVersion": policy_version or "",
            "runUID": run_uid,
            "requestID": request_id,
        }
    )


def check_decision(
    *,
    request: ApprovalRequest | None,
    request_id: str,
    decision: ApprovalDecision,
    now: datetime,
    user: Identity,
    creator: Identity | None,
    four_eyes: bool,
) -> str | None:
    """Why this decision must be refused, or None. Messages are for the person who sent it."""
    if request is None:
        return f"unknown approval request {request_id!r}: the run has no pending approval request"
    if request_id != request.request_id:
        return f"unknown approval request {request_id!r}: the pending request is {request.request_id!r}"
    if decision.digest != request.digest:
        return (
            f"wrong digest for request {request_id!r}: the request binds {request.digest}, "
            f"the decision names {decision.digest}"
        )
    if now >= request.expires_at:
        return f"approval request {request_id!r} expired at {request.expires_at.isoformat()}"
    if decision.decision not in request.allowed_decisions:
        allowed = ", ".join(request.allowed_decisions)
        return (
            f"decision {decision.decision!r} is not allowed for request {request_id!r} (allowed: {allowed})"
        )
    if four_eyes and creator is not None and creator.username == user.username:
        return f"four-eyes policy: {user.username!r} created this run and may not approve its actions"
    return None
