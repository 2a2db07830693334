"""The admission webhook's rules of authority for AgentRuns (its registration: :mod:`.registration`).

Each rule is a small unit (as cert-manager's admission plugins are); the webhook runs them:

- Identity and stamps (mutating): on create, ``spec.createdBy`` is the request's authenticated
  user with the operator's stamp over (namespace, name, ServiceAccount, creator); on update, every
  NEW approval decision gets ``approver``, ``decidedAt`` and a stamp, every NEW cancellation
  ``requestedBy``, ``requestedAt`` and a stamp, and a new ``retryQuarantine`` token a stamped
  ``retryQuarantineRequest`` (:mod:`durable_agents.core.authority`), every NEW reconciliation
  ``reconciler``, ``reconciledAt`` and a stamp (:mod:`.reconcile_admission`). Whatever a client
  wrote in those fields is overwritten (as cert-manager stamps CertificateRequests). The engine
  acts only on what carries a stamp that verifies, so the same fields written with the webhook off
  count for nothing.
- Append-only (validating): an answer, event, decision or cancellation once given is never
  changed or withdrawn, whatever the patch form (a merge patch with null, a JSON patch remove or
  replace, a server-side apply all arrive here as the new object); nor is ``retryQuarantine``.
- Authority (validating), each a SubjectAccessReview: creating a run needs verb ``use`` on its
  ServiceAccount (a ServiceAccount may always act as itself); answers and events need ``answer``
  on the run, cancellations ``cancel``, quarantine retries ``retry``, and a decision the policy's
  verb (default ``approve``), after matching the pending request (ID, digest, expiry, allowed
  decisions) and honouring four-eyes; a reconciliation the policy's verb too, for an ActionRecord
  of the run whose outcome is unknown.

The same webhook serves RegionFailovers (cluster-scoped; rules:
:mod:`durable_agents.shell.admission.failover`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes.client.rest import ApiException
from pydantic import BaseModel, ValidationError

from durable_agents.api.v1alpha1 import (
    GROUP,
    VERSION,
    AgentPolicySpec,
    AgentRunSpec,
    AgentRunStatus,
    ApprovalDecision,
    ApproverRule,
    CancelRequest,
    ControlRequest,
    Identity,
)
from durable_agents.core.approvals import check_decision
from durable_agents.core.authority import (
    cancellation_unproven,
    decision_unproven,
    instant,
    retry_unproven,
    service_account_unproven,
    stamp_cancellation,
    stamp_creator,
    stamp_decision,
    stamp_retry,
)
from durable_agents.core.engine.snapshot import creation_time
from durable_agents.core.sealing import Keyring
from durable_agents.shell.admission.controls import check_controls, control_stamps
from durable_agents.shell.admission.reconciliations import check_reconciliations, reconciliation_stamps
from durable_agents.shell.ground.kube import Kube, service_account_user

MUTATE_PATH = "stamp-identity"
VALIDATE_PATH = "check-approvals"
# RegionFailovers: the same webhook, its own rules (durable_agents.shell.admission.failover).
MUTATE_FAILOVER_PATH = "stamp-failover"
VALIDATE_FAILOVER_PATH = "check-failover"

# Requests to a live run, keyed by request ID: append-only.
REQUEST_MAPS = ("answers", "events", "approvals", "cancellations", "reconciliations")
# The verb each kind of request needs on the run (a decision needs its policy's verb).
REQUEST_VERBS = {"answers": "answer", "events": "answer", "cancellations": "cancel"}
RETRY_VERB = "retry"
USE_VERB = "use"
CONTROLS = ("approvals", "cancellations", "retryQuarantine", "reconciliations", "reconcileNow", "escalation")

Model = TypeVar("Model", bound=BaseModel)


def identity_of(userinfo: Mapping[str, Any]) -> Identity:
    return Identity(
        username=str(userinfo.get("username", "")),
        groups=[str(g) for g in userinfo.get("groups") or []],
        uid=userinfo.get("uid") or None,
    )


def _spec(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _entries(obj: Mapping[str, Any] | None, field: str) -> Mapping[str, Any]:
    value = _spec(obj).get(field)
    return value if isinstance(value, Mapping) else {}


def _added(new: Mapping[str, Any], old: Mapping[str, Any] | None, field: str) -> list[str]:
    before = _entries(old, field)
    return sorted(str(key) for key in _entries(new, field) if key not in before)


def _retry_token(obj: Mapping[str, Any] | None) -> Any:
    return _spec(obj).get("retryQuarantine")


def run_id_of(old: Mapping[str, Any] | None) -> str:
    """The run ID stamps are bound to: ``status.runId``, else the uid (as the engine reads it)."""
    status = (old or {}).get("status")
    run_id = status.get("runId") if isinstance(status, Mapping) else None
    return str(run_id or ((old or {}).get("metadata") or {}).get("uid") or "")


def _parsed(model: type[Model], value: Any) -> Model | None:
    """``value`` as the API type, or None (the schema will refuse it after the mutating webhook)."""
    if not isinstance(value, Mapping):
        return None
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


def _replacing(user: Identity) -> dict[str, Any]:
    """The identity as a merge into whatever the client wrote: a client's ``uid`` never survives."""
    return {**user.wire(), "uid": user.uid}


