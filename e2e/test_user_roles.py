"""The user roles the chart ships (charts/durable-agents/files/user-roles.yaml) allow exactly their
actions: each ClusterRole, bound with ONE RoleBinding, is asked about every action of MATRIX with a
SubjectAccessReview; the built-in view, edit and admin pick up viewer and editor by aggregation;
real requests as each user agree; a namespace admin cannot grant the separate duties.

MATRIX is the table of docs/security/roles.md (moved there from the README): ``python
e2e/test_user_roles.py`` prints it, and test_the_readme_table_is_the_matrix fails when the two
differ. The custom verbs (answer, approve, ...) are enforced by the operator's admission webhook;
here they are checked as RBAC grants them.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.agentpolicy import ApproverRule
from durable_agents.core.controls import VERBS as CONTROL_VERBS
from durable_agents.core.policy_integrity import FORCE_DELETE_VERB
from durable_agents.core.request_stamps import REQUEST_VERBS, RETRY_VERB
from durable_agents.shell.admission.authority import USE_VERB
from durable_agents.shell.admission.definitions import PLURALS as DEFINITION_PLURALS
from durable_agents.shell.admission.failover import FAILOVER_VERB, REGIONS
from durable_agents.shell.runs.reveal_question import ANSWER_VERB
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.rbac import bind, grant_cluster

REPO = Path(__file__).resolve().parents[1]
USER_ROLES = REPO / "charts/durable-agents/files/user-roles.yaml"
ROLES_PAGE = REPO / "docs/security/roles.md"
CHART = "durable-agents"


@dataclass(frozen=True)
class Action:
    """One request a person might make: a verb on a resource (or subresource) in a namespace."""

    verb: str
    resource: str
    group: str = GROUP
    subresource: str = ""

    @property
    def path(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    @property
    def label(self) -> str:
        return f"`{self.verb}` {self.path}"


RUN_VERBS = (
    *("get", "list", "watch", "create", "update", "patch", "delete"),
    *("answer", "cancel", "approve", "retry", "reconcile", "escalate"),
)
ACTIONS: tuple[Action, ...] = (
    *(Action(verb, "agentruns") for verb in RUN_VERBS),
    Action("update", "agentruns", subresource="status"),
    Action("patch", "agentruns", subresource="status"),
    *(Action(verb, "actionrecords") for verb in ("get", "create", "update", "delete")),
    *(Action(verb, "agentrunrecords") for verb in ("get", "create", "delete")),
    *(Action(verb, "agentpolicies") for verb in ("get", "create", "update", "delete", "force-delete", "use")),
    Action("use", "serviceaccounts", group=""),
    Action("get", "secrets", group=""),
    Action("get", "configmaps", group=""),
)


def on(path: str, *verbs: str) -> frozenset[Action]:
    found = frozenset(a for a in ACTIONS if a.path == path and a.verb in verbs)
    assert len(found) == len(verbs), f"not in ACTIONS: {verbs} on {path}"  # no silent typo
    return found


READS = (
    on("agentruns", "get", "list", "watch")
    | on("actionrecords", "get")
    | on("agentrunrecords", "get")
    | on("agentpolicies", "get")
)
EDITS = on("agentruns", "create", "update", "patch", "delete", "answer", "cancel") | on(
    "serviceaccounts", "use"
)
# The chart's roles, then the built-in ClusterRoles they aggregate into: what each allows.
# Everything else in ACTIONS is refused.
CHART_ROLES = ("viewer", "editor", "approver", "responder", "on-call", "policy-user", "policy-author")
BUILT_IN_ROLES = ("view", "edit", "admin")
MATRIX: dict[str, frozenset[Action]] = {
    "viewer": READS,
    "editor": READS | EDITS,
    "approver": READS | on("agentruns", "patch", "approve"),
    # Reads runs (no ledger, no policies) and answers their questions; the webhook reveals to it
    # the question a run waits on and nothing else (e2e/test_responder.py).
    "responder": on("agentruns", "get", "list", "watch", "patch", "answer"),
    "on-call": READS
    | on("agentruns", "patch", "retry", "reconcile", "escalate")
    | on("agentpolicies", "force-delete"),
    "policy-user": on("agentpolicies", "use"),
    "policy-author": on("agentpolicies", "get", "create", "update", "delete"),
    "view": READS | on("configmaps", "get"),
    "edit": READS | EDITS | on("configmaps", "get") | on("secrets", "get"),
    "admin": READS | EDITS | on("configmaps", "get") | on("secrets", "get"),
}
assert tuple(MATRIX) == (*CHART_ROLES, *BUILT_IN_ROLES)


def readme_table() -> str:
    """The roles page's table: one row per action, one column per role."""
    heads = [f"`{r}`" for r in CHART_ROLES] + [f"`{r}` (built-in)" for r in BUILT_IN_ROLES]
    lines = ["| action | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for action in ACTIONS:
        cells = [
            "allowed" if action in MATRIX[role] else "refused" for role in (*CHART_ROLES, *BUILT_IN_ROLES)
        ]
        lines.append(f"| {action.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def user(role: str) -> str:
    return f"user-{role}"


def chart_cluster_roles(fullname: str) -> list[dict[str, Any]]:
    """The ClusterRoles templates/user-roles.yaml renders, built from the same file."""
    roles: dict[str, Any] = yaml.safe_load(USER_ROLES.read_text())["roles"]
    return [
        {
            "metadata": {
                "name": f"{fullname}-{key}",
                "labels": {
                    f"rbac.authorization.k8s.io/aggregate-to-{b}": "true" for b in role["aggregateTo"]
                },
            },
            "rules": role["rules"],
        }
        for key, role in roles.items()
    ]


@pytest.fixture
def role_names(kube: KubeEnv, namespace: str) -> Iterator[dict[str, str]]:
    """Role (chart or built-in) -> the ClusterRole to bind. The chart's are made as a release named
    like the namespace would make them, and deleted afterwards (the built-ins then lose their rules)."""
    fullname = f"{namespace}-{CHART}"
    bodies = chart_cluster_roles(fullname)
    names = {role: f"{fullname}-{role}" for role in CHART_ROLES}
    assert sorted(names.values()) == sorted(b["metadata"]["name"] for b in bodies)  # the file = MATRIX
    rbac = client.RbacAuthorizationV1Api(kube.api)
    try:
        for body in bodies:
            rbac.create_cluster_role(body)
        yield names | {role: role for role in BUILT_IN_ROLES}
    finally:
        for body in bodies:
            if status_of(lambda body=body: rbac.delete_cluster_role(body["metadata"]["name"])) not in (
                200,
                404,
            ):
                raise AssertionError(f"could not delete ClusterRole {body['metadata']['name']}")


def status_of(request: Callable[[], object]) -> int:
    """The HTTP status a request gets (200 for any success)."""
    try:
        request()
    except client.ApiException as err:
        return int(err.status)
    return 200


def allows(kube: KubeEnv, namespace: str, who: str, action: Action) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": who,
            "groups": ["system:authenticated"],
            "resourceAttributes": {
                "namespace": namespace,
                "verb": action.verb,
                "group": action.group,
                "resource": action.resource,
                "subresource": action.subresource,
            },
        },
    }
    return bool(client.AuthorizationV1Api(kube.api).create_subject_access_review(review).status.allowed)


