"""An answer or an event is acted on only when the operator's admission webhook admitted it.

The webhook checks verb ``answer`` (a SubjectAccessReview) and seals the value with the run's data
key, bound to ``answers/<key>`` (``events/<key>``): its seal is its proof. With the webhook off (a
misconfiguration, an outage), someone with ``patch`` on the run writes the awaited answer or event
by hand. The second line: it is not acted on (nothing after the question runs), it is refused once
in ``status.refusedRequests`` with its reason, and since its key is taken for good (the maps are
append-only) the run waits again under a new key. Once the webhook is back, the person answers
that key (``kubectl agentrun answer``, as people do) and the run completes.

Real users (client certificates), RBAC made by the test, the reference system counting
applications of the effect after the question.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from e2e.test_authority import on_runs, refusal_events, webhook_off
from e2e.test_interruptions import ASK, DONE, pay, run_spec
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.kubectl import main as kubectl_plugin
from durable_agents.kubectl import why as kubectl_why
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless

LEASE = 2
KUBECTL_AGENTRUN = (sys.executable, "-m", "durable_agents.kubectl.main")
AWAIT = {"name": "window", "await": {"event": "window"}}


@pytest.fixture
def erin(kube: KubeEnv, plane: LocalControlPlane, namespace: str) -> str:
    """erin may answer the runs (verb ``answer``): the kubeconfig of the person the run waits for."""
    grant(kube, namespace, "erin", [on_runs("patch", "answer")])
    return str(plane.write_user_kubeconfig("erin", []))


def refused_keys(run: dict[str, Any], field: str) -> list[tuple[str, str]]:
    return [
        (r["key"], r["reason"])
        for r in (run.get("status") or {}).get("refusedRequests") or []
        if r["field"] == field
    ]


def waiting_under(runs: Runs, name: str, waiting_for: str) -> dict[str, Any]:
    return eventually(
        lambda: (
            (run := runs.get(name))["status"].get("waitingFor") == waiting_for
            and run["status"]["state"] in ("waiting_input", "waiting_external")
            and run
        ),
        Within.RUN,
        f"the run to refuse the hand-written value and wait again as {waiting_for}",
    )


def forged_while_webhook_off(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    spec: dict[str, Any],
    state: str,
) -> tuple[str, OperatorProcess]:
    """A run created through the webhook (it has a data key), waiting; then the webhook is off."""
    first = webhook_operator("with-webhook")
    runs.await_webhook()
    name = runs.create(spec)
    created = runs.wait_state(name, state)
    assert created["metadata"]["annotations"].get("durable-agents.io/data-key"), "sealing is on"
    eventually(lambda: not runs.leases(), Within.COMMIT, "the run's Lease to be released")
    webhook_off(kube, runs, first)
    return name, start_operator("no-webhook", LEASE)


@pytest.mark.local_plane("users", "webhook")
def test_an_answer_written_with_the_webhook_off_is_refused_and_the_run_asks_again(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    erin: str,
    refsystem: ReferenceSystemThread,
) -> None:
    name, no_webhook = forged_while_webhook_off(
        kube, start_operator, webhook_operator, runs, run_spec(ASK, pay(refsystem.url), DONE), "waiting_input"
    )
    assert runs.get(name)["status"]["waitingFor"] == "input:confirm"

    # Plaintext, as anyone with patch can write it: not sealed, so not written through the webhook.
    runs.patch_spec(name, {"answers": {"confirm": "yes"}}, stamped=False)
    run = waiting_under(runs, name, "input:confirm.2")
    assert refused_keys(run, "answers") == [("confirm", "Unsealed")]
    condition = {c["type"]: c for c in run["status"]["conditions"]}["RequestRefused"]
    assert (condition["status"], condition["reason"]) == ("True", "Unsealed")
    assert "answers[confirm] refused: the answer is not sealed" in condition["message"]
    assert run["status"]["checkpoint"]["pendingInput"]["key"] == "confirm.2"
    assert run["status"]["checkpoint"]["pendingInput"]["requestId"] == "confirm", "the question stays"
    assert "asked again as spec.answers[confirm.2]" in condition["message"]
    events = eventually(lambda: refusal_events(runs, name), Within.COMMIT, "a RequestRefused Event")
    assert "asked again as spec.answers[confirm.2]" in events[0], "the Event names the new key"

    # A sealed value copied from elsewhere in the run (the question's own seal) does not open
    # under answers/confirm.2: refused too, and asked again under the next key.
    sealed_question = run["spec"]["steps"][0]["ask"]["question"]
    runs.patch_spec(name, {"answers": {"confirm.2": sealed_question}}, stamped=False)
    run = waiting_under(runs, name, "input:confirm.3")
    assert refused_keys(run, "answers") == [("confirm", "Unsealed"), ("confirm.2", "SealInvalid")]
    assert refsystem.counts() == {}, "nothing after the question ran on a hand-written answer"
    assert not run["status"]["checkpoint"].get("inputRefs"), "no answer was recorded"
    # What people read says which key is awaited now.
    assert "spec.answers['confirm.3']" in kubectl_plugin.describe(run)
    wake = kubectl_why.wakes(run)[0]
    assert "confirm.3" in wake["what"]
    assert wake["commands"][0].startswith("kubectl agentrun answer ")

    # The webhook is back: erin answers the question through the plugin, under the key awaited now.
    no_webhook.stop()
    webhook_operator("webhook-again")
    runs.await_webhook()
    out = subprocess.run(
        [*KUBECTL_AGENTRUN, "answer", name, "yes", "-n", runs.namespace],
        env={**os.environ, "KUBECONFIG": erin},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "answered as spec.answers['confirm.3']" in out.stdout
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    assert list(refsystem.counts().values()) == [1], "one application, after the real answer"
    assert refsystem.duplicates() == []
    refs = done["status"]["checkpoint"]["inputRefs"]
    assert [ref["uri"].rsplit("/", 1)[1] for ref in refs] == ["confirm.3"]
    assert refused_keys(done, "answers") == [("confirm", "Unsealed"), ("confirm.2", "SealInvalid")]
    assert len(refusal_events(runs, name)) == 2, "one Event per refused answer"
    assert_history_is_gapless(done)


@pytest.mark.local_plane("webhook")
def test_an_event_delivered_with_the_webhook_off_is_refused_and_awaited_again(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    name, no_webhook = forged_while_webhook_off(
        kube,
        start_operator,
        webhook_operator,
        runs,
        run_spec(AWAIT, pay(refsystem.url), DONE),
        "waiting_external",
    )
    assert runs.get(name)["status"]["waitingFor"] == "event:window"
    runs.patch_spec(name, {"events": {"window": "open"}}, stamped=False)
    run = waiting_under(runs, name, "event:window.2")
    assert refused_keys(run, "events") == [("window", "Unsealed")]
    assert run["status"]["checkpoint"]["pendingExternal"]["key"] == "window.2"
    assert refsystem.counts() == {}, "nothing after the event ran on a hand-written one"

    no_webhook.stop()
    webhook_operator("webhook-again")
    runs.await_webhook()
    runs.patch_spec(name, {"events": {"window.2": "open"}})  # sealed, as through the webhook
    done = runs.wait_state(name, "completed", timeout=Within.RUN)
    assert list(refsystem.counts().values()) == [1]
    assert refused_keys(done, "events") == [("window", "Unsealed")]
    assert_history_is_gapless(done)


@pytest.mark.local_plane("webhook")
def test_a_data_key_annotation_removed_with_the_webhook_off_does_not_make_an_answer_count(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    """Without its data-key annotation the run would look like one created before sealing (whose
    answers are believed in clear); its stamped checkpoint remembers the key's fingerprint."""
    name, no_webhook = forged_while_webhook_off(
        kube, start_operator, webhook_operator, runs, run_spec(ASK, pay(refsystem.url), DONE), "waiting_input"
    )
    assert runs.get(name)["status"]["checkpoint"]["dataKeyDigest"].startswith("hmac-sha256:")
    remove = {"metadata": {"annotations": {"durable-agents.io/data-key": None}}}
    runs.custom.patch_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentruns", name, remove)
    runs.patch_spec(name, {"answers": {"confirm": "yes"}}, stamped=False)
    run = runs.wait_state(name, "quarantined", timeout=Within.RUN)
    assert run["status"]["outcome"]["reason"] == "Undecryptable"
    assert "annotation is gone" in run["status"]["outcome"]["message"]
    assert refsystem.counts() == {}, "nothing after the question ran"
    assert not run["status"]["checkpoint"].get("inputRefs")

    # The webhook back: it gives the run no new key (it would not be the run's); an answer is
    # refused, naming the repair.
    no_webhook.stop()
    webhook_operator("webhook-again")
    runs.await_webhook()
    with pytest.raises(ApiException) as refused:
        runs.patch_spec(name, {"answers": {"confirm.2": "yes"}}, stamped=False)
    assert "annotation is gone" in str(refused.value.body)
    assert "durable-agents.io/data-key" not in (runs.get(name)["metadata"].get("annotations") or {})
    assert refsystem.counts() == {}