# --- mutating: identity and stamps --------------------------------------------------------------


def stamps(
    operation: str,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    now: datetime,
    keyring: Keyring,
) -> dict[str, Any]:
    """The spec fields to overwrite with the authenticated identity and the operator's stamps
    (a merge into ``spec``)."""
    spec = _spec(new)
    if operation == "CREATE":
        meta = new.get("metadata") or {}
        sa = spec.get("serviceAccountName") or "default"
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        creator = stamp_creator(keyring, namespace, name, str(sa), user, now)
        return {"createdBy": {**creator, "uid": user.uid}}
    run_id, at = run_id_of(old), instant(now)
    out: dict[str, Any] = {}
    for request_id in _added(new, old, "approvals"):
        entry = _entries(new, "approvals")[request_id]
        decided = (
            {**entry, "approver": _replacing(user), "decidedAt": at} if isinstance(entry, Mapping) else None
        )
        decision = _parsed(ApprovalDecision, decided)
        if decided is not None and decision is not None:
            stamped = stamp_decision(keyring, run_id, request_id, decision)
            out.setdefault("approvals", {})[request_id] = {**decided, "stamp": stamped}
    for request_id in _added(new, old, "cancellations"):
        entry = _entries(new, "cancellations")[request_id]
        asked = (
            {**entry, "requestedBy": _replacing(user), "requestedAt": at}
            if isinstance(entry, Mapping)
            else None
        )
        request = _parsed(CancelRequest, asked)
        if asked is not None and request is not None:
            stamped = stamp_cancellation(keyring, run_id, request_id, request)
            out.setdefault("cancellations", {})[request_id] = {**asked, "stamp": stamped}
    retry = _retry_request(new, old, user, at, keyring, run_id)
    if retry != _spec(new).get("retryQuarantineRequest"):
        out["retryQuarantineRequest"] = retry
    controls = control_stamps(new, old, user, at, keyring)  # reconcileNow, escalation
    return {**out, **reconciliation_stamps(new, old, user, at, keyring), **controls}


def _retry_request(
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    at: str,
    keyring: Keyring,
    run_id: str,
) -> Any:
    """``retryQuarantineRequest`` as it must be: stamped anew for a new token, else as it was."""
    token = _retry_token(new)
    if not isinstance(token, str) or token == _retry_token(old):
        return _spec(old).get("retryQuarantineRequest")
    asked = {"requestedBy": _replacing(user), "requestedAt": at}
    request = _parsed(ControlRequest, asked)
    assert request is not None  # made here from an authenticated identity
    return {**asked, "stamp": stamp_retry(keyring, run_id, token, request)}


# --- validating: append-only ----------------------------------------------------------------------


