"""A revalidation holds at the write that carries it: a policy change that lands after an
approval's revalidation was decided, but before the (batched) status write that carries it and
its intent, makes the run ask again under the new version, and nothing is sent meanwhile.

The window is made deterministic with the commit-delay test hook: every run status write waits
3 s first, and the policy (or the evidence) changes while the write carrying the approval waits.
Also: the dispatcher's second line (a change after the intent's write: nothing sent), and the
normal case's cost (the same status writes as without the check).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from e2e.test_approvals import decide, payment, pending, people, policy, policy_known
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless
from durable_agents_testkit.scrape import free_port, metric, scrape_when

__all__ = ["people"]  # a fixture, shared with test_approvals
pytestmark = pytest.mark.local_plane("users", "webhook")

HELD = "3"  # seconds each status write waits (DURABLE_AGENTS_TEST_COMMIT_DELAY)


def test_a_policy_change_between_the_revalidation_and_its_write_asks_again(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs, version="v1")  # policyChanged: reapprove
    # Batching on (the default: up to 16 transitions per write); each write held 3 s.
    op = webhook_operator(DURABLE_AGENTS_TEST_COMMIT_DELAY=HELD)
    name = runs.create(payment(refsystem.url), name="late-change")
    request = pending(runs, name)
    assert request["policyVersion"] == "v1"
    held = f"test hook: commit to {runs.namespace}/{name} held"
    writes_before = op.log_path.read_text().count(held)

    decide(people["alice"], runs, name, request["requestId"], request["digest"])
    # The worker has decided the batch from the approval (taken in, revalidated under v1, the
    # intent) and its one write is being held: now the policy changes.
    eventually(
        lambda: op.logged(held, times=writes_before + 1),
        Within.COMMIT,
        "the batch carrying the approval to be decided and its write held",
    )
    policy(runs, version="v2")
    policy_known(op, runs, "v2")
    eventually(
        lambda: op.logged(f"for {runs.namespace}/{name} thrown away: "),
        Within.COMMIT,
        "the batch decided under v1 to be thrown away right before its write",
    )
    assert op.logged("before its write the policy is version v2"), op.log_tail()

    second = eventually(
        lambda: (
            (runs.get(name)["status"].get("approvalRequest") or {}).get("policyVersion") == "v2"
            and runs.get(name)["status"]["approvalRequest"]
        ),
        Within.COMMIT,
        "a new approval request under policy v2",
    )
    assert second["requestId"] == "pay-2"
    assert "policy changed from v1 to v2" in second["policyReason"]
    assert refsystem.counts() == {}, "nothing is sent under the approval given for v1"
    assert action_records(runs) == [], "not even intended"
    run = runs.get(name)
    assert run["status"]["state"] == "waiting_approval"
    assert [a["policyVersion"] for a in run["status"]["checkpoint"]["approvals"]] == ["v1", "v2"]

    decide(people["alice"], runs, name, second["requestId"], second["digest"])
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    assert list(refsystem.counts().values()) == [1], "sent once, after the approval under v2"
    events = [h["event"] for h in assert_history_is_gapless(done)]
    assert events.count("approval_decided") == 2
    assert events.count("reapproval_required") == 1
    approvals = done["status"]["checkpoint"]["approvals"]
    assert [(a["requestId"], a["decision"]) for a in approvals] == [
        ("pay-1", "approved"),
        ("pay-2", "approved"),
    ]


def test_evidence_that_changes_between_the_revalidation_and_its_write_asks_again(
    kube: KubeEnv,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
    readable_configmap: str,
) -> None:
    """The same window for the evidence the approver was shown (evidenceChanged: reapprove): the
    ConfigMap changes while the write carrying the approved intent is held."""
    policy(runs, version="v1")
    op = webhook_operator(DURABLE_AGENTS_TEST_COMMIT_DELAY=HELD)
    name = runs.create(payment(refsystem.url, read=readable_configmap), name="late-evidence")
    request = pending(runs, name)
    held = f"test hook: commit to {runs.namespace}/{name} held"
    writes_before = op.log_path.read_text().count(held)
    decide(people["alice"], runs, name, request["requestId"], request["digest"])
    eventually(
        lambda: op.logged(held, times=writes_before + 1),
        Within.COMMIT,
        "the batch carrying the approval to be decided and its write held",
    )
    client.CoreV1Api(kube.api).patch_namespaced_config_map(
        readable_configmap, runs.namespace, {"data": {"maxSurge": "90%"}}
    )
    second = eventually(
        lambda: (
            (runs.get(name)["status"].get("approvalRequest") or {}).get("requestId") == "pay-2"
            and runs.get(name)["status"]["approvalRequest"]
        ),
        Within.COMMIT,
        "a new approval request after the evidence changed",
    )
    assert op.logged("evidence the approval was revalidated against changed before its write"), op.log_tail()
    assert "evidence changed during the wait: ConfigMap/settings" in second["policyReason"]
    assert refsystem.counts() == {}, "nothing is sent on the evidence the first approval saw"
    assert action_records(runs) == []
    decide(people["alice"], runs, name, second["requestId"], second["digest"])
    runs.wait_state(name, "completed", timeout=Within.RUN)
    assert list(refsystem.counts().values()) == [1]


def test_the_dispatcher_does_not_send_an_intent_whose_approval_the_current_policy_no_longer_accepts(
    webhook_operator: Callable[..., OperatorProcess],
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    """The second line: an intent committed under v1 (its write's own check passed), and the policy
    moves to v2 before the dispatcher looks at it. The dispatcher reads the policy fresh: nothing
    is sent; the record fails ``PolicyChanged`` (not applied); the retry asks for approval again."""
    policy(runs, version="v1")
    retry = {"spec": {"retry": {"maxAttempts": 2, "initialBackoff": "1s"}}}
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentpolicies", "payments", retry
    )
    # The worker (and webhook) without a dispatcher: the intent waits in the ledger, unsent.
    worker = webhook_operator(DURABLE_AGENTS_DISPATCHER="off")
    policy_known(worker, runs, "v1")
    name = runs.create(payment(refsystem.url), name="sent-late")
    request = pending(runs, name)
    decide(people["alice"], runs, name, request["requestId"], request["digest"])
    runs.wait_state(name, "waiting_external", timeout=Within.COMMIT)
    (record,) = eventually(lambda: action_records(runs), Within.COMMIT, "the intent's ActionRecord")

    policy(runs, version="v2")  # after the intent's write, before any send
    start_operator("dispatcher", 2, DURABLE_AGENTS_WORKERS="0")
    refused = eventually(
        lambda: (
            (got := actionrecord(runs, record)).get("status", {}).get("state") == "failed" and got["status"]
        ),
        Within.COMMIT,
        "the dispatcher to refuse the intent approved under v1",
    )
    assert refused["reason"] == "PolicyChanged", refused
    assert "approval pay-1 no longer binds: policy changed from v1 to v2" in refused["message"]
    assert refsystem.counts() == {}, "nothing sent under the approval given for v1"

    second = eventually(
        lambda: (
            (runs.get(name)["status"].get("approvalRequest") or {}).get("policyVersion") == "v2"
            and runs.get(name)["status"]["approvalRequest"]
        ),
        Within.COMMIT,
        "the retry to ask for approval under v2",
    )
    assert second["requestId"] == "pay-2"
    assert refsystem.counts() == {}
    decide(people["alice"], runs, name, second["requestId"], second["digest"])
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    assert list(refsystem.counts().values()) == [1], "sent once, after the approval under v2"
    assert [c["outcome"] for c in done["status"]["checkpoint"]["toolCalls"]] == ["failed", "succeeded"]


def test_the_check_before_the_write_costs_no_write(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    """An approved payment with the policy unchanged: the same status writes as without the check
    (a cache lookup and a comparison before each write that carries a policy decision)."""
    policy(runs, version="v1")
    port = free_port()
    op = webhook_operator(DURABLE_AGENTS_METRICS_PORT=str(port))
    policy_known(op, runs, "v1")
    name = runs.create(payment(refsystem.url), name="unchanged")
    request = pending(runs, name)
    decide(people["alice"], runs, name, request["requestId"], request["digest"])
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    transitions = len(assert_history_is_gapless(done))
    # Three writes: accepted + the approval request; the approval taken in + revalidated + the
    # intent; the outcome taken in + revalidated + succeeded.
    text = scrape_when(port, {"durable_agents_transitions_per_write_count": 3})
    assert metric(text, 'durable_agents_api_writes_total{resource="agentruns/status",verb="update"}') == 3
    assert metric(text, "durable_agents_transitions_per_write_sum") == transitions
    assert metric(text, "durable_agents_batches_outdated_total") == 0
    assert list(refsystem.counts().values()) == [1]


def action_records(runs: Runs) -> list[str]:
    listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
    return [item["metadata"]["name"] for item in listed["items"]]


def actionrecord(runs: Runs, name: str) -> dict[str, Any]:
    got: dict[str, Any] = runs.custom.get_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "actionrecords", name
    )
    return got
