"""``kubectl agentrun inbox``: each person sees exactly what they may decide or answer now.

Real users with client certificates, RBAC made by the test, the operator's admission webhook.
Four people in namespace ns1 (runs under a policy with fourEyes): alice and carol approve (and
each created a run), bob approves and answers, dave may read and patch runs but holds neither
verb. In ns2, alice holds the verb and bob may only read. Each inbox is compared with exactly
the set it must show; the JSON output carries the pinned command, which decides the request.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.test_approvals import payment
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.kubectl import main as kubectl_plugin
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.operator_rights import manage
from durable_agents_testkit.rbac import grant, grant_cluster, rule
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

LEASE = 2
pytestmark = pytest.mark.local_plane("users", "webhook")
ASKS = {
    "taskType": "e2e",
    "objective": "ask, then finish",
    "steps": [{"name": "confirm", "ask": {"question": "go on?"}}, {"name": "done", "complete": {}}],
}


def agentrun(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    """``kubectl agentrun ARGS`` in-process as the user of ``kubeconfig``: (exit code, out, err)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = kubectl_plugin.main([*args, "--kubeconfig", str(kubeconfig)])
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


def inbox(kubeconfig: Path, *where: str) -> tuple[set[tuple[str, str, str]], dict[str, Any], str]:
    """(namespace, run, kind) of each entry, the JSON document, and what went to stderr."""
    code, out, err = agentrun(kubeconfig, "inbox", *where, "-o", "json")
    assert code == 0, err
    document = json.loads(out)
    return {(i["namespace"], i["run"], i["kind"]) for i in document["items"]}, document, err


def policy(runs: Runs, quorum: int = 1) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "payments"},
        "spec": {
            "version": "v1",
            "tiers": {"http.post": "consequential"},
            "approvalRequiredTiers": ["consequential"],
            "approvers": {"verb": "approve", "resource": "agentruns", "fourEyes": True, "quorum": quorum},
            "approvalExpiry": "1h",
        },
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)


