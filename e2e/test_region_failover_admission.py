"""Asking for a region failover: who may, what the admission webhook records, and the CLI.

Real users (client certificates), the chart's region-failover ClusterRole and narrower ones made
by the test, and the operator's admission webhook in front of every RegionFailover write. The
regions named here are served by no operator, so nothing acts on the requests: what the operator
serving the target region does with one is e2e/test_regions.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from durable_agents.api.v1alpha1 import FAILOVER_PLURAL, GROUP, VERSION, RegionFailover
from durable_agents.core.authority import failover_verifies
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import session_keyring
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant_cluster, rule
from durable_agents_testkit.scrape import free_port

REPO = Path(__file__).resolve().parents[1]
USER_ROLES = REPO / "charts/durable-agents/files/user-roles.yaml"
PLUGIN = [sys.executable, "-m", "durable_agents.kubectl.main"]
LEASE = 2
OPERATOR_USER = "durable-agents-operator"  # the user e2e/conftest.py binds the operator's rules to


@dataclass(frozen=True)
class Setting:
    """This test's regions (served by no operator) and its people's kubeconfigs."""

    source: str  # FROM: fiona may fail it over (the chart's role), gina too (by resource name)
    other: str  # a region gina may not fail over
    target: str
    kubeconfigs: dict[str, Path]

    def api(self, who: str) -> client.CustomObjectsApi:
        from kubernetes import config

        return client.CustomObjectsApi(config.new_client_from_config(config_file=str(self.kubeconfigs[who])))


def body(source: str, target: str, name: str | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RegionFailover",
        "metadata": {"name": name or f"failover-{source}-to-{target}-{uuid.uuid4().hex[:5]}"},
        "spec": {"from": source, "to": target, **spec},
    }


def allowed(kube: KubeEnv, user: str, verb: str, resource: str, name: str, subresource: str = "") -> bool:
    attributes = {
        "group": GROUP,
        "resource": resource,
        "verb": verb,
        "name": name,
        "subresource": subresource,
    }
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:authenticated"], "resourceAttributes": attributes},
    }
    return bool(client.AuthorizationV1Api(kube.api).create_subject_access_review(review).status.allowed)


@pytest.fixture
def setting(kube: KubeEnv, plane: LocalControlPlane, namespace: str) -> Iterator[Setting]:
    """fiona holds the chart's region-failover ClusterRole; gina may fail over ``source`` only;
    bob may create RegionFailovers but holds no ``failover`` verb. All cluster-wide, removed
    afterwards with every RegionFailover of these regions."""
    suffix = namespace.removeprefix("t-")
    source, other, target = f"gone-{suffix}", f"other-{suffix}", f"far-{suffix}"
    chart_rules = yaml.safe_load(USER_ROLES.read_text())["clusterRoles"]["region-failover"]["rules"]
    follow = rule(GROUP, FAILOVER_PLURAL, "create", "get", "list", "watch")
    by_name = rule(GROUP, "regions", "failover", names=[source])
    grants = [
        (f"{namespace}-region-failover", chart_rules, "fiona"),
        (f"{namespace}-failover-one", [follow, by_name], "gina"),
        (f"{namespace}-failover-none", [follow], "bob"),
    ]
    rbac = client.RbacAuthorizationV1Api(kube.api)
    custom = kube.custom()
    try:
        for name, rules, who in grants:
            grant_cluster(kube, who, rules, name=name)
        eventually(
            lambda: (
                allowed(kube, "fiona", "failover", "regions", other)
                and allowed(kube, "gina", "failover", "regions", source)
                and allowed(kube, "bob", "create", FAILOVER_PLURAL, "")
            ),
            Within.COMMIT,
            "the failover grants to be in effect",
        )
        people = {who: plane.write_user_kubeconfig(who, []) for who in ("fiona", "gina", "bob")}
        yield Setting(source, other, target, people)
    finally:
        for item in custom.list_cluster_custom_object(GROUP, VERSION, FAILOVER_PLURAL)["items"]:
            if item["spec"]["from"] in (source, other):
                custom.delete_cluster_custom_object(GROUP, VERSION, FAILOVER_PLURAL, item["metadata"]["name"])
        for name, _, _ in grants:
            rbac.delete_cluster_role_binding(name)
            rbac.delete_cluster_role(name)


def through_failover_webhooks(kube: KubeEnv) -> bool:
    """Whether RegionFailover writes pass through the operator's webhooks now (the API server
    learns of their configurations through a watch; until then a write skips them, as it does a
    failover webhook that does not answer: failurePolicy Ignore). A dry-run create comes back
    stamped, and one named by generateName, which its stamp cannot cover, is refused."""
    create = kube.custom().create_cluster_custom_object
    try:
        made = create(GROUP, VERSION, FAILOVER_PLURAL, body("probe-from", "probe-to"), dry_run="All")
    except client.ApiException:
        return False
    if not made["spec"].get("stamp"):
        return False
    generated = body("probe-from", "probe-to")
    generated["metadata"] = {"generateName": "probe-"}
    try:
        create(GROUP, VERSION, FAILOVER_PLURAL, generated, dry_run="All")
    except client.ApiException as err:
        return bool(err.status == 403)
    return False


@pytest.fixture
def webhook(
    kube: KubeEnv, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> Iterator[OperatorProcess]:
    """An operator serving the admission webhook; its configurations removed afterwards (they
    cover cluster-scoped RegionFailovers, which no namespace takes along)."""
    op = start_operator("failover-webhook", LEASE, DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    eventually(
        lambda: through_failover_webhooks(kube), Within.COMMIT, "RegionFailover writes to pass the webhooks"
    )
    yield op
    api = client.AdmissionregistrationV1Api(kube.api)
    api.delete_mutating_webhook_configuration(f"durable-agents-{namespace}")
    api.delete_validating_webhook_configuration(f"durable-agents-{namespace}")


def refusal(call: Callable[[], Any]) -> str:
    with pytest.raises(client.ApiException) as err:
        call()
    assert err.value.status == 403, err.value.body
    return str(err.value.body)


def stored(kube: KubeEnv, name: str) -> RegionFailover:
    return RegionFailover.model_validate(
        kube.custom().get_cluster_custom_object(GROUP, VERSION, FAILOVER_PLURAL, name)
    )


@pytest.mark.local_plane("users", "webhook")
def test_without_the_failover_verb_on_the_region_the_request_is_refused(
    kube: KubeEnv, webhook: OperatorProcess, setting: Setting
) -> None:
    create = setting.api("bob").create_cluster_custom_object
    message = refusal(lambda: create(GROUP, VERSION, FAILOVER_PLURAL, body(setting.source, setting.target)))
    assert f"user 'bob' may not failover region '{setting.source}'" in message
    assert "needs RBAC verb 'failover' on resource 'regions' in API group 'durable-agents.io'" in message
    # A grant by resource name covers that region only.
    create = setting.api("gina").create_cluster_custom_object
    message = refusal(lambda: create(GROUP, VERSION, FAILOVER_PLURAL, body(setting.other, setting.target)))
    assert f"user 'gina' may not failover region '{setting.other}'" in message
    made = create(GROUP, VERSION, FAILOVER_PLURAL, body(setting.source, setting.target))
    assert made["spec"]["requestedBy"]["username"] == "gina"
    froms = [
        i["spec"]["from"]
        for i in kube.custom().list_cluster_custom_object(GROUP, VERSION, FAILOVER_PLURAL)["items"]
    ]
    assert setting.other not in froms


@pytest.mark.local_plane("users", "webhook")
def test_the_webhook_records_who_asked_and_stamps_it(
    kube: KubeEnv, webhook: OperatorProcess, setting: Setting
) -> None:
    forged = {
        "reason": "eu-west is down",
        "requestedBy": {"username": "mallory", "groups": ["system:masters"], "uid": "forged"},
        "requestedAt": "2020-01-01T00:00:00Z",
        "stamp": "test-key-1:" + "A" * 43 + "=",
    }
    fiona = setting.api("fiona")
    made = fiona.create_cluster_custom_object(
        GROUP, VERSION, FAILOVER_PLURAL, body(setting.source, setting.target, **forged)
    )
    name = made["metadata"]["name"]
    failover = stored(kube, name)
    who = failover.spec.requested_by
    assert who is not None
    assert who.username == "fiona"
    assert "system:masters" not in who.groups
    assert who.uid != "forged"
    assert failover.spec.requested_at is not None
    assert failover.spec.requested_at.year > 2020
    assert failover.spec.reason == "eu-west is down"
    assert failover_verifies(session_keyring(), name, failover.spec)
    assert not failover_verifies(session_keyring(), f"{name}-copy", failover.spec)

    # Never changed afterwards, not even by the cluster's administrator.
    with pytest.raises(client.ApiException) as err:
        kube.custom().patch_cluster_custom_object(
            GROUP, VERSION, FAILOVER_PLURAL, name, {"spec": {"requestedBy": {"username": "mallory"}}}
        )
    assert err.value.status == 422
    assert "a region failover request is immutable once made" in str(err.value.body)
    assert stored(kube, name).spec == failover.spec

    # With generateName the name is made after the mutating webhook ran: the stamp cannot cover it.
    generated = body(setting.source, setting.target)
    generated["metadata"] = {"generateName": f"failover-{setting.source}-to-{setting.target}-"}
    message = refusal(lambda: fiona.create_cluster_custom_object(GROUP, VERSION, FAILOVER_PLURAL, generated))
    assert "name the failover (with generateName its name is not known when it is stamped)" in message


def plugin(setting: Setting, who: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(setting.kubeconfigs[who])}
    return subprocess.run([*PLUGIN, *args], env=env, capture_output=True, text=True, timeout=120, **kwargs)


def created_name(stdout: str) -> str:
    first = stdout.splitlines()[0]
    assert first.startswith("regionfailover.durable-agents.io/"), stdout
    assert first.endswith(" created"), stdout
    return first.removeprefix("regionfailover.durable-agents.io/").removesuffix(" created")


@pytest.mark.local_plane("users", "webhook")
def test_kubectl_agentrun_region_failover(
    kube: KubeEnv, plane: LocalControlPlane, webhook: OperatorProcess, setting: Setting
) -> None:
    source, target = setting.source, setting.target
    out = plugin(setting, "fiona", "region", "failover", source, "--to", target, "--reason", "drill")
    assert out.returncode == 0, out.stderr
    name = created_name(out.stdout)
    assert name.startswith(f"failover-{source}-to-{target}-")
    failover = stored(kube, name)
    assert failover.spec.from_region == source
    assert failover.spec.to == target
    assert failover.spec.reason == "drill"
    assert failover.spec.requested_by is not None
    assert failover.spec.requested_by.username == "fiona"
    assert failover_verifies(session_keyring(), name, failover.spec)
    shown = plane.kubectl("get", "rfo", name, "--no-headers", check=True).stdout.split()
    assert shown[:3] == [name, source, target]

    refused = plugin(setting, "bob", "region", "failover", source, "--to", target)
    assert refused.returncode == 1
    assert "error: the API server refused the failover:" in refused.stderr
    assert "needs RBAC verb 'failover' on resource 'regions'" in refused.stderr
    same = plugin(setting, "fiona", "region", "failover", source, "--to", source)
    assert same.returncode == 1
    assert "a failover moves runs to another region" in same.stderr


@pytest.mark.local_plane("users", "webhook")
def test_region_failover_wait_reports_what_the_operator_did(
    kube: KubeEnv, webhook: OperatorProcess, setting: Setting
) -> None:
    """The operator's report is written here by the test (no operator serves these regions): the
    CLI waits for it, prints it, and says with its exit code whether runs were left behind."""
    source, target = setting.source, setting.target
    custom = kube.custom()
    waiting = subprocess.Popen(
        [*PLUGIN, "region", "failover", source, "--to", target, "--wait", "--timeout", "60"],
        env={**os.environ, "KUBECONFIG": str(setting.kubeconfigs["fiona"])},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def made() -> str | None:
            items = custom.list_cluster_custom_object(GROUP, VERSION, FAILOVER_PLURAL)["items"]
            names = [i["metadata"]["name"] for i in items if i["spec"]["from"] == source]
            return names[0] if names else None

        name = eventually(made, Within.COMMIT, "the CLI to create the failover")
        status = {
            "phase": "Completed",
            "message": "adopted 1 run, 1 left",
            "epoch": 7,
            "adopted": [{"namespace": "team-a", "name": "rollout", "epoch": 7}],
            "notAdopted": [{"namespace": "team-b", "name": "payout", "reason": "a dispatch is in flight"}],
            "unknownOutcomes": [{"namespace": "team-a", "run": "rollout", "action": "rollout-pay-1"}],
        }
        custom.patch_cluster_custom_object_status(GROUP, VERSION, FAILOVER_PLURAL, name, {"status": status})
        stdout, stderr = waiting.communicate(timeout=Within.COMMIT)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 2, stderr
    assert created_name(stdout) == name
    assert f"regionfailover.durable-agents.io/{name}: Completed under region epoch 7" in stdout
    assert "Not adopted (1): they stay in their region" in stdout
    assert "payout" in stdout
    assert "a dispatch is in flight" in stdout
    assert "rollout-pay-1" in stdout

    late = plugin(setting, "fiona", "region", "failover", source, "--to", target, "--wait", "--timeout", "1")
    assert late.returncode == 1
    assert "not finished within 1s" in late.stderr


def test_the_operator_reads_failovers_and_writes_only_their_status(
    kube: KubeEnv, operator_kubeconfig: Path
) -> None:
    """The rules the chart gives the operator (bound to its user by the e2e fixtures)."""

    def may(verb: str, subresource: str = "") -> bool:
        return allowed(kube, OPERATOR_USER, verb, FAILOVER_PLURAL, "", subresource)

    assert [may(verb) for verb in ("get", "list", "watch")] == [True, True, True]
    assert may("update", "status")
    assert [may(verb) for verb in ("create", "update", "delete")] == [False, False, False]
    assert not allowed(kube, OPERATOR_USER, "failover", "regions", "eu")
