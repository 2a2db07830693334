"""The admission webhook's rules of authority, and its registration with the API server.

- Identity: on create, ``spec.createdBy`` is stamped from the request's authenticated user; on
  update, every NEW approval decision gets ``approver`` and ``decidedAt`` from that user, and every
  NEW cancellation request ``requestedBy`` and ``requestedAt`` (cancellation latency starts there).
  Whatever a client wrote in those fields is overwritten (as cert-manager stamps
  CertificateRequests).
- Authority: a new decision must match the pending request (ID, digest, expiry, allowed
  decisions), honour four-eyes, and come from a user for whom a SubjectAccessReview allows the
  policy's verb (default ``approve``) on this AgentRun.

The webhook configurations are ours (not kopf-managed): failurePolicy Fail, scoped by namespace
when the operator watches one, pointing at the operator's own TLS endpoint on loopback.
"""

from __future__ import annotations

import base64
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
    ApprovalDecision,
    ApproverRule,
    Identity,
)
from durable_agents.core.approvals import check_decision
from durable_agents.shell.kube import Kube

MUTATE_PATH = "stamp-identity"
VALIDATE_PATH = "check-approvals"


def identity_of(userinfo: Mapping[str, Any]) -> Identity:
    return Identity(
        username=str(userinfo.get("username", "")),
        groups=[str(g) for g in userinfo.get("groups") or []],
        uid=userinfo.get("uid") or None,
    )


def stamps(
    operation: str, new: Mapping[str, Any], old: Mapping[str, Any] | None, user: Identity, now: datetime
) -> dict[str, Any]:
    """The spec fields to overwrite with the authenticated identity (a merge into ``spec``)."""
    spec = new.get("spec") or {}
    out: dict[str, Any] = {}
    if operation == "CREATE":
        out["createdBy"] = user.wire()
    old_approvals = ((old or {}).get("spec") or {}).get("approvals") or {}
    for request_id, decision in (spec.get("approvals") or {}).items():
        if request_id in old_approvals:
            continue
        out.setdefault("approvals", {})[request_id] = {
            **decision,
            "approver": user.wire(),
            "decidedAt": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
    old_cancels = ((old or {}).get("spec") or {}).get("cancellations") or {}
    for request_id, request in (spec.get("cancellations") or {}).items():
        if request_id in old_cancels:
            continue
        out.setdefault("cancellations", {})[request_id] = {
            **request,
            "requestedBy": user.wire(),
            "requestedAt": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
    return out


def new_decisions(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> dict[str, ApprovalDecision]:
    spec = AgentRunSpec.model_validate(new.get("spec") or {})
    before = ((old or {}).get("spec") or {}).get("approvals") or {}
    return {k: v for k, v in spec.approvals.items() if k not in before}


async def may_approve(kube: Kube, user: Identity, rule: ApproverRule, namespace: str, name: str) -> bool:
    """Ask the API server: may this user perform the approve verb on this AgentRun?"""
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user.username,
            "groups": user.groups,
            "uid": user.uid,
            "resourceAttributes": {
                "group": GROUP,
                "version": VERSION,
                "resource": rule.resource,
                "verb": rule.verb,
                "namespace": namespace,
                "name": name,
            },
        },
    }
    from kubernetes import client

    review = await kube.call(client.AuthorizationV1Api(kube.api).create_subject_access_review, body)
    return bool(review.status.allowed)


async def check_update(
    kube: Kube,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    policy: AgentPolicySpec | None,
    now: datetime | None = None,
) -> str | None:
    """Why this AgentRun update must be refused, or None."""
    now = now or datetime.now(UTC)
    decisions = new_decisions(new, old)
    if not decisions:
        return None
    status = AgentRunStatus.model_validate(((old or {}).get("status")) or {})
    spec = AgentRunSpec.model_validate(new.get("spec") or {})
    rule = policy.approvers if policy is not None else ApproverRule()
    meta = new.get("metadata") or {}
    for request_id, decision in decisions.items():
        if decision.approver is None or decision.approver.username != user.username:
            return "the approver identity must be the requesting user's (it is stamped by the webhook)"
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
        try:
            allowed = await may_approve(kube, user, rule, meta.get("namespace", ""), meta.get("name", ""))
        except ApiException as err:
            return f"could not check the approver's permission: {err.reason}"
        if not allowed:
            return (
                f"user {user.username!r} is not allowed to approve: missing RBAC permission "
                f"verb {rule.verb!r} on resource {rule.resource!r} in API group {GROUP!r} "
                f"(namespace {meta.get('namespace')!r}, name {meta.get('name')!r})"
            )
    return None


def webhook_configurations(
    *, name: str, url: str, ca_pem: bytes, namespace: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Mutating and Validating webhook configurations, failurePolicy Fail."""
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}} if namespace else {}
    rules = [
        {
            "apiGroups": [GROUP],
            "apiVersions": [VERSION],
            "resources": ["agentruns"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }
    ]

    def hook(path: str, suffix: str) -> dict[str, Any]:
        return {
            "name": f"{suffix}.agentruns.{GROUP}",
            "clientConfig": {
                "url": f"{url.rstrip('/')}/{path}",
                "caBundle": base64.b64encode(ca_pem).decode(),
            },
            "rules": rules,
            "namespaceSelector": selector,
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
            "matchPolicy": "Equivalent",
        }

    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [hook(MUTATE_PATH, "stamp")],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [hook(VALIDATE_PATH, "approve")],
    }
    return mutating, validating


async def install_webhooks(kube: Kube, mutating: dict[str, Any], validating: dict[str, Any]) -> None:
    from kubernetes import client

    api = client.AdmissionregistrationV1Api(kube.api)
    for body, create, read, replace in (
        (
            mutating,
            api.create_mutating_webhook_configuration,
            api.read_mutating_webhook_configuration,
            api.replace_mutating_webhook_configuration,
        ),
        (
            validating,
            api.create_validating_webhook_configuration,
            api.read_validating_webhook_configuration,
            api.replace_validating_webhook_configuration,
        ),
    ):
        try:
            await kube.call(create, body)
        except ApiException as err:
            if err.status != 409:
                raise
            current = await kube.call(read, body["metadata"]["name"])
            body = {
                **body,
                "metadata": {**body["metadata"], "resourceVersion": current.metadata.resource_version},
            }
            await kube.call(replace, body["metadata"]["name"], body)