def create_as(api: client.ApiClient, runs: Runs, name: str, spec: dict[str, Any]) -> None:
    """A run created by the user of ``api`` (the webhook stamps them as its creator)."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRun", "metadata": {"name": name}, "spec": spec}
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentruns", body
    )


@pytest.fixture
def ns2(kube: KubeEnv) -> Iterator[Runs]:
    name = f"t2-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube.api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    manage(kube, name)  # its operator may act there (and keeps its Leases there)
    yield Runs(kube, name)
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def people(kube: KubeEnv, plane: LocalControlPlane, namespace: str, ns2: Runs) -> Iterator[dict[str, Path]]:
    """alice, carol: approve (and create); bob: approve, answer and watch; dave: neither, in ns1. In ns2
    alice approves, bob reads. alice lists runs cluster-wide, bob lists namespaces (-A's two ways)."""
    runs_rule = {"apiGroups": [GROUP], "resources": ["agentruns"]}
    use = [rule("", "serviceaccounts", "use"), rule(GROUP, "agentpolicies", "use")]
    creator = [{**runs_rule, "verbs": ["get", "list", "create", "patch", "approve"]}, *use]
    grant(kube, namespace, "alice", creator)
    grant(kube, namespace, "carol", creator)
    bob = ["get", "list", "watch", "patch", "approve", "answer"]
    grant(kube, namespace, "bob", {**runs_rule, "verbs": bob})
    grant(kube, namespace, "dave", {**runs_rule, "verbs": ["get", "list", "patch"]})
    grant(kube, ns2.namespace, "alice", {**runs_rule, "verbs": ["get", "list", "patch", "approve"]})
    grant(kube, ns2.namespace, "bob", {**runs_rule, "verbs": ["get", "list"]})
    cluster = {
        f"inbox-alice-{namespace}": ("alice", rule(GROUP, "agentruns", "list")),
        f"inbox-bob-{namespace}": ("bob", rule("", "namespaces", "list")),
    }
    for name, (who, rules) in cluster.items():
        grant_cluster(kube, who, rules, name=name)
    yield {who: plane.write_user_kubeconfig(who, []) for who in ("alice", "bob", "carol", "dave")}
    rbac = client.RbacAuthorizationV1Api(kube.api)
    for name in cluster:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def test_each_inbox_shows_exactly_what_its_owner_may_decide(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    ns2: Runs,
    people: dict[str, Path],
    refsystem: ReferenceSystemThread,
) -> None:
    ns1 = runs.namespace
    policy(runs)
    policy(ns2)
    webhook_operator()
    start_operator(
        "inbox-ns2", LEASE, DURABLE_AGENTS_NAMESPACE=ns2.namespace
    )  # runs there stamped by the kit
    users = {who: kube.user_client(who, []) for who in ("alice", "carol")}
    create_as(users["carol"], runs, "by-carol", payment(refsystem.url))
    create_as(users["alice"], runs, "by-alice", payment(refsystem.url))
    runs.create(ASKS, name="asks")
    ns2.create(payment(refsystem.url), name="over-there")
    for name in ("by-carol", "by-alice"):
        runs.wait_state(name, "waiting_approval", timeout=Within.RUN)
    runs.wait_state("asks", "waiting_input", timeout=Within.RUN)
    ns2.wait_state("over-there", "waiting_approval", timeout=Within.RUN)

    # Per namespace: the verb on the run, four-eyes (no one sees their own run), verb answer.
    expected = {
        "alice": {(ns1, "by-carol", "approval")},
        "carol": {(ns1, "by-alice", "approval")},
        "bob": {(ns1, "by-carol", "approval"), (ns1, "by-alice", "approval"), (ns1, "asks", "question")},
        "dave": set(),
    }
    for who, shown in expected.items():
        seen, document, err = inbox(people[who], "-n", ns1)
        assert seen == shown, f"{who}'s inbox in {ns1}"
        assert document["user"] == who
        if not shown:
            assert f"nothing waits for you in {ns1}" in err
    code, out, err = agentrun(people["dave"], "inbox", "-n", ns1)
    assert (code, out) == (0, ""), "nothing waits for dave: nothing printed, no error"
    assert f"nothing waits for you in {ns1}" in err
    code, _, err = agentrun(people["dave"], "inbox", "-n", ns2.namespace)
    assert code == 1
    assert f"may not list agentruns in namespace {ns2.namespace!r}: needs verb 'list'" in err

    # -A: alice lists cluster-wide, bob namespace by namespace; each sees ns2 only with the verb.
    seen, _, _ = inbox(people["alice"], "-A")
    assert seen == {(ns1, "by-carol", "approval"), (ns2.namespace, "over-there", "approval")}
    seen, _, err = inbox(people["bob"], "-A")
    assert seen == expected["bob"], "bob reads ns2 but may not approve there"
    assert "you may not list agentruns in" in err, "the namespaces bob may not read are said"
    code, _, err = agentrun(people["dave"], "inbox", "-A")
    assert code == 1
    assert "may not list namespaces" in err

    # The table says the same, with the command to copy; the JSON carries the pinned command.
    code, out, _ = agentrun(people["bob"], "inbox", "-n", ns1)
    assert code == 0
    assert out.splitlines()[0].split() == [
        "NAMESPACE", "RUN", "KIND", "REQUEST", "ACTION", "AGE", "EXPIRES", "APPROVALS"
    ]  # fmt: skip
    assert f"kubectl agentrun answer asks -n {ns1} --question confirm '<answer>'" in out
    _, document, _ = inbox(people["alice"], "-n", ns1)
    (item,) = document["items"]
    request = runs.get("by-carol")["status"]["approvalRequest"]
    assert (item["request"], item["digest"], item["tier"]) == (
        request["requestId"],
        request["digest"],
        "consequential",
    )
    pinned = f"--request {request['requestId']} --digest {request['digest']}"
    assert item["command"] == f"kubectl agentrun approve by-carol -n {ns1} {pinned}"

    # The command from the inbox decides: applied once, and alice's inbox is empty after it.
    code, out, err = agentrun(people["alice"], *shlex.split(item["command"])[2:])
    assert code == 0, err
    runs.wait_state("by-carol", "completed", timeout=Within.RUN)
    assert list(refsystem.counts().values()) == [1]
    seen, _, err = inbox(people["alice"], "-n", ns1)
    assert seen == set()
    assert f"nothing waits for you in {ns1}" in err


def test_after_one_of_two_approvals_only_the_second_approver_sees_the_request(
    kube: KubeEnv,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, Path],
    refsystem: ReferenceSystemThread,
) -> None:
    ns1 = runs.namespace
    policy(runs, quorum=2)
    webhook_operator()
    create_as(kube.user_client("carol", []), runs, "two-eyes", payment(refsystem.url))
    request = runs.wait_state("two-eyes", "waiting_approval", timeout=Within.RUN)["status"]["approvalRequest"]
    assert request["quorum"] == 2
    for who in ("alice", "bob"):
        seen, document, _ = inbox(people[who], "-n", ns1)
        assert seen == {(ns1, "two-eyes", "approval")}
        assert document["items"][0]["approvals"] == "0 of 2"

    _, document, _ = inbox(people["alice"], "-n", ns1)
    code, _, err = agentrun(people["alice"], *shlex.split(document["items"][0]["command"])[2:])
    assert code == 0, err

    def counted() -> dict[str, Any] | None:
        run = runs.get("two-eyes")
        state = run["status"]["state"]
        assert state not in ("completed", "failed"), f"one approval of two ended the run ({state})"
        votes = (run["status"].get("approvalRequest") or {}).get("approvedBy") or []
        counted = [v["approver"] for v in votes] == ["alice"]
        return run if counted and state == "waiting_approval" else None

    waiting = eventually(counted, Within.COMMIT, "alice's approval verified and counted (approvedBy)")
    assert waiting["status"]["state"] == "waiting_approval"
    assert refsystem.counts() == {}
    seen, _, _ = inbox(people["alice"], "-n", ns1)
    assert seen == set(), "alice decided it already"
    seen, document, _ = inbox(people["bob"], "-n", ns1)
    assert seen == {(ns1, "two-eyes", "approval")}
    assert document["items"][0]["approvals"] == "1 of 2"
    code, out, err = agentrun(people["bob"], *shlex.split(document["items"][0]["command"])[2:])
    assert code == 0, err
    assert f"as spec.approvals['{request['requestId']}.2']" in out, "the second decision, the next key"
    runs.wait_state("two-eyes", "completed", timeout=Within.RUN)
    assert list(refsystem.counts().values()) == [1]


