"""Approvals bound to a digest: what is approved, and whether a decision may be accepted.

The digest is SHA-256 over RFC 8785 canonical JSON of the consequential fields (effect,
arguments, target, the ServiceAccount the effect runs as, policy version, run UID, request ID),
so an approval binds to exactly one action, done as one identity, under one policy version in one
run. :func:`check_decision` holds every rule the admission
webhook enforces except the RBAC question (a SubjectAccessReview, asked by the shell);
:func:`tally` counts the decisions on a request under its quorum, for the webhook and the engine
alike (each person once, never the creator under four-eyes, one rejection decides). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
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
    definition: str | None = None,
) -> str:
    # A model-proposed call's tool name is bound too (a scripted step has none: its digest is
    # what it always was, so approvals given before this field existed still verify). So is the
    # digest of the Agent definition a run of an Agent stands under (none for an inline agent).
    named = {"tool": tool} if tool is not None else {}
    if definition is not None:
        named["definition"] = definition
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


# A decision's reason is shown to people (and, under replan, to the model): one bounded paragraph
# of text, no control characters but tab and line breaks (no terminal escapes, no NULs). The CRD says
# the same (a pattern on spec.approvals[*].reason); the webhook checks it again.
REASON_LIMIT = 1024
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # as the CRD's PLAIN_TEXT
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def reason_problem(reason: str | None) -> str | None:
    """Why a decision's reason may not be stored, or None."""
    if reason is None:
        return None
    if len(reason) > REASON_LIMIT:
        return f"the reason is {len(reason)} characters long; at most {REASON_LIMIT}"
    found = _CONTROL.search(reason)
    if found is not None:
        return (
            f"the reason holds control character {ord(found[0]):#04x} at offset {found.start()}; "
            "only tab and line breaks are allowed"
        )
    return None


@dataclass(frozen=True)
class Vote:
    """One decision on a request, as counted: who, under which key, when, what."""

    approver: str
    key: str
    decided_at: datetime | None
    decision: str


@dataclass(frozen=True)
class Tally:
    """The decisions on one request, counted under its quorum: distinct approvers (each once, in
    the order of their keys), the first rejection, and what they decide."""

    quorum: int
    approvals: tuple[Vote, ...]
    rejection: Vote | None

    @property
    def missing(self) -> int:
        return max(0, self.quorum - len(self.approvals))

    @property
    def outcome(self) -> str | None:
        """``rejected`` (one rejection decides), ``approved`` (the quorum reached) or None."""
        if self.rejection is not None:
            return "rejected"
        return "approved" if not self.missing else None


def tally(
    decisions: Mapping[str, ApprovalDecision],
    request_id: str,
    *,
    quorum: int,
    creator: str | None,
    four_eyes: bool,
) -> Tally:
    """Count the decisions on ``request_id`` among ``decisions`` (only those whose stamps verify:
    the caller's to filter). A person counts once however many keys they wrote; under four-eyes
    the creator counts never (neither approving nor rejecting)."""
    approvals: list[Vote] = []
    rejection: Vote | None = None
    seen: set[str] = set()
    for key in decision_keys(decisions, request_id):
        decision = decisions[key]
        who = decision.approver.username if decision.approver is not None else None
        if who is None or (four_eyes and who == creator):
            continue
        vote = Vote(who, key, decision.decided_at, decision.decision)
        if decision.decision == "reject":
            rejection = rejection or vote
        elif who not in seen:
            approvals.append(vote)
        seen.add(who)
    return Tally(quorum=quorum, approvals=tuple(approvals), rejection=rejection)


def _superseded(named: str, request: ApprovalRequest) -> bool:
    """Whether ``named`` is an earlier request of the pending request's step (``<step>-<n>``)."""
    prefix = f"{request.step}-"
    current, earlier = request.request_id.removeprefix(prefix), named.removeprefix(prefix)
    return (
        named.startswith(prefix) and earlier.isdigit() and current.isdigit() and int(earlier) < int(current)
    )


def _already_decided(named: str, counted: Tally) -> str | None:
    if counted.rejection is not None:
        vote = counted.rejection
        return f"approval request {named!r} is already decided: rejected by {vote.approver!r} ({vote.key!r})"
    if counted.outcome == "approved":
        who = ", ".join(repr(vote.approver) for vote in counted.approvals)
        return f"approval request {named!r} is already decided: approved by {who} (quorum {counted.quorum})"
    return None


def _request_problem(
    request: ApprovalRequest | None, key: str, named: str, decided: Mapping[str, ApprovalDecision]
) -> str | None:
    """Why the request ``key`` names is not the one a decision can be given on now, or None."""
    if request is not None and named == request.request_id:
        return None
    if request is not None and _superseded(named, request):
        return (
            f"approval request {named!r} was superseded by {request.request_id!r} "
            f"(digest {request.digest}): review the new request and decide that one"
        )
    given = decision_keys(decided, named)
    if given:
        return f"approval request {named!r} is already decided (under {', '.join(map(repr, given))})"
    if request is None:
        return f"unknown approval request {key!r}: the run has no pending approval request"
    return f"unknown approval request {key!r}: the pending request is {request.request_id!r}"


def check_decision(
    *,
    request: ApprovalRequest | None,
    request_id: str,
    decision: ApprovalDecision,
    now: datetime,
    user: Identity,
    creator: Identity | None,
    four_eyes: bool,
    decided: Mapping[str, ApprovalDecision] | None = None,
) -> str | None:
    """Why this decision must be refused, or None. Messages are for the person who sent it.

    ``request_id`` is the ``spec.approvals`` key it was written under (the request ID, or
    ``<request ID>.<k>`` under a quorum); ``decided``: the decisions already given on the run
    whose stamps verify (for a quorum: who decided, whether it is decided already).
    """
    decided = decided or {}
    named = request_of_key(request_id)
    problem = _request_problem(request, request_id, named, decided)
    if problem is not None:
        return problem
    assert request is not None
    creator_name = creator.username if creator is not None else None
    counted = tally(decided, named, quorum=request.quorum, creator=creator_name, four_eyes=four_eyes)
    problem = _already_decided(named, counted)
    if problem is not None:
        return problem
    earlier = next(
        (
            key
            for key in decision_keys(decided, named)
            if (approver := decided[key].approver) is not None and approver.username == user.username
        ),
        None,
    )
    if earlier is not None:
        return (
            f"{user.username!r} already decided approval request {named!r} (under {earlier!r}): "
            "each person decides a request once"
        )
    if not _DIGEST.fullmatch(decision.digest):
        return (
            f"malformed digest {decision.digest!r}: a digest is 'sha256:' and 64 lowercase hex digits, "
            "as status.approvalRequest.digest shows it"
        )
    if decision.digest != request.digest:
        return (
            f"wrong digest for request {named!r}: the request binds {request.digest}, "
            f"the decision names {decision.digest}"
        )
    if now >= request.expires_at:
        return f"approval request {named!r} expired at {request.expires_at.isoformat()}"
    if decision.decision not in request.allowed_decisions:
        allowed = ", ".join(request.allowed_decisions)
        return f"decision {decision.decision!r} is not allowed for request {named!r} (allowed: {allowed})"
    if four_eyes and creator is not None and creator.username == user.username:
        return f"four-eyes policy: {user.username!r} created this run and may not approve its actions"
    problem = reason_problem(decision.reason)
    return None if problem is None else f"spec.approvals[{request_id!r}].reason: {problem}"