def binding(name: str, cluster_role: str, subject: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": subject}],
    }


@pytest.fixture
def people(kube: KubeEnv, namespace: str, role_names: dict[str, str]) -> dict[str, client.ApiClient]:
    """Role -> a client for a user who holds exactly that role here, through ONE RoleBinding; ready
    once every grant is in effect, so that a refusal afterwards means the role does not grant it."""
    for role, cluster_role in role_names.items():
        bind(kube, namespace, user(role), cluster_role, cluster_role=True, name=role)

    def not_yet_allowed() -> list[str]:
        return [
            f"{role}: {action.label}"
            for role, allowed in MATRIX.items()
            for action in ACTIONS
            if action in allowed and not allows(kube, namespace, user(role), action)
        ]

    # A binding reaches the authorizer's cache, and the aggregation controller the built-ins, shortly.
    try:
        eventually(lambda: not not_yet_allowed(), Within.COMMIT, "every role's grants to be in effect")
    except TimeoutError as err:
        raise AssertionError(f"refused, though the role should allow it: {not_yet_allowed()}") from err
    return {role: kube.user_client(user(role), []) for role in role_names}


def test_each_role_allows_exactly_its_actions(
    kube: KubeEnv, namespace: str, people: dict[str, client.ApiClient]
) -> None:
    answers = {
        role: [action.label for action in ACTIONS if allows(kube, namespace, user(role), action)]
        for role in MATRIX
    }
    expected = {role: [action.label for action in ACTIONS if action in MATRIX[role]] for role in MATRIX}
    assert answers == expected


