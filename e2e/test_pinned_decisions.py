"""Decisions pinned to what the approver reviewed: ``kubectl agentrun approve RUN --request ID
--digest D``. A request superseded between ``status`` and ``approve`` (the policy changed with
``policyChanged: reapprove``, and another approver's decision made the run ask again under the
new version) is refused by the plugin, naming both digests, and nothing is sent; the same stale
digest written under the current request's key is refused by the admission webhook; the new
request, approved pinned, is applied once.

The supersession is deterministic: the operator knows v2 before carol decides (``policy_known``),
and the decision on the v1 request is what makes the run ask again.
"""

from __future__ import annotations

import contextlib
import io
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e.test_approvals import payment, pending, people, policy, policy_known
from kubernetes import client

from durable_agents.kubectl import decide as kubectl_decide
from durable_agents.kubectl import main as kubectl_plugin
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

__all__ = ["people"]  # a fixture, shared with test_approvals
pytestmark = pytest.mark.local_plane("users", "webhook")


def agentrun(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    """``kubectl agentrun ARGS`` in-process as the user of ``kubeconfig``: (exit code, out, err)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = kubectl_plugin.main([*args, "--kubeconfig", str(kubeconfig)])
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


def pinned_command(status_output: str, decision: str = "approve") -> list[str]:
    """The pinned command ``kubectl agentrun status`` printed, as plugin arguments."""
    line = next(line for line in status_output.splitlines() if line.strip().startswith(f"{decision}:"))
    words = shlex.split(line.split(":", 1)[1])
    assert words[:3] == ["kubectl", "agentrun", decision], line
    return words[2:]


def test_a_request_superseded_after_review_is_refused_and_the_new_one_applied_once(
    plane: LocalControlPlane,
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    people: dict[str, client.ApiClient],
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs, version="v1")  # policyChanged: reapprove
    op = webhook_operator()
    name = runs.create(payment(refsystem.url), name="pinned")
    first = pending(runs, name)
    alice = plane.write_user_kubeconfig("alice", ["approvers"])
    carol = plane.write_user_kubeconfig("carol", ["approvers"])

    # alice reviews the request: status prints the exact, pinned command.
    code, shown, err = agentrun(alice, "status", name, "-n", runs.namespace)
    assert code == 0, err
    reviewed = pinned_command(shown)
    assert reviewed[-4:] == ["--request", first["requestId"], "--digest", first["digest"]]
    assert pinned_command(shown, "reject")[-1] == first["digest"]

    # Meanwhile the policy moves to v2 and carol decides the v1 request: the run asks again.
    policy(runs, version="v2")
    policy_known(op, runs, "v2")
    code, _, err = agentrun(carol, *pinned_command(shown))
    assert code == 0, err
    second = eventually(
        lambda: (
            (runs.get(name)["status"].get("approvalRequest") or {}).get("policyVersion") == "v2"
            and runs.get(name)["status"]["approvalRequest"]
        ),
        Within.TAKEOVER,
        "a new request under policy v2",
    )
    assert second["digest"] != first["digest"]

    # alice's approval of what she reviewed is refused by the plugin, naming both digests.
    code, out, err = agentrun(alice, *reviewed)
    assert code == 1, out
    assert "the request you reviewed was superseded" in err
    assert first["digest"] in err
    assert second["digest"] in err
    assert f"the pending request is {second['requestId']}" in err
    assert "policy version v2" in err
    assert f"--request {second['requestId']} --digest {second['digest']}" in err, (
        "the command for the new one"
    )
    decided_by = {k: d["approver"]["username"] for k, d in runs.get(name)["spec"]["approvals"].items()}
    assert decided_by == {first["requestId"]: "carol"}, "nothing was sent for alice"
    assert refsystem.counts() == {}, "nothing applied"

    # Past the plugin's check (a request superseded between its read and its write), the webhook
    # refuses the stale digest under the current request's key.
    api = client.CustomObjectsApi(people["alice"])
    with pytest.raises(client.ApiException) as refused:
        kubectl_decide.send(api, runs.namespace, name, second["requestId"], first["digest"], "approve", None)
    assert refused.value.status in (403, 422), refused.value.body
    assert f"the request binds {second['digest']}" in str(refused.value.body)

    # A digest not of the right form is said so, before anything is read or sent.
    code, _, err = agentrun(alice, *reviewed[:-1], first["digest"].upper())
    assert code == 1
    assert "64 lower-case hex digits" in err

    # The new request, reviewed and approved pinned: applied once.
    code, shown, err = agentrun(alice, "status", name, "-n", runs.namespace)
    assert code == 0, err
    code, out, err = agentrun(alice, *pinned_command(shown))
    assert code == 0, err
    assert f"approve sent for request {second['requestId']}" in out
    done: dict[str, Any] = runs.wait_state(name, "completed", timeout=Within.RUN)
    assert list(refsystem.counts().values()) == [1], "applied once"
    approvals = done["status"]["checkpoint"]["approvals"]
    assert [(a["requestId"], a["decidedBy"], a["policyVersion"]) for a in approvals] == [
        (first["requestId"], "carol", "v1"),
        (second["requestId"], "alice", "v2"),
    ]
    code, _, err = agentrun(alice, *pinned_command(shown))
    assert code == 1, "a decision on a request no longer pending is refused"
    assert "no pending approval request" in err
