"""Which policy governs a run (core/policy_resolution.py): a pure function of (the namespace's
policies, the cluster's policies, the namespace, the run's policyRef), checked against a model of
the rules on generated cases; the creation stamp covers the policy reference; why names the fix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from durable_agents.api.v1alpha1 import AgentPolicySpec, AgentRunSpec, Identity, PolicyKind, PolicyReference
from durable_agents.core.authority import service_account_proof, service_account_unproven, stamp_creator
from durable_agents.core.policy_resolution import (
    POLICY_AMBIGUOUS,
    POLICY_MANDATORY,
    Blocked,
    Resolved,
    Ungoverned,
    resolve_policy,
)
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp
from durable_agents.kubectl import why as kubectl_why

NAMES = st.sampled_from(["a", "b", "c", "strict", "permissive"])


@st.composite
def policy(draw: st.DrawFn, cluster: bool = False) -> AgentPolicySpec:
    default = draw(st.booleans())
    mandatory = (not cluster) and default and draw(st.booleans())
    return AgentPolicySpec(version=draw(st.sampled_from(["1", "2"])), default=default, mandatory=mandatory)


REFS = st.none() | st.builds(PolicyReference, kind=st.none() | st.sampled_from(list(PolicyKind)), name=NAMES)


def expected(
    namespace: str,
    ref: PolicyReference | None,
    local: dict[str, AgentPolicySpec],
    cluster: dict[str, AgentPolicySpec],
) -> tuple[str, str | None, str | None]:
    """The rules as the docs state them: (outcome, kind, name) or (blocked, reason, None)."""
    defaults = sorted(n for n, p in local.items() if p.default)
    mandatory = [n for n in defaults if local[n].mandatory]
    if ref is not None:
        if mandatory and not (
            len(mandatory) == 1 and ref.policy_kind is PolicyKind.AGENT_POLICY and ref.name == mandatory[0]
        ):
            return ("blocked", POLICY_MANDATORY, None)
        return ("resolved", ref.policy_kind.value, ref.name)
    if len(defaults) == 1:
        return ("resolved", "AgentPolicy", defaults[0])
    if defaults:
        return ("blocked", POLICY_AMBIGUOUS, None)
    baseline = sorted(n for n, p in cluster.items() if p.default)
    if len(baseline) == 1:
        return ("resolved", "ClusterAgentPolicy", baseline[0])
    if baseline:
        return ("blocked", POLICY_AMBIGUOUS, None)
    return ("ungoverned", None, None)


@given(
    namespace=st.sampled_from(["team-a", "team-b"]),
    ref=REFS,
    local=st.dictionaries(NAMES, policy(), max_size=4),
    cluster=st.dictionaries(NAMES, policy(cluster=True), max_size=3),
)
def test_resolution_follows_the_rules(
    namespace: str,
    ref: PolicyReference | None,
    local: dict[str, AgentPolicySpec],
    cluster: dict[str, AgentPolicySpec],
) -> None:
    found = resolve_policy(namespace, ref, local, cluster)
    assert found == resolve_policy(namespace, ref, dict(local), dict(cluster))  # pure: same in, same out
    outcome, kind, name = expected(namespace, ref, local, cluster)
    if outcome == "resolved":
        assert isinstance(found, Resolved)
        assert (found.kind, found.name) == (kind, name)
        assert found.namespace == ("" if kind == "ClusterAgentPolicy" else namespace)
    elif outcome == "blocked":
        assert isinstance(found, Blocked)
        assert found.reason == kind
    else:
        assert isinstance(found, Ungoverned)
        assert "may only read" in found.message


def test_a_namespace_default_wins_over_the_cluster_baseline_and_a_named_policy_over_both() -> None:
    local = {"team": AgentPolicySpec(version="1", default=True), "other": AgentPolicySpec(version="1")}
    cluster = {"baseline": AgentPolicySpec(version="1", default=True)}
    assert resolve_policy("ns", None, local, cluster) == Resolved(
        "AgentPolicy", "team", "ns", "namespace-default"
    )
    assert resolve_policy("ns", None, {}, cluster) == Resolved(
        "ClusterAgentPolicy", "baseline", "", "cluster-default"
    )
    named = PolicyReference(name="other")
    assert resolve_policy("ns", named, local, cluster) == Resolved("AgentPolicy", "other", "ns", "named")


def test_a_mandatory_default_leaves_no_choice_but_itself() -> None:
    local = {
        "team": AgentPolicySpec(version="1", default=True, mandatory=True),
        "lax": AgentPolicySpec(version="1"),
    }
    found = resolve_policy("ns", PolicyReference(name="lax"), local, {})
    assert isinstance(found, Blocked)
    assert found.reason == POLICY_MANDATORY
    assert "'team'" in found.message
    cluster_ref = PolicyReference(kind=PolicyKind.CLUSTER_AGENT_POLICY, name="team")
    assert isinstance(resolve_policy("ns", cluster_ref, local, {}), Blocked)
    assert isinstance(resolve_policy("ns", PolicyReference(name="team"), local, {}), Resolved)


KEYS = Keyring(keys={"k1": bytes(range(32))}, active_key_id="k1")
ALICE = Identity(username="alice", groups=["devs"], uid="u-1")
WHEN = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)


def _spec(ref: PolicyReference | None, created_by: dict[str, object]) -> AgentRunSpec:
    body: dict[str, object] = {
        "taskType": "t",
        "objective": "o",
        "serviceAccountName": "deployer",
        "steps": [{"name": "done", "finish": {}}],
        "createdBy": created_by,
    }
    if ref is not None:
        body["policyRef"] = ref.wire()
    return AgentRunSpec.model_validate(body)


def test_the_creation_stamp_covers_the_policy_reference() -> None:
    strict = PolicyReference(name="strict")
    created = stamp_creator(KEYS, "team-a", "run-1", "deployer", ALICE, WHEN, strict)
    assert service_account_unproven(KEYS, "team-a", "run-1", _spec(strict, created), WHEN) is None
    # The same stamp copied into a run of that name that names another policy, or none: refused.
    for other in (
        PolicyReference(name="permissive"),
        None,
        PolicyReference(kind=PolicyKind.CLUSTER_AGENT_POLICY, name="strict"),
    ):
        problem = service_account_unproven(KEYS, "team-a", "run-1", _spec(other, created), WHEN)
        assert problem is not None, other
        assert problem.reason == "StampInvalid", other
    # A run that names none is stamped as before this release (old stamps keep verifying).
    plain = stamp_creator(KEYS, "team-a", "run-1", "deployer", ALICE, WHEN)
    assert "policyRef" not in service_account_proof("team-a", "run-1", "deployer", ALICE, WHEN)
    assert service_account_unproven(KEYS, "team-a", "run-1", _spec(None, plain), WHEN) is None
    problem = service_account_unproven(KEYS, "team-a", "run-1", _spec(strict, plain), WHEN)
    assert problem is not None  # a no-policy stamp does not let a copy name a policy


def test_a_stamp_from_before_policy_references_counts_only_on_a_run_older_than_the_operator() -> None:
    legacy = service_account_proof("team-a", "run-1", "deployer", ALICE, WHEN)  # no policyRef
    created = {**ALICE.who().wire(), "stampedAt": "2026-12-03T10:00:00.000000Z"}
    created["stamp"] = stamp(KEYS, Purpose.SERVICE_ACCOUNT, legacy)
    spec = _spec(PolicyReference(name="strict"), created)
    started = WHEN + timedelta(minutes=5)
    assert service_account_unproven(KEYS, "team-a", "run-1", spec, WHEN, started) is None  # waited across
    since = service_account_unproven(KEYS, "team-a", "run-1", spec, WHEN, WHEN - timedelta(seconds=1))
    assert since is not None
    assert since.reason == "StampInvalid"
    assert service_account_unproven(KEYS, "team-a", "run-1", spec, WHEN, None) is not None


def test_why_names_the_fix_for_a_run_no_policy_governed() -> None:
    run = {
        "metadata": {"name": "r1", "namespace": "ns"},
        "spec": {"taskType": "t", "objective": "o", "steps": []},
        "status": {"state": "failed", "outcome": {"reason": "PolicyRequired", "message": "no policy"}},
    }
    answer = kubectl_why.explain(run)
    words = " ".join(way["what"] for way in answer["wakeBy"])
    assert "spec.default: true" in words
    assert "spec.policyRef" in words
    assert "verb use" in words
    assert "kubectl get agentpolicies -n ns" in kubectl_why.text(answer)
    blocked = {**run, "status": {"state": "pending", "waitingFor": f"agentpolicy:{POLICY_AMBIGUOUS}"}}
    assert "one default left" in kubectl_why.explain(blocked)["wakeBy"][0]["what"]