def rewritten(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> str | None:
    """Why this update rewrites a request already made, or None: requests are append-only.

    Entries are compared key by key and value by value, never walked: the schema bounds each map
    (at most 64 entries) and each value (a string, or a request of fixed shape).
    """
    for field in REQUEST_MAPS:
        before, after = _entries(old, field), _entries(new, field)
        for key, value in before.items():
            if key not in after:
                return f"spec.{field}[{key!r}] cannot be withdrawn: {field} are append-only"
            if after[key] != value:
                return f"spec.{field}[{key!r}] cannot be changed once given: {field} are append-only"
    token, before = _retry_token(new), _retry_token(old)
    if before is not None and token is None:
        return "spec.retryQuarantine cannot be withdrawn (set a new token to retry again)"
    if token == before and _spec(new).get("retryQuarantineRequest") != _spec(old).get(
        "retryQuarantineRequest"
    ):
        return "spec.retryQuarantineRequest is written by the operator's admission webhook only"
    return None


# --- validating: authority -------------------------------------------------------------------------


async def may(
    kube: Kube, user: Identity, *, verb: str, resource: str, namespace: str, name: str, group: str = GROUP
) -> bool:
    """Ask the API server: may this user perform ``verb`` on this object (SubjectAccessReview)?"""
    attributes = {"group": group, "resource": resource, "verb": verb, "namespace": namespace, "name": name}
    if group == GROUP:
        attributes["version"] = VERSION
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user.username,
            "groups": user.groups,
            "uid": user.uid,
            "resourceAttributes": attributes,
        },
    }
    from kubernetes import client

    review = await kube.call(client.AuthorizationV1Api(kube.api).create_subject_access_review, body)
    return bool(review.status.allowed)


def denied(user: Identity, verb: str, resource: str, namespace: str, name: str, group: str = GROUP) -> str:
    """A refusal that names the missing verb."""
    return (
        f"user {user.username!r} may not {verb} {resource}/{name} in namespace {namespace!r}: needs verb "
        f"{verb!r} (missing RBAC permission verb {verb!r} on resource {resource!r} in API group "
        f"{group or 'core'!r})"
    )


async def refused_verb(
    kube: Kube, user: Identity, verb: str, resource: str, namespace: str, name: str, group: str = GROUP
) -> str | None:
    """Why ``user`` may not ``verb`` the object (a SubjectAccessReview), or None when they may."""
    try:
        allowed = await may(
            kube, user, verb=verb, resource=resource, namespace=namespace, name=name, group=group
        )
    except ApiException as err:
        return f"could not check whether {user.username!r} may {verb} {resource}/{name}: {err.reason}"
    return None if allowed else denied(user, verb, resource, namespace, name, group)


async def check_create(kube: Kube, new: Mapping[str, Any], user: Identity, keyring: Keyring) -> str | None:
    """Why this new AgentRun must be refused, or None: its creator must be allowed to ``use`` its
    ServiceAccount (the run acts as it), and it carries no request yet."""
    spec = _spec(new)
    present = [field for field in CONTROLS if spec.get(field)]
    if present:
        return (
            f"a new run cannot carry spec.{present[0]}: decisions, cancellations and retries are made "
            "on an existing run (they are bound to its ID)"
        )
    meta = new.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    sa = str(spec.get("serviceAccountName") or "default")
    if user.username != service_account_user(namespace, sa):  # a ServiceAccount may act as itself
        refused = await refused_verb(kube, user, USE_VERB, "serviceaccounts", namespace, sa, group="")
        if refused is not None:
            return f"{refused}: an AgentRun acts as its ServiceAccount"
    # The API server has set creationTimestamp by now (validating admission follows it); a
    # client never can. Without it (an API server that did not), the time is now.
    created = creation_time(meta) or datetime.now(UTC)
    spec_ = AgentRunSpec.model_validate(spec)
    problem = service_account_unproven(keyring, namespace, name, spec_, created)
    if problem is not None:
        return (
            f"spec.createdBy is not the admission webhook's stamp for this run ({problem.message}); "
            "name the run (with generateName its name is not known when it is stamped)"
        )
    return None