def documents(text: str) -> list[dict[str, Any]]:
    """The JSON documents ``inbox -o json --watch`` printed so far, one after another."""
    decoder, found, rest = json.JSONDecoder(), [], text.lstrip()
    while rest:
        try:
            document, used = decoder.raw_decode(rest)
        except ValueError:
            break  # a document still being written
        found.append(document)
        rest = rest[used:].lstrip()
    return found


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def _killed_on_failure(process: subprocess.Popen[str]) -> Iterator[None]:
    """A failure inside the block kills the process: leaving the ``Popen`` block waits for it."""
    try:
        yield
    except BaseException:
        process.kill()
        raise


def test_watch_prints_the_inbox_again_when_it_changes_and_ends_cleanly_on_ctrl_c(
    kube: KubeEnv,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, Path],
    refsystem: ReferenceSystemThread,
) -> None:
    ns1 = runs.namespace
    policy(runs)
    webhook_operator()
    create_as(kube.user_client("carol", []), runs, "watched", payment(refsystem.url))
    request = runs.wait_state("watched", "waiting_approval", timeout=Within.RUN)["status"]["approvalRequest"]
    argv = [sys.executable, "-m", "durable_agents.kubectl.main", "inbox", "-n", ns1, "-o", "json", "--watch"]
    env = {**os.environ, "KUBECONFIG": str(people["bob"])}
    # Ctrl-C as a terminal sends it: whatever the suite's own launcher did with SIGINT (a background
    # job's children inherit it ignored, and the plugin then rightly keeps ignoring it).
    with (
        subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_interruptible,
        ) as bob,
        _killed_on_failure(bob),
    ):
        printed: list[str] = []
        reader = threading.Thread(target=lambda: printed.extend(iter(bob.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        first = eventually(lambda: documents("".join(printed)), Within.COMMIT, "the first inbox")
        assert [i["run"] for i in first[0]["items"]] == ["watched"]
        pinned = ("--request", request["requestId"], "--digest", request["digest"])
        code, _, err = agentrun(people["alice"], "approve", "watched", "-n", ns1, *pinned)
        assert code == 0, err
        try:
            again = eventually(
                lambda: len(documents("".join(printed))) > 1 and documents("".join(printed)),
                Within.COMMIT,
                "the inbox printed again once the request was decided",
            )
        except TimeoutError:
            bob.kill()
            raise AssertionError(f"printed: {''.join(printed)}; said: {bob.communicate()[1]}") from None
        assert again[-1]["items"] == [], "decided: it waits for nobody"
        bob.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = bob.communicate(timeout=Within.COMMIT)
    assert bob.returncode == 0, err
    assert "Traceback" not in err
