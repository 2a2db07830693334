"""Stuck runs: a run for which no valid next event can arrive, and what would unstick it.

From a run's spec and status and a few facts the shell gathers (is its AgentPolicy there? does
anyone hold the policy's approver verb? which of its actions have an unknown outcome?), decide
whether it is stuck, why (a fixed reason, also a metric label) and what would unstick it (the exact
command or object to create). Then the ``Stuck`` condition that says so, or that says it no
longer is. Pure: no I/O.

Reasons, checked in this order (one condition, the first that applies):

* ``Quarantined``: the run is quarantined; after fixing the cause, ``kubectl agentrun retry``.
* ``PolicyMissing``: its AgentPolicy is gone: nothing runs without it; create it again.
* ``UnreconcilableOutcome``: an action's outcome is unknown and its system cannot be asked by key:
  only a person's ``kubectl agentrun reconcile RUN --action NAME --applied|--not-applied`` settles it.
* ``NoApprover``: it waits for an approval and nobody holds the policy's approver verb on it; or,
  under a quorum, fewer people than it still needs could give it (those the RBAC bindings name as
  holding the verb, less the creator under four-eyes, less those who approved; a Group holding
  the verb makes the count unknown: not stuck).
* ``WaitWithoutExpiry``: it has waited longer than the threshold for something without an expiry
  (an action in flight, a child run) and has no deadline.
* ``ParentGone``: a child run waits, and its parent run (by name and uid) is gone: nobody will
  read its result (a parent deleted through the operator cancels its children first).
* ``ActionUnanswered``: an action's outcome has been unknown for longer than its bound though its
  system can be asked by key: the queries do not answer (the system or its query endpoint is down).
* ``NotAdvancing``: it is eligible to work (pending, ready, resume_validation, cancel_requested) and
  its owner has not advanced it (its ``stateVersion`` unchanged) within the bound of its state.

The runs no live replica owns (their region served by nobody, or their shard Lease held by a
replica that stopped renewing it) are judged by the replicas that are alive:
:mod:`durable_agents.core.stuck_unowned`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from durable_agents.api.v1alpha1 import AgentRunSpec, AgentRunStatus, Condition, ConditionStatus
from durable_agents.api.v1alpha1.states import RunState

STUCK = "Stuck"
QUARANTINED = "Quarantined"
POLICY_MISSING = "PolicyMissing"
UNRECONCILABLE_OUTCOME = "UnreconcilableOutcome"
NO_APPROVER = "NoApprover"
WAIT_WITHOUT_EXPIRY = "WaitWithoutExpiry"
NOT_ADVANCING = "NotAdvancing"
ACTION_UNANSWERED = "ActionUnanswered"
PARENT_GONE = "ParentGone"
REASONS: tuple[str, ...] = (
    POLICY_MISSING,
    NO_APPROVER,
    UNRECONCILABLE_OUTCOME,
    WAIT_WITHOUT_EXPIRY,
    QUARANTINED,
    NOT_ADVANCING,
    ACTION_UNANSWERED,
    PARENT_GONE,
)
NOT_STUCK = "NotStuck"  # the condition's reason once the cause is gone (status False)
DEFAULT_THRESHOLD = timedelta(hours=24)
# The states in which a run is eligible to work: its owner advances it without waiting for anyone.
ELIGIBLE_STATES = (RunState.PENDING, RunState.READY, RunState.RESUME_VALIDATION, RunState.CANCEL_REQUESTED)
DEFAULT_BOUND = timedelta(minutes=10)
DEFAULT_BOUNDS: Mapping[RunState, timedelta] = dict.fromkeys(ELIGIBLE_STATES, DEFAULT_BOUND)
# An unknown outcome's last query answered this: its system cannot be asked by key (an MCP tool
# without a query tool: durable_agents.shell.effects.mcp.NO_QUERY), or its query target is invalid.
NO_QUERY_REASONS = frozenset({"NoQueryByKey", "InvalidTarget"})
# Where a wait records its own expiry, in the checkpoint (camelCase, as stored).
_EXPIRIES = (("pendingInput", "expiresAt"), ("pendingExternal", "expiresAt"), ("retry", "retryAt"))


@dataclass(frozen=True)
class ApproverRule:
    """Who may approve: this verb on this resource of durable-agents.io (the policy's ``approvers``)."""

    verb: str = "approve"
    resource: str = "agentruns"


@dataclass(frozen=True)
class UnknownAction:
    """One of the run's ActionRecords whose outcome is unknown, as the ledger says."""

    name: str
    reason: str | None = None  # the last query's answer (status.reason)
    since: datetime | None = None  # since when it is unknown, as the shell saw it

    @property
    def queryable(self) -> bool:
        return self.reason not in NO_QUERY_REASONS


@dataclass(frozen=True)
class Facts:
    """What the shell found out for one run. ``None``: not looked at (not needed for this run)."""

    now: datetime
    threshold: timedelta = DEFAULT_THRESHOLD
    policy_present: bool | None = None
    approver: ApproverRule = field(default_factory=ApproverRule)
    approver_held: bool | None = None
    approver_holders: frozenset[str] | None = None
    """Under a quorum: the users (ServiceAccounts as ``system:serviceaccount:NS:NAME``) a binding
    names who hold the approver verb; None: not looked at, or unknowable (a Group holds it)."""
    unknown_actions: Sequence[UnknownAction] = ()
    bounds: Mapping[RunState, timedelta] = field(default_factory=lambda: dict(DEFAULT_BOUNDS))
    """How long a run may stay in an eligible state without advancing (per state)."""
    unchanged_since: datetime | None = None
    """Since when the run's ``stateVersion`` has not changed, as the shell saw it; None: unknown."""
    unanswered_after: timedelta = DEFAULT_BOUND
    parent_present: bool | None = None
    """For a child run: whether its parent (by name and uid) is still there; None: not looked at."""
    """How long an action's outcome may stay unknown, its system asked and not answering."""


@dataclass(frozen=True)
class Stuck:
    reason: str
    message: str


def needs_policy(spec: AgentRunSpec, status: AgentRunStatus) -> bool:
    """Whether the run's verdict depends on its AgentPolicy being there."""
    return spec.policy_ref is not None and not status.state.terminal


def needs_approver(status: AgentRunStatus) -> bool:
    """Whether the run's verdict depends on someone holding the approver verb."""
    return status.state is RunState.WAITING_APPROVAL and status.approval_request is not None


def wait_expiry(spec: AgentRunSpec, status: AgentRunStatus) -> datetime | None:
    """When the run's current wait ends by itself (its expiry, retry time or deadline), if ever."""
    found: list[datetime] = [spec.deadline] if spec.deadline is not None else []
    if status.approval_request is not None and status.state is RunState.WAITING_APPROVAL:
        found.append(status.approval_request.expires_at)
    if status.retry_at is not None and status.state is RunState.WAITING_RETRY:
        found.append(status.retry_at)
    checkpoint: Mapping[str, Any] = status.checkpoint or {}
    for part, key in _EXPIRIES:
        raw = (checkpoint.get(part) or {}).get(key) if isinstance(checkpoint.get(part), Mapping) else None
        if isinstance(raw, str):
            try:
                found.append(datetime.fromisoformat(raw.replace("Z", "+00:00")))
            except ValueError:
                continue
    return min(found) if found else None


def judged_for_good(spec: AgentRunSpec, status: AgentRunStatus, bounds: Mapping[RunState, timedelta]) -> bool:
    """Whether the verdict on the run, as it is, can change only when the run does, an action of it
    is found with an unknown outcome, or a policy changes: it depends on no time passing (no wait
    without expiry, no advance bound), no RBAC object (no approval waited for) and no parent run.
    A periodic check need not judge such a run again until one of those changes."""
    state = status.state
    if state.terminal or state is RunState.QUARANTINED:
        return True
    if (spec.parent_ref is not None and state.waiting) or needs_approver(status) or state in bounds:
        return False
    return not (state.waiting and wait_expiry(spec, status) is None)


def stuck(
    namespace: str, name: str, spec: AgentRunSpec, status: AgentRunStatus, facts: Facts
) -> Stuck | None:
    """Whether the run is stuck, and what would unstick it; None when it is not (or has ended)."""
    state = status.state
    if state.terminal:
        return None
    run = f"{name} -n {namespace}"
    if state is RunState.QUARANTINED:
        outcome = status.outcome
        why = f" ({outcome.reason}: {outcome.message})" if outcome is not None else ""
        return Stuck(
            QUARANTINED,
            f"the run is quarantined{why}; once the cause is fixed, retry it: kubectl agentrun retry {run}",
        )
    if spec.policy_ref is not None and facts.policy_present is False:
        policy = spec.policy_ref.name
        return Stuck(
            POLICY_MISSING,
            f"its AgentPolicy {policy!r} is gone from namespace {namespace!r}; nothing runs without it: "
            f"create it again (kubectl apply -n {namespace} -f <AgentPolicy {policy}>)",
        )
    if spec.parent_ref is not None and facts.parent_present is False and state.waiting:
        parent = spec.parent_ref
        return Stuck(
            PARENT_GONE,
            f"it waits ({status.waiting_for or state.value}) for its parent run {parent.name!r} (uid "
            f"{parent.uid}), which is gone: nothing will read its result; cancel it: kubectl agentrun "
            f"cancel {run} (or, if its work is still wanted, answer what it waits for: kubectl agentrun "
            f"why {run})",
        )
    unqueryable = [action for action in facts.unknown_actions if not action.queryable]
    if unqueryable:
        action = unqueryable[0]
        return Stuck(
            UNRECONCILABLE_OUTCOME,
            f"the outcome of action {action.name} is unknown and its system cannot be asked by key "
            f"({action.reason}); someone who holds verb {facts.approver.verb!r} on {facts.approver.resource} "
            f"says whether it happened: kubectl agentrun reconcile {run} --action {action.name} "
            "--applied|--not-applied",
        )
    unanswered = [
        action
        for action in facts.unknown_actions
        if action.since is not None and facts.now - action.since >= facts.unanswered_after
    ]
    if unanswered:
        action = unanswered[0]
        return Stuck(
            ACTION_UNANSWERED,
            f"the outcome of action {action.name} is unknown and its system has not answered the "
            f"operator's queries by key for longer than {int(facts.unanswered_after.total_seconds())}s; "
            "check that system (its query endpoint) and, if you know whether the action happened: "
            f"kubectl agentrun reconcile {run} --action {action.name} --applied|--not-applied",
        )
    if needs_approver(status) and facts.approver_held is False:
        verb, resource = facts.approver.verb, facts.approver.resource
        return Stuck(
            NO_APPROVER,
            f"it waits for an approval and nobody holds verb {verb!r} on {resource}.durable-agents.io in "
            f"namespace {namespace!r}; grant it to an approver: kubectl create role agentrun-approver "
            f"-n {namespace} --verb={verb} --resource={resource}.durable-agents.io && kubectl create "
            f"rolebinding agentrun-approvers -n {namespace} --role=agentrun-approver --user=<approver>",
        )
    short = _quorum_short(namespace, spec, status, facts)
    if short is not None:
        return short
    if state.waiting and wait_expiry(spec, status) is None and status.state_since is not None:
        waited = facts.now - status.state_since
        if waited >= facts.threshold:
            return Stuck(WAIT_WITHOUT_EXPIRY, _no_expiry_message(namespace, name, status, status.state_since))
    return _not_advancing(namespace, name, status, facts)


def _not_advancing(namespace: str, name: str, status: AgentRunStatus, facts: Facts) -> Stuck | None:
    """An eligible run whose owner has not advanced it within its state's bound. The words are the
    same on every pass (the bound, not the running age): the condition is written once."""
    bound = facts.bounds.get(status.state)
    if bound is None or facts.unchanged_since is None or facts.now - facts.unchanged_since < bound:
        return None
    run = f"{name} -n {namespace}"
    state = status.state.value
    hint = {
        RunState.PENDING: "a pending run's first steps are in progress, none committed yet (a model or"
        " tool call that does not answer holds them until the endpoint's timeout), or it cannot start",
        RunState.READY: "a ready run's step is in progress: a model or tool call that does not answer"
        " holds it until the endpoint's timeout",
        RunState.RESUME_VALIDATION: "a resumed run is checked against its policy before it goes on",
        RunState.CANCEL_REQUESTED: "a cancel waits for the action in flight to be answered",
    }.get(status.state, "")
    return Stuck(
        NOT_ADVANCING,
        f"it has been {state} at stateVersion {status.state_version} for longer than its bound "
        f"({int(bound.total_seconds())}s) and its operator has not advanced it ({hint}); read the "
        f"operator's log for run {name} (the replica that holds its shard), fix what it reports or "
        f"restart that replica, and see kubectl agentrun why {run}; or cancel it: kubectl agentrun "
        f"cancel {run}",
    )


def needs_quorum(status: AgentRunStatus) -> bool:
    """Whether the run's verdict depends on how many people hold the approver verb."""
    return (
        needs_approver(status) and status.approval_request is not None and status.approval_request.quorum > 1
    )


def _quorum_short(namespace: str, spec: AgentRunSpec, status: AgentRunStatus, facts: Facts) -> Stuck | None:
    """A quorum fewer people could give than it needs: those who hold the verb, less the creator
    under four-eyes, less those who approved already, against the approvals still missing."""
    request = status.approval_request
    if not needs_quorum(status) or request is None or facts.approver_holders is None:
        return None
    approved = {vote.approver for vote in request.approved_by}
    creator = spec.created_by.username if request.four_eyes and spec.created_by is not None else None
    could = sorted(facts.approver_holders - approved - {creator})
    missing = request.quorum - len(approved)
    if len(could) >= missing:
        return None
    verb, resource = facts.approver.verb, facts.approver.resource
    so_far = f"; approved by {', '.join(sorted(approved))}" if approved else ""
    others = ", ".join(could) if could else "nobody"
    return Stuck(
        NO_APPROVER,
        f"its approval request needs {missing} more approval(s) (quorum {request.quorum}{so_far}) and "
        f"only {len(could)} other person(s) hold verb {verb!r} on {resource}.durable-agents.io in "
        f"namespace {namespace!r} ({others}"
        + ("; the creator does not count under four-eyes" if creator else "")
        + f"); bind more approvers (kubectl create rolebinding -n {namespace} --role=<approver role> "
        "--user=<approver>) or lower the policy's approvers.quorum",
    )


def _no_expiry_message(namespace: str, name: str, status: AgentRunStatus, since: datetime) -> str:
    # The same words on every pass (a start, not a running age): the condition is written once.
    run = f"{name} -n {namespace}"
    waiting_for = status.waiting_for or ""
    head = (
        f"it has waited for {waiting_for or 'an event'} since {since.isoformat()} with no expiry "
        "and no deadline"
    )
    kind, _, what = waiting_for.partition(":")
    if kind == "child":
        fix = f"see what its child run waits for: kubectl agentrun why {what} -n {namespace}"
    elif kind == "action":
        action = what.split(",")[0].strip()
        fix = (
            f"if you know whether action {action} happened: kubectl agentrun reconcile {run} "
            f"--action {action} --applied|--not-applied"
        )
    else:
        fix = f"deliver what it waits for (kubectl agentrun why {run})"
    return f"{head}; {fix}; or cancel it: kubectl agentrun cancel {run}"


def stuck_condition(conditions: Sequence[Condition]) -> Condition | None:
    return next((c for c in conditions if c.type == STUCK), None)


def is_stuck(conditions: Sequence[Condition]) -> bool:
    prior = stuck_condition(conditions)
    return prior is not None and prior.status is ConditionStatus.TRUE


def conditions_with(
    conditions: Sequence[Condition], verdict: Stuck | None, now: datetime, generation: int | None
) -> list[Condition] | None:
    """The run's conditions with ``Stuck`` brought up to date, or None when they already say so.

    Stuck: True with the reason and the fix. Not stuck: False once it was True (the cause is gone);
    a run never found stuck gets no condition at all.
    """
    prior = stuck_condition(conditions)
    if verdict is None:
        if prior is None or prior.status is not ConditionStatus.TRUE:
            return None
        wanted = Condition(
            type=STUCK,
            status=ConditionStatus.FALSE,
            reason=NOT_STUCK,
            message=f"no longer stuck (was {prior.reason})",
            last_transition_time=now,
            observed_generation=generation,
        )
    else:
        if (
            prior is not None
            and prior.status is ConditionStatus.TRUE
            and (prior.reason, prior.message) == (verdict.reason, verdict.message)
        ):
            return None
        since = (
            prior.last_transition_time if prior is not None and prior.status is ConditionStatus.TRUE else now
        )
        wanted = Condition(
            type=STUCK,
            status=ConditionStatus.TRUE,
            reason=verdict.reason,
            message=verdict.message[:32768],
            last_transition_time=since,
            observed_generation=generation,
        )
    return [*(c for c in conditions if c.type != STUCK), wanted]


# --- who holds the approver verb (from RBAC objects, as the API server returns them) ---------------

RBAC_GROUP = "rbac.authorization.k8s.io"


def _grants(rule: Mapping[str, Any], approver: ApproverRule, group: str, run: str) -> bool:
    """Whether one PolicyRule grants the approver verb on the run. The verb must be named: ``*``
    (cluster-admin and the like) is a superuser's, not a designated approver's."""
    groups, resources = rule.get("apiGroups") or [], rule.get("resources") or []
    names = rule.get("resourceNames") or []
    return (
        approver.verb in (rule.get("verbs") or [])
        and (group in groups or "*" in groups)
        and (approver.resource in resources or "*" in resources)
        and (not names or run in names)
    )


def _granting_bindings(
    approver: ApproverRule,
    namespace: str,
    run: str,
    *,
    group: str,
    roles: Sequence[Mapping[str, Any]],
    cluster_roles: Sequence[Mapping[str, Any]],
    role_bindings: Sequence[Mapping[str, Any]],
    cluster_role_bindings: Sequence[Mapping[str, Any]],
) -> list[Mapping[str, Any]]:
    """The bindings that grant the approver verb on the run: to a Role of its namespace or a
    ClusterRole that grants it (by a RoleBinding in the namespace, or, a ClusterRole, by a
    ClusterRoleBinding)."""

    def granting(items: Sequence[Mapping[str, Any]]) -> set[str]:
        return {
            str((item.get("metadata") or {}).get("name"))
            for item in items
            if any(_grants(rule, approver, group, run) for rule in item.get("rules") or [])
        }

    local = granting([r for r in roles if (r.get("metadata") or {}).get("namespace") in (None, namespace)])
    cluster = granting(cluster_roles)

    def bound(binding: Mapping[str, Any], allow_role: bool) -> bool:
        ref = binding.get("roleRef") or {}
        if ref.get("kind") == "ClusterRole":
            return ref.get("name") in cluster
        return allow_role and ref.get("kind") == "Role" and ref.get("name") in local

    in_namespace = [
        b for b in role_bindings if (b.get("metadata") or {}).get("namespace") in (None, namespace)
    ]
    return [b for b in in_namespace if bound(b, True)] + [b for b in cluster_role_bindings if bound(b, False)]


def approver_held(approver: ApproverRule, namespace: str, run: str, **rbac: Any) -> bool:
    """Whether some subject holds the approver verb on the run (:func:`_granting_bindings`, bound
    to at least one subject)."""
    return any(binding.get("subjects") for binding in _granting_bindings(approver, namespace, run, **rbac))


def approver_holders(approver: ApproverRule, namespace: str, run: str, **rbac: Any) -> frozenset[str] | None:
    """The distinct people a binding names who hold the approver verb on the run (for a quorum):
    each User by name, each ServiceAccount as the username it authenticates as. None when a Group
    holds it: who is in a group is the authenticator's to say (certificates, OIDC claims), never
    listed in the API, so the count is unknown and the run is never called stuck on a guess."""
    people: set[str] = set()
    for binding in _granting_bindings(approver, namespace, run, **rbac):
        home = (binding.get("metadata") or {}).get("namespace") or namespace
        for subject in binding.get("subjects") or []:
            kind, name = subject.get("kind"), str(subject.get("name") or "")
            if kind == "Group":
                return None
            if kind == "User":
                people.add(name)
            elif kind == "ServiceAccount":
                people.add(f"system:serviceaccount:{subject.get('namespace') or home}:{name}")
    return frozenset(people)