def runs_of(api: client.ApiClient, namespace: str) -> Callable[..., Any]:
    """Calls CustomObjectsApi methods on this namespace's AgentRuns, as the user of ``api``."""
    custom = client.CustomObjectsApi(api)

    def call(method: str, *args: Any) -> Any:
        return getattr(custom, method)(GROUP, VERSION, namespace, "agentruns", *args)

    return call


def a_run(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "taskType": "rollout-check",
            "objective": "check the rollout",
            "serviceAccountName": "default",
            "steps": [{"name": "confirm", "ask": {"question": "proceed?", "expiresIn": "1h"}}],
        },
    }


def test_requests_as_each_person(namespace: str, people: dict[str, client.ApiClient]) -> None:
    runs = {role: runs_of(api, namespace) for role, api in people.items()}

    # viewer reads runs; never starts one nor reads a Secret.
    assert runs["viewer"]("list_namespaced_custom_object")["items"] == []
    assert status_of(lambda: runs["viewer"]("create_namespaced_custom_object", a_run("by-viewer"))) == 403
    read_secret = client.CoreV1Api(people["viewer"]).read_namespaced_secret
    assert status_of(lambda: read_secret("anything", namespace)) == 403

    # editor starts a run and answers it; never writes its status or the ledger.
    runs["editor"]("create_namespaced_custom_object", a_run("rollout"))
    runs["editor"]("patch_namespaced_custom_object", "rollout", {"spec": {"answers": {"confirm": "yes"}}})
    forged = {"status": {"state": "completed"}}
    assert (
        status_of(lambda: runs["editor"]("patch_namespaced_custom_object_status", "rollout", forged)) == 403
    )
    record = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ActionRecord", "metadata": {"name": "forged"}}
    create = client.CustomObjectsApi(people["editor"]).create_namespaced_custom_object
    assert status_of(lambda: create(GROUP, VERSION, namespace, "actionrecords", record)) == 403

    # approver's decision is a patch RBAC lets through (the webhook then asks for "approve").
    decision = {"digest": "sha256:" + "0" * 64, "decision": "approve"}
    runs["approver"]("patch_namespaced_custom_object", "rollout", {"spec": {"approvals": {"r1": decision}}})
    assert runs["viewer"]("get_namespaced_custom_object", "rollout")["spec"]["approvals"] == {"r1": decision}
    assert status_of(lambda: runs["approver"]("create_namespaced_custom_object", a_run("by-approver"))) == 403
    assert status_of(lambda: runs["approver"]("delete_namespaced_custom_object", "rollout")) == 403

    # responder answers a question (a patch; the webhook then asks for "answer"); never starts or
    # deletes a run, nor reads the ledger.
    answer = {"spec": {"answers": {"confirm.2": "yes"}}}
    runs["responder"]("patch_namespaced_custom_object", "rollout", answer)
    assert (
        status_of(lambda: runs["responder"]("create_namespaced_custom_object", a_run("by-responder"))) == 403
    )
    assert status_of(lambda: runs["responder"]("delete_namespaced_custom_object", "rollout")) == 403
    records = client.CustomObjectsApi(people["responder"]).list_namespaced_custom_object
    assert status_of(lambda: records(GROUP, VERSION, namespace, "actionrecords")) == 403

    # on-call releases a run from quarantine (a patch); never starts or deletes one.
    runs["on-call"]("patch_namespaced_custom_object", "rollout", {"spec": {"retryQuarantine": "t1"}})
    assert status_of(lambda: runs["on-call"]("create_namespaced_custom_object", a_run("by-on-call"))) == 403
    assert status_of(lambda: runs["on-call"]("delete_namespaced_custom_object", "rollout")) == 403

    # By aggregation: the built-in edit starts and deletes runs, view does not start one.
    runs["edit"]("create_namespaced_custom_object", a_run("by-edit"))
    runs["edit"]("delete_namespaced_custom_object", "by-edit")
    assert status_of(lambda: runs["view"]("create_namespaced_custom_object", a_run("by-view"))) == 403
    assert [r["metadata"]["name"] for r in runs["view"]("list_namespaced_custom_object")["items"]] == [
        "rollout"
    ]