async def check_update(
    kube: Kube,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    policy: AgentPolicySpec | None,
    keyring: Keyring,
    now: datetime | None = None,
) -> str | None:
    """Why this AgentRun update must be refused, or None."""
    problem = rewritten(new, old)
    if problem is not None:
        return problem
    meta = new.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    for verb, fields in verbs_needed(new, old).items():
        refused = await refused_verb(kube, user, verb, "agentruns", namespace, name)
        if refused is not None:
            return f"{refused} ({', '.join(fields)})"
    problem = _unstamped_controls(new, old, user, keyring)
    if problem is not None:
        return problem
    problem = await _check_decisions(kube, new, old, user, policy, keyring, now or datetime.now(UTC))
    if problem is not None:
        return problem
    problem = await check_controls(kube, new, old, user, keyring, refused_verb)
    if problem is not None:
        return problem
    return await check_reconciliations(kube, new, old, user, policy, keyring, refused_verb)


def verbs_needed(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """The verb each new request needs (decisions aside: they need the policy's), and for what."""
    verbs: dict[str, list[str]] = {}
    for field, verb in REQUEST_VERBS.items():
        for key in _added(new, old, field):
            verbs.setdefault(verb, []).append(f"spec.{field}[{key!r}]")
    token = _retry_token(new)
    if token is not None and token != _retry_token(old):
        verbs.setdefault(RETRY_VERB, []).append(f"spec.retryQuarantine {token!r}")
    return verbs


_NOT_STAMPED = "is not stamped by the admission webhook"


def _unstamped_controls(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, user: Identity, keyring: Keyring
) -> str | None:
    """A new cancellation or retry must carry this user's identity and the webhook's stamp."""
    run_id = run_id_of(old)
    for request_id in _added(new, old, "cancellations"):
        request = CancelRequest.model_validate(_entries(new, "cancellations")[request_id])
        by = request.requested_by
        problem = cancellation_unproven(keyring, run_id, request_id, request)
        if by is None or by.username != user.username or problem is not None:
            return f"spec.cancellations[{request_id!r}] {_NOT_STAMPED} for {user.username!r}"
    token = _retry_token(new)
    if isinstance(token, str) and token != _retry_token(old):
        spec = AgentRunSpec.model_validate(_spec(new))
        asked = spec.retry_quarantine_request
        problem = retry_unproven(keyring, run_id, token, asked)
        if (
            asked is None
            or asked.requested_by is None
            or asked.requested_by.username != user.username
            or problem
        ):
            return f"spec.retryQuarantine {token!r} {_NOT_STAMPED} for {user.username!r}"
    return None


async def _check_decisions(
    kube: Kube,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    policy: AgentPolicySpec | None,
    keyring: Keyring,
    now: datetime,
) -> str | None:
    """Each new decision: the webhook's stamp, the pending request's rules, then the policy's verb."""
    added = _added(new, old, "approvals")
    if not added:
        return None
    status = AgentRunStatus.model_validate(((old or {}).get("status")) or {})
    spec = AgentRunSpec.model_validate(_spec(new))
    rule = policy.approvers if policy is not None else ApproverRule()
    meta = new.get("metadata") or {}
    run_id = run_id_of(old)
    for request_id in added:
        decision = spec.approvals[request_id]
        if decision.approver is None or decision.approver.username != user.username:
            return "the approver identity must be the requesting user's (it is stamped by the webhook)"
        if decision_unproven(keyring, run_id, request_id, decision) is not None:
            return f"spec.approvals[{request_id!r}] is not stamped by the admission webhook"
        reason = check_decision(
            request=status.approval_request,
            request_id=request_id,
            decision=decision,
            now=now,
            user=user,
            creator=spec.created_by,
            four_eyes=rule.four_eyes,
        )
        if reason is not None:
            return reason
        refused = await refused_verb(
            kube, user, rule.verb, rule.resource, meta.get("namespace", ""), meta.get("name", "")
        )
        if refused is not None:
            return refused
    return None
