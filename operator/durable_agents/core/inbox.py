"""What waits for one person, and decisions pinned to what they reviewed (``kubectl agentrun
inbox``, ``approve``/``reject --request ID --digest D``). Pure: the RBAC question (a
SelfSubjectAccessReview, the same the admission webhook asks) is answered by the caller and
passed in as ``may``.

An approval request waits for a person when they hold its verb on the run, four-eyes does not
exclude them (the run's creator under ``fourEyes``), they have not decided it already (their name
in ``approvedBy`` or on a decision written under one of its keys), nobody rejected it, its quorum
is not reached and it has not expired. A question (``waiting_input``) waits for whoever holds verb
``answer`` on the run. Each entry carries the exact command that decides or answers it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from durable_agents.core.agent.mcp_questions import is_server_question
from durable_agents.core.approvals import decision_keys

ANSWER_VERB = "answer"
RUNS = "agentruns"

May = Callable[[str, str, str, str], bool]
"""``may(namespace, verb, resource, name)``: the SelfSubjectAccessReview's answer."""


@dataclass(frozen=True)
class InboxEntry:
    """One thing that waits for the caller: an approval request or a question."""

    namespace: str
    run: str
    kind: Literal["approval", "question"]
    request: str
    action: str
    waiting_since: datetime | None
    expires_at: datetime | None
    command: str
    digest: str | None = None
    tier: str | None = None
    target: str | None = None
    policy_version: str | None = None
    approvals: str | None = None
    """"k of N" under a quorum above 1."""
    extra_commands: list[str] = field(default_factory=list)


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def decide_command(name: str, namespace: str, request: Mapping[str, Any], decision: str = "approve") -> str:
    """The exact, pinned command that decides ``request``: the request ID and digest reviewed."""
    return shlex.join(
        [
            "kubectl",
            "agentrun",
            decision,
            name,
            "-n",
            namespace,
            "--request",
            str(request.get("requestId")),
            "--digest",
            str(request.get("digest")),
        ]
    )


SERVER_ANSWER = '{"action": "accept", "content": {...}}'
"""The form of an answer to an MCP server's question (or ``{"action": "decline"}``, ``cancel``)."""


def answer_command(name: str, namespace: str, key: str) -> str:
    """The command that answers question ``key`` and no other: refused if the run waits on
    another by then, so the person answers what they read. An MCP server's question is answered
    in its form (accept with the content, decline or cancel)."""
    text = SERVER_ANSWER if is_server_question(key) else "<answer>"
    return (
        f"kubectl agentrun answer {shlex.quote(name)} -n {shlex.quote(namespace)} "
        f"--question {shlex.quote(key)} '{text}'"
    )


def target_of(request: Mapping[str, Any]) -> str:
    """Where the action lands, in a few words (the target's URL or object, else its fields)."""
    target = request.get("target") or {}
    if not isinstance(target, Mapping) or not target:
        return "-"
    for key in ("url", "uri", "name"):
        if isinstance(target.get(key), str):
            return str(target[key])
    return ",".join(f"{k}={v}" for k, v in sorted(target.items()) if isinstance(v, str | int)) or "-"


def votes(run: Mapping[str, Any], request: Mapping[str, Any]) -> tuple[set[str], bool]:
    """Who approved ``request`` so far (verified ``approvedBy`` and the stamped decisions under its
    keys), and whether anyone rejected it (one rejection decides)."""
    approvals = (run.get("spec") or {}).get("approvals") or {}
    approved = {str(v.get("approver")) for v in request.get("approvedBy") or [] if isinstance(v, Mapping)}
    rejected = False
    for key in decision_keys(approvals, str(request.get("requestId"))):
        decision = approvals.get(key) or {}
        who = (decision.get("approver") or {}).get("username")
        if decision.get("decision") == "reject":
            rejected = True
        elif who:
            approved.add(str(who))
    return approved, rejected