def test_only_the_policy_author_writes_policies(namespace: str, people: dict[str, client.ApiClient]) -> None:
    policy = yaml.safe_load((REPO / "config/samples/agentpolicy-default.yaml").read_text())

    def apply_as(role: str) -> int:
        create = client.CustomObjectsApi(people[role]).create_namespaced_custom_object
        return status_of(lambda: create(GROUP, VERSION, namespace, "agentpolicies", policy))

    assert apply_as("policy-author") == 200
    policy["metadata"]["name"] = "by-hand"
    assert {role: apply_as(role) for role in MATRIX if role != "policy-author"} == {
        role: 403 for role in MATRIX if role != "policy-author"
    }
    # The pipeline's identity writes policies and nothing else.
    runs = runs_of(people["policy-author"], namespace)
    assert status_of(lambda: runs("list_namespaced_custom_object")) == 403


def test_a_namespace_admin_grants_viewer_and_editor_but_not_the_separate_duties(
    namespace: str, role_names: dict[str, str], people: dict[str, client.ApiClient]
) -> None:
    rbac = client.RbacAuthorizationV1Api(people["admin"])

    def grant(role: str) -> int:
        body = binding(f"newcomer-{role}", role_names[role], "newcomer")
        return status_of(lambda: rbac.create_namespaced_role_binding(namespace, body))

    # RBAC lets one grant only rights one holds: admin holds viewer's and editor's by aggregation,
    # never approve, the on-call verbs or writing policies. responder's rights are a part of
    # editor's: a namespace admin may grant it too.
    assert {role: grant(role) for role in CHART_ROLES} == {
        "viewer": 200,
        "editor": 200,
        "approver": 403,
        "responder": 200,
        "on-call": 403,
        "policy-user": 403,
        "policy-author": 403,
    }


# The chart's cluster-wide duty (files/user-roles.yaml clusterRoles): granted with a
# ClusterRoleBinding, it asks for region failovers (RegionFailovers are cluster-scoped; the webhook
# asks for "failover" on regions/FROM) and nothing else.
FAILOVER_ROLE = "region-failover"
FAILOVER_ACTIONS: tuple[tuple[Action, str], ...] = (
    *((Action(verb, "regionfailovers"), "") for verb in ("get", "list", "watch", "create")),
    *((Action(verb, "regionfailovers"), "") for verb in ("update", "patch", "delete")),
    (Action("update", "regionfailovers", subresource="status"), ""),
    (Action("failover", "regions"), "eu-west"),
    (Action("failover", "agentruns"), ""),
    (Action("get", "agentruns"), ""),
)
FAILOVER_ALLOWS = {"`get` regionfailovers", "`list` regionfailovers", "`watch` regionfailovers"} | {
    "`create` regionfailovers",
    "`failover` regions",
}


def allows_cluster_wide(kube: KubeEnv, who: str, action: Action, name: str) -> bool:
    attributes = {"verb": action.verb, "group": action.group, "resource": action.resource}
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": who,
            "groups": ["system:authenticated"],
            "resourceAttributes": {**attributes, "subresource": action.subresource, "name": name},
        },
    }
    return bool(client.AuthorizationV1Api(kube.api).create_subject_access_review(review).status.allowed)


def test_the_region_failover_role_allows_asking_for_failovers_only(kube: KubeEnv, namespace: str) -> None:
    role = yaml.safe_load(USER_ROLES.read_text())["clusterRoles"][FAILOVER_ROLE]
    assert role["aggregateTo"] == []  # a separate duty: in no built-in role
    name, who = f"{namespace}-{CHART}-{FAILOVER_ROLE}", f"user-{FAILOVER_ROLE}"
    rbac = client.RbacAuthorizationV1Api(kube.api)
    grant_cluster(kube, who, role["rules"], name=name)
    try:
        eventually(
            lambda: allows_cluster_wide(kube, who, Action("create", "regionfailovers"), ""),
            Within.COMMIT,
            "the ClusterRoleBinding to be in effect",
        )
        answers = {a.label for a, n in FAILOVER_ACTIONS if allows_cluster_wide(kube, who, a, n)}
        assert answers == FAILOVER_ALLOWS
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


# --- no dead grants ---------------------------------------------------------------------------------

