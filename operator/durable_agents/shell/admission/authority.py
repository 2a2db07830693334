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
  decisions) and honouring four-eyes; under a quorum, a decision under ``<request ID>.<k>`` is
  checked against the request it names, each person decides a request once, and none is taken
  once it is decided (rejected, or its quorum reached); a reconciliation the policy's verb too,
  for an ActionRecord of the run whose outcome is unknown.

The same webhook serves RegionFailovers (cluster-scoped; rules:
:mod:`durable_agents.shell.admission.failover`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import (
    GROUP,
    VERSION,
    AgentPolicySpec,
    AgentRunSpec,
    AgentRunStatus,
    ApproverRule,
    Identity,
    PolicyKind,
)
from durable_agents.core.approvals import check_decision
from durable_agents.core.authority import (
    decision_unproven,
    service_account_unproven,
)
from durable_agents.core.engine.snapshot import creation_time
from durable_agents.core.policy_resolution import POLICY_MANDATORY, Blocked, resolve_policy
from durable_agents.core.request_stamps import (
    added_requests,
    rewritten,
    run_id_of,
    spec_of,
    unstamped_controls,
    verbs_needed,
)
from durable_agents.core.schedule_authority import vouched_creator
from durable_agents.core.sealing import Keyring
from durable_agents.shell.admission.controls import check_controls
from durable_agents.shell.admission.reconciliations import check_reconciliations
from durable_agents.shell.ground.kube import Kube, service_account_user

MUTATE_PATH = "stamp-identity"
VALIDATE_PATH = "check-approvals"
# RegionFailovers: the same webhook, its own rules (durable_agents.shell.admission.failover).
MUTATE_FAILOVER_PATH = "stamp-failover"
VALIDATE_FAILOVER_PATH = "check-failover"

USE_VERB = "use"
CONTROLS = ("approvals", "cancellations", "retryQuarantine", "reconciliations", "reconcileNow", "escalation")


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
    review = await kube.call(kube.create_subject_access_review, body)
    return (review.get("status") or {}).get("allowed") is True


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


async def _namespace_policies(kube: Kube, namespace: str) -> dict[str, AgentPolicySpec]:
    """The namespace's AgentPolicies as the API server has them now (invalid ones left out)."""
    listed = await kube.call(kube.list_namespaced_objects, GROUP, VERSION, namespace, "agentpolicies")
    out: dict[str, AgentPolicySpec] = {}
    for item in listed.get("items") or []:
        try:
            out[str(item["metadata"]["name"])] = AgentPolicySpec.model_validate(item.get("spec") or {})
        except (KeyError, ValueError):
            continue
    return out


async def _inherited(kube: Kube, spec: AgentRunSpec, namespace: str, user: Identity) -> bool:
    """Whether this is a child run, created as its ServiceAccount (the operator, impersonating it),
    naming its parent's policy: that choice was made, and checked, when the parent was created."""
    ref, parent = spec.policy_ref, spec.parent_ref
    if (
        ref is None
        or parent is None
        or user.username != service_account_user(namespace, spec.service_account_name)
    ):
        return False
    try:
        body = await kube.call(
            kube.get_namespaced_object, GROUP, VERSION, namespace, "agentruns", parent.name
        )
    except ApiException:
        return False
    try:
        theirs = AgentRunSpec.model_validate(body.get("spec") or {}).policy_ref
    except ValueError:
        return False
    return theirs is not None and (theirs.policy_kind, theirs.name) == (ref.policy_kind, ref.name)


async def check_policy_choice(kube: Kube, spec: AgentRunSpec, namespace: str, user: Identity) -> str | None:
    """Why this new run may not name its policy, or None. Naming one (``spec.policyRef``) is an
    authority like choosing a ServiceAccount: verb ``use`` on it; a namespace's mandatory default
    leaves no choice. The default (no policyRef) needs no verb."""
    ref = spec.policy_ref
    if ref is None:
        return None
    found = resolve_policy(namespace, ref, await _namespace_policies(kube, namespace), {})
    if isinstance(found, Blocked) and found.reason == POLICY_MANDATORY:
        return f"spec.policyRef: {found.message}"
    if await _inherited(kube, spec, namespace, user):
        return None
    cluster = ref.policy_kind is PolicyKind.CLUSTER_AGENT_POLICY
    resource = "clusteragentpolicies" if cluster else "agentpolicies"
    refused = await refused_verb(kube, user, USE_VERB, resource, "" if cluster else namespace, ref.name)
    if refused is not None:
        return f"spec.policyRef: {refused}: naming a policy is choosing the rules the run acts under"
    return None


async def check_create(
    kube: Kube,
    new: Mapping[str, Any],
    user: Identity,
    keyring: Keyring,
) -> str | None:
    """Why this new AgentRun must be refused, or None: its creator must be allowed to ``use`` its
    ServiceAccount (the run acts as it) and the policy it names (:func:`check_policy_choice`),
    and it carries no request yet."""
    spec = spec_of(new)
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
    spec_ = AgentRunSpec.model_validate(spec)
    # The API server has set creationTimestamp by now (validating admission follows it); a
    # client never can. Without it (an API server that did not), the time is now.
    created = creation_time(meta) or datetime.now(UTC)
    # A schedule's run: the operator asked whether its creator may use the policy.
    if not vouched_creator(new, user, keyring, created):
        refused_policy = await check_policy_choice(kube, spec_, namespace, user)
        if refused_policy is not None:
            return refused_policy
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
    problem = unstamped_controls(new, old, user, keyring)
    if problem is not None:
        return problem
    problem = await _check_decisions(kube, new, old, user, policy, keyring, now or datetime.now(UTC))
    if problem is not None:
        return problem
    problem = await check_controls(kube, new, old, user, keyring, refused_verb)
    if problem is not None:
        return problem
    return await check_reconciliations(kube, new, old, user, policy, keyring, refused_verb)


async def _check_decisions(
    kube: Kube,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    policy: AgentPolicySpec | None,
    keyring: Keyring,
    now: datetime,
) -> str | None:
    """Each new decision: the webhook's stamp, the pending request's rules (with the decisions
    already given: each person once, none after the request is decided), then the policy's verb."""
    added = added_requests(new, old, "approvals")
    if not added:
        return None
    status = AgentRunStatus.model_validate(((old or {}).get("status")) or {})
    spec = AgentRunSpec.model_validate(spec_of(new))
    rule = policy.approvers if policy is not None else ApproverRule()
    request = status.approval_request
    meta = new.get("metadata") or {}
    run_id = run_id_of(old)
    # What was decided before (only what the webhook stamped counts), and what this update adds,
    # one key after the other: two keys by one person in one patch are refused as two patches are.
    decided = {
        key: decision
        for key, decision in spec.approvals.items()
        if key not in added and decision_unproven(keyring, run_id, key, decision) is None
    }
    for key in added:
        decision = spec.approvals[key]
        if decision.approver is None or decision.approver.username != user.username:
            return "the approver identity must be the requesting user's (it is stamped by the webhook)"
        if decision_unproven(keyring, run_id, key, decision) is not None:
            return f"spec.approvals[{key!r}] is not stamped by the admission webhook"
        reason = check_decision(
            request=request,
            request_id=key,
            decision=decision,
            now=now,
            user=user,
            creator=spec.created_by,
            four_eyes=rule.four_eyes or (request is not None and request.four_eyes),
            decided=decided,
        )
        if reason is not None:
            return reason
        refused = await refused_verb(
            kube, user, rule.verb, rule.resource, meta.get("namespace", ""), meta.get("name", "")
        )
        if refused is not None:
            return refused
        decided[key] = decision
    return None