def approval_entry(run: Mapping[str, Any], me: str | None, may: May, now: datetime) -> InboxEntry | None:
    """The run's pending approval request, if it waits for ``me`` now."""
    meta, status = run.get("metadata") or {}, run.get("status") or {}
    request = status.get("approvalRequest")
    if status.get("state") != "waiting_approval" or not isinstance(request, Mapping):
        return None
    name, ns = str(meta.get("name")), str(meta.get("namespace"))
    expires = _time(request.get("expiresAt"))
    if expires is not None and expires <= now:
        return None
    creator = ((run.get("spec") or {}).get("createdBy") or {}).get("username")
    if request.get("fourEyes") and me is not None and creator == me:
        return None
    quorum = int(request.get("quorum") or 1)
    approved, rejected = votes(run, request)
    if rejected or len(approved) >= quorum or (me is not None and me in approved):
        return None
    if not may(
        ns, str(request.get("approverVerb") or "approve"), str(request.get("approverResource") or RUNS), name
    ):
        return None
    return InboxEntry(
        namespace=ns,
        run=name,
        kind="approval",
        request=str(request.get("requestId")),
        action=str(request.get("effect")),
        waiting_since=_time(status.get("stateSince")),
        expires_at=expires,
        command=decide_command(name, ns, request),
        digest=str(request.get("digest")),
        tier=str(request.get("tier")),
        target=target_of(request),
        policy_version=request.get("policyVersion"),
        approvals=f"{len(approved)} of {quorum}" if quorum > 1 else None,
        extra_commands=[decide_command(name, ns, request, "reject")]
        if "reject" in (request.get("allowedDecisions") or [])
        else [],
    )


def question_entry(run: Mapping[str, Any], may: May, now: datetime) -> InboxEntry | None:
    """The question the run waits to have answered, if the caller may answer it (verb answer)."""
    meta, status = run.get("metadata") or {}, run.get("status") or {}
    kind, _, key = str(status.get("waitingFor") or "").partition(":")
    pending = (status.get("checkpoint") or {}).get("pendingInput") or {}
    if status.get("state") != "waiting_input" or kind != "input" or not key:
        return None
    name, ns = str(meta.get("name")), str(meta.get("namespace"))
    expires = _time(pending.get("expiresAt"))
    if (expires is not None and expires <= now) or not may(ns, ANSWER_VERB, RUNS, name):
        return None
    return InboxEntry(
        namespace=ns,
        run=name,
        kind="question",
        request=key,
        action="answer a question",
        waiting_since=_time(status.get("stateSince")),
        expires_at=expires,
        command=answer_command(name, ns, key),
    )


def entries(runs: Sequence[Mapping[str, Any]], me: str | None, may: May, now: datetime) -> list[InboxEntry]:
    """What waits for ``me`` in ``runs``, the longest waiting first."""
    found = [
        entry
        for run in runs
        for entry in (approval_entry(run, me, may, now), question_entry(run, may, now))
        if entry is not None
    ]
    return sorted(found, key=lambda e: (e.waiting_since or now, e.namespace, e.run, e.request))


def superseded(
    name: str, namespace: str, current: Mapping[str, Any] | None, request_id: str, digest: str
) -> str | None:
    """Why a decision pinned to (``request_id``, ``digest``) must not be sent, or None: the pending
    request is another one (or none). Says what changed and the command for the current one."""
    if not current:
        return (
            f"agentrun {namespace}/{name} has no pending approval request: the request you reviewed "
            f"({request_id}, {digest}) is no longer pending; nothing was sent"
        )
    if current.get("requestId") == request_id and current.get("digest") == digest:
        return None
    what = (
        f"{current.get('effect')} ({current.get('tier')}) at step {current.get('step')}, "
        f"policy version {current.get('policyVersion') or '-'}"
    )
    return (
        f"the request you reviewed was superseded: you reviewed {request_id} with digest {digest}; "
        f"the pending request is {current.get('requestId')} with digest {current.get('digest')} "
        f"({what}; {current.get('policyReason', '')}). Nothing was sent. Review it "
        f"(kubectl agentrun status {name} -n {namespace} --reveal), then: "
        f"{decide_command(name, namespace, current)}"
    )
