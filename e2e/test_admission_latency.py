"""A cancellation of a run of the largest admitted size, sent while the operator works that run,
passes the operator's admission webhook (failurePolicy Fail: a webhook that does not answer within
its timeout refuses the request) and the run then cancels (issue 30).

The webhook answers from a process of its own (:mod:`durable_agents_controllers.webhook_process`),
not from the one where the worker decides the run's transitions (each one validates and verifies
the whole 448 KiB run, in long C calls that hold the interpreter lock). How long the answer takes is
measured by ``make bench-admission`` (bench/admission.py), never asserted here; that the answer
does not wait for the worker is proven by holding the worker's interpreter lock on purpose
(``DURABLE_AGENTS_TEST_HOLD_INTERPRETER``) longer than the webhook's timeout.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.limits import CREATE_BUDGET
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.large_runs import MARGIN, largest_run, size_of
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port, metric, scrape

TERMINAL = ("completed", "canceled", "failed", "quarantined")


@pytest.mark.local_plane("webhook")
def test_a_cancel_on_a_run_of_the_largest_size_being_worked_is_admitted_and_the_run_cancels(
    kube: KubeEnv,
    namespace: str,
    runs: Runs,
    refsystem: ReferenceSystemThread,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    op = start_operator("latency", DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()
    hooks = client.AdmissionregistrationV1Api(kube.api)
    (config,) = [
        c for c in hooks.list_mutating_webhook_configuration().items if c.metadata.name.endswith(namespace)
    ]
    (webhook,) = [w for w in config.webhooks if "agentruns" in w.rules[0].resources]
    assert webhook.failure_policy == "Fail", "a webhook that does not answer in time refuses the write"

    name = "largest"
    spec = largest_run(refsystem.url, name, hold=True)
    assert CREATE_BUDGET - MARGIN - 4096 < size_of(name, spec) <= CREATE_BUDGET
    runs.create(spec, name=name, stamped=False)  # through the webhook, as a user writes it

    def being_worked() -> int | None:
        status = runs.get(name).get("status") or {}
        version = int(status.get("stateVersion") or 0)
        return version if version >= 1 and status.get("state") not in TERMINAL else None

    version = eventually(being_worked, Within.TAKEOVER, f"{name} being worked")
    # Raises on a refusal, a webhook timeout ("failed calling webhook ... context deadline exceeded")
    # among them.
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentruns", name, {"spec": {"cancellations": {"stop": {"scope": "task"}}}}
    )
    entry = runs.get(name)["spec"]["cancellations"]["stop"]
    assert entry.get("stamp"), "stamped by the webhook"
    assert entry["requestedBy"]["username"], "who asked, written by the webhook"

    canceled = runs.wait_state(name, "canceled", timeout=Within.TAKEOVER)
    assert canceled["status"]["outcome"]["reason"]
    assert canceled["status"]["stateVersion"] > version
    print(f"\ncancelled at v{version} of {canceled['status']['stateVersion']}; {size_of(name, spec)} bytes")


HOLD_SECONDS = 30  # three times the webhook's timeout (10 s): an answer from the held process fails


@pytest.mark.local_plane("webhook")
def test_a_cancel_is_admitted_while_the_worker_holds_the_interpreter_lock_longer_than_the_webhook_timeout(
    kube: KubeEnv,
    namespace: str,
    runs: Runs,
    refsystem: ReferenceSystemThread,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    name = "held"
    metrics_port = free_port()
    op = start_operator(
        "held",
        DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()),
        DURABLE_AGENTS_METRICS_PORT=str(metrics_port),
        DURABLE_AGENTS_TEST_HOLD_INTERPRETER=f"{name}:{HOLD_SECONDS}",
    )
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    runs.await_webhook()
    runs.create(largest_run(refsystem.url, name, hold=True), name=name, stamped=False)
    held = f"test hook: commit to {namespace}/{name} holds the interpreter lock"
    released = "test hook: interpreter lock released"
    eventually(lambda: op.logged(held), Within.TAKEOVER, f"the worker holding the interpreter at {name}")

    # Both webhooks (failurePolicy Fail, timeout 10 s) review this patch while the operator's
    # process can run nothing for HOLD_SECONDS: it is admitted only if they answer from elsewhere.
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentruns", name, {"spec": {"cancellations": {"stop": {"scope": "task"}}}}
    )
    assert not op.logged(released), "admitted while the worker held the interpreter lock, not after"
    entry = runs.get(name)["spec"]["cancellations"]["stop"]
    assert entry.get("stamp"), "stamped by the mutating webhook"
    assert entry["requestedBy"]["username"], "who asked, written by the mutating webhook"

    eventually(lambda: op.logged(released), HOLD_SECONDS + Within.COMMIT, "the hold to end")
    canceled = runs.wait_state(name, "canceled", timeout=Within.TAKEOVER)
    assert canceled["status"]["outcome"]["reason"]
    # The webhook process's own metrics, served by the operator's endpoint (multiprocess mode).
    reviewed = metric(
        scrape(metrics_port),
        'durable_agents_admission_review_seconds_count{allowed="true",resource="agentruns"}',
        0,
    )
    assert reviewed >= 4, "the create and the cancel, each through both webhooks, counted"
    assert op.alive, op.log_tail()
