"""Which policy governs a run: a pure function of the policies, the run's namespace and its
``spec.policyRef``.

1. The run names one (``spec.policyRef``: an AgentPolicy of its namespace or a
   ClusterAgentPolicy): that one, unless its namespace's default is mandatory and it is another.
2. Else its namespace's default AgentPolicy (``spec.default: true``).
3. Else the cluster's default ClusterAgentPolicy (the baseline).
4. Else none: the run may only read; every other action is refused (``PolicyRequired``).

Two defaults in one scope govern nothing (admission refuses the second; this is the second line):
the runs that would rely on them wait (:class:`Blocked`), as does a run naming another policy
than its namespace's mandatory default. Whether the resolved policy exists is not this module's
question: the run waits for it like for any policy it names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from durable_agents.api.v1alpha1 import AgentPolicySpec, PolicyKind, PolicyReference

AGENT_POLICY: Final = PolicyKind.AGENT_POLICY.value
CLUSTER_AGENT_POLICY: Final = PolicyKind.CLUSTER_AGENT_POLICY.value
POLICY_REQUIRED: Final = "PolicyRequired"
POLICY_AMBIGUOUS: Final = "PolicyDefaultAmbiguous"
POLICY_MANDATORY: Final = "PolicyMandatory"


@dataclass(frozen=True)
class Resolved:
    """The policy that governs the run, and how it was chosen."""

    kind: str
    name: str
    namespace: str
    """The run's namespace for an AgentPolicy, "" for a ClusterAgentPolicy (its cache key)."""
    chosen: str
    """named, namespace-default or cluster-default."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def describe(self) -> str:
        return f"{self.kind} {self.name!r}"


@dataclass(frozen=True)
class Ungoverned:
    """No policy resolves: read-only work only."""

    message: str


@dataclass(frozen=True)
class Blocked:
    """The policies of the run's scope contradict each other (or the run's choice): nothing acts."""

    reason: str
    message: str


Resolution = Resolved | Ungoverned | Blocked


def _defaults(policies: Mapping[str, AgentPolicySpec]) -> list[str]:
    return sorted(name for name, spec in policies.items() if spec.default)


def resolve_policy(
    namespace: str,
    ref: PolicyReference | None,
    policies: Mapping[str, AgentPolicySpec],
    cluster_policies: Mapping[str, AgentPolicySpec],
) -> Resolution:
    """The policy of a run in ``namespace`` naming ``ref``, given its namespace's AgentPolicies
    (``policies``, by name) and the ClusterAgentPolicies (by name)."""
    local = _defaults(policies)
    mandatory = [name for name in local if policies[name].mandatory]
    if ref is not None:
        named_local = ref.policy_kind is PolicyKind.AGENT_POLICY
        if mandatory and not (len(mandatory) == 1 and named_local and ref.name == mandatory[0]):
            return Blocked(
                POLICY_MANDATORY,
                f"namespace {namespace!r} has a mandatory default AgentPolicy "
                f"{', '.join(repr(n) for n in mandatory)}: its runs may not name {ref.policy_kind.value} "
                f"{ref.name!r}; create the run without spec.policyRef",
            )
        if named_local:
            return Resolved(AGENT_POLICY, ref.name, namespace, "named")
        return Resolved(CLUSTER_AGENT_POLICY, ref.name, "", "named")
    if len(local) == 1:
        return Resolved(AGENT_POLICY, local[0], namespace, "namespace-default")
    if len(local) > 1:
        return Blocked(
            POLICY_AMBIGUOUS,
            f"namespace {namespace!r} has {len(local)} default AgentPolicies "
            f"({', '.join(repr(n) for n in local)}): none governs; keep spec.default on one",
        )
    baseline = _defaults(cluster_policies)
    if len(baseline) == 1:
        return Resolved(CLUSTER_AGENT_POLICY, baseline[0], "", "cluster-default")
    if len(baseline) > 1:
        return Blocked(
            POLICY_AMBIGUOUS,
            f"the cluster has {len(baseline)} default ClusterAgentPolicies "
            f"({', '.join(repr(n) for n in baseline)}): none governs; keep spec.default on one",
        )
    return Ungoverned(
        f"no policy governs this run: it names none (spec.policyRef), namespace {namespace!r} has "
        "no default AgentPolicy and the cluster no default ClusterAgentPolicy; it may only read"
    )


def policy_required_message(effect: str, tier: str) -> str:
    """Why an ungoverned run's action is refused, naming the fix."""
    return (
        f"{effect} is a {tier} action and no policy governs this run: name one in spec.policyRef "
        "(verb use on it), or have the namespace's default AgentPolicy (spec.default: true) or the "
        "cluster's default ClusterAgentPolicy govern it, then create the run again; nothing was sent"
    )