# The verbs the API server itself enforces, on the resources it serves.
STANDARD_VERBS = frozenset(
    {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
)
SERVED = frozenset(
    yaml.safe_load(crd.read_text())["spec"]["names"]["plural"]
    for crd in (REPO / "charts/durable-agents/crds").glob("*.yaml")
) | {"serviceaccounts"}
# The (verb, resource) pairs the operator asks a SubjectAccessReview for, from the constants its
# checks use (the policy's approver verb at its default; a policy naming another verb is the
# user's own grant). test_every_subject_access_review_asks_for_a_derived_verb keeps this complete.
ASKED: frozenset[tuple[str, str]] = frozenset(
    {(verb, "agentruns") for verb in (*REQUEST_VERBS.values(), RETRY_VERB, *CONTROL_VERBS.values())}
    | {(ApproverRule().verb, ApproverRule().resource), (ANSWER_VERB, "agentruns")}
    | {(USE_VERB, "serviceaccounts"), (USE_VERB, "agentpolicies"), (USE_VERB, "clusteragentpolicies")}
    | {(FORCE_DELETE_VERB, "agentpolicies"), (FAILOVER_VERB, REGIONS)}
    | {(FORCE_DELETE_VERB, plural) for plural in DEFINITION_PLURALS.values()}
)
# How the operator's SubjectAccessReview call sites name their verb, and where that verb comes from
# in ASKED: a new call site with another verb fails the test below until ASKED derives it.
VERB_ARGUMENTS = {
    "verb": "authority.refused_verb's own, and verbs_needed(): REQUEST_VERBS, RETRY_VERB",
    "USE_VERB": "a run's ServiceAccount and policy",
    "VERBS[field]": "core.controls.VERBS",
    "rule.verb": "the policy's approvers (reconciliations, reveal, decisions)",
    "ANSWER_VERB": "reveal of the question a run waits on",
    "FORCE_DELETE_VERB": "policy_integrity",
    "FAILOVER_VERB": "admission.failover",
    "CREATE_RUN_VERB": "a schedule's creator may create its runs (a standard verb)",
}


def granted_verbs() -> list[tuple[str, str, str]]:
    """(role, verb, resource) for every verb every role of files/user-roles.yaml holds."""
    spec = yaml.safe_load(USER_ROLES.read_text())
    roles = {**spec["roles"], **spec["clusterRoles"]}
    return [
        (name, verb, resource)
        for name, role in roles.items()
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]


def test_no_role_holds_a_verb_nothing_checks() -> None:
    """A custom verb the operator never asks for is a dead grant: the roles table would promise
    what nobody enforces (as on-call's `failover` on agentruns did). A standard verb must be on a
    resource the API server serves."""
    dead = [
        f"{role}: {verb} on {resource}"
        for role, verb, resource in granted_verbs()
        if (verb in STANDARD_VERBS and resource not in SERVED)
        or (verb not in STANDARD_VERBS and (verb, resource) not in ASKED)
    ]
    assert not dead, f"granted, never checked: {dead} (the operator asks for {sorted(ASKED)})"


def test_every_subject_access_review_asks_for_a_derived_verb() -> None:
    """Every call of may()/refused_verb() in the operator names its verb one of the ways ASKED is
    derived from, so a check with a new verb cannot be added without the roles test seeing it."""
    found: dict[str, str] = {}
    for path in (REPO / "operator/durable_agents/shell").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if callee == "refused_verb" and len(node.args) >= 3:
                found[f"{path.name}:{node.lineno}"] = ast.unparse(node.args[2])
            elif callee in ("may", "refused_verb"):
                verb = [k.value for k in node.keywords if k.arg == "verb"]
                if verb:
                    found[f"{path.name}:{node.lineno}"] = ast.unparse(verb[0])
    assert len(found) >= len(VERB_ARGUMENTS), f"fewer SubjectAccessReview call sites than expected: {found}"
    unknown = {site: verb for site, verb in found.items() if verb not in VERB_ARGUMENTS}
    assert not unknown, f"a SubjectAccessReview for a verb ASKED does not derive: {unknown}"
    assert set(found.values()) == set(VERB_ARGUMENTS), "VERB_ARGUMENTS names a verb no call site uses"


def test_the_readme_table_is_the_matrix() -> None:
    assert readme_table() in ROLES_PAGE.read_text(), "paste the output of `python e2e/test_user_roles.py`"


if __name__ == "__main__":
    print(readme_table())
