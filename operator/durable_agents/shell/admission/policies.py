"""The admission webhook's rules for AgentPolicies (served by the same webhook as AgentRuns).

One review of an AgentPolicy create, update or delete answers two things: whether it is refused
(and why, naming the field), and the warnings it carries back to the client. A refusal comes from
the policy's integrity and its use by live runs; the warnings from the preview of what the new
version would do to the runs waiting under the current one (``kubectl apply --dry-run=server``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from durable_agents.api.v1alpha1 import GROUP, VERSION, Identity
from durable_agents.core.sealing import Keyring
from durable_agents.shell.admission.destinations import policy_entry_refusal, policy_notification_refusal
from durable_agents.shell.admission.policy_integrity import check_integrity
from durable_agents.shell.admission.policy_preview import PolicyPreviewer, preview_warnings, previewer_for
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.intake.policies import PolicyCache

POLICY_PATH: Final = "check-policy"
"""The webhook path for AgentPolicies (validating; CREATE, UPDATE, DELETE)."""
POLICY_STAMP_PATH: Final = "stamp-policy"
"""The webhook path that stamps an AgentPolicy's force-delete mark (mutating; UPDATE)."""
CLUSTER_POLICY_PATH: Final = "check-cluster-policy"
"""The webhook path for ClusterAgentPolicies (validating; CREATE, UPDATE)."""
CLUSTER_POLICY_PLURAL: Final = "clusteragentpolicies"


@dataclass(frozen=True)
class PolicyReview:
    """One admission review of an AgentPolicy: ``new`` is None on DELETE, ``old`` on CREATE."""

    operation: str
    new: Mapping[str, Any] | None
    old: Mapping[str, Any] | None
    user: Identity
    dry_run: bool


@dataclass
class PolicyVerdict:
    refused: str | None = None
    warnings: list[str] = field(default_factory=list)


async def check_policy(
    kube: Kube,
    review: PolicyReview,
    policies: PolicyCache,
    keyring: Keyring,
    previewer: PolicyPreviewer | None = None,
) -> PolicyVerdict:
    """Whether this AgentPolicy change is refused, and the warnings it carries back."""
    refused = (
        await second_default(kube, review)
        or policy_entry_refusal(review.new)
        or policy_notification_refusal(review.new)
    )
    if (review.new or review.old or {}).get("kind") == "ClusterAgentPolicy":
        return PolicyVerdict(refused=refused)  # integrity and the preview: namespaced policies only
    refused = refused or await check_integrity(
        kube, review.operation, review.new, review.old, review.user, policies, keyring
    )
    if refused is not None:
        return PolicyVerdict(refused=refused)
    verdict = PolicyVerdict()
    # What the new version does to the runs under the policy now: on a dry run and a real apply.
    previewer = previewer or previewer_for(kube, keyring)
    verdict.warnings += await preview_warnings(previewer, review.operation, review.old, review.new)
    return verdict


async def second_default(kube: Kube, review: PolicyReview) -> str | None:
    """Why this policy may not be its scope's default: another one already is (at most one
    default per namespace, and one ClusterAgentPolicy baseline). None when it may, or is none."""
    new = review.new
    if new is None or review.operation not in ("CREATE", "UPDATE"):
        return None
    if (new.get("spec") or {}).get("default") is not True:
        return None
    meta = new.get("metadata") or {}
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    cluster = new.get("kind") == "ClusterAgentPolicy"
    if cluster:
        listed = await kube.call(
            kube.custom.list_cluster_custom_object, GROUP, VERSION, CLUSTER_POLICY_PLURAL
        )
    else:
        listed = await kube.call(
            kube.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "agentpolicies"
        )
    others = sorted(
        str((item.get("metadata") or {}).get("name"))
        for item in listed.get("items") or []
        if (item.get("spec") or {}).get("default") is True
        and (item.get("metadata") or {}).get("name") != name
    )
    if not others:
        return None
    scope = "the cluster" if cluster else f"namespace {namespace!r}"
    kind = "ClusterAgentPolicy" if cluster else "AgentPolicy"
    return (
        f"spec.default: {scope} already has a default {kind} ({', '.join(repr(o) for o in others)}); "
        "at most one default per scope: unset spec.default there first"
    )
