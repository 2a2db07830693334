"""Limits at admission, with the operator's webhook on: every size, nesting and duration case of
issue 13 is refused with a message naming the field (never a 413 or a 500), the operator keeps
serving valid runs after each, and a run at the bounds completes: its approval request (arguments
copied) and full status fit in etcd, and it can be answered, approved and cancelled.

The refusal messages printed here (``pytest -s``) are the ones in the "Limits" table of
docs/reference/limits.md.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.digest import canonical_json
from durable_agents.core.limits import CREATE_BUDGET, MAX_NESTING, MAX_VALUE_BYTES, stored_size
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

LEASE = 2


@pytest.fixture
def alice(kube: KubeEnv, plane: LocalControlPlane, namespace: str) -> client.ApiClient:
    """An approver (a real user with a client certificate; the creator may not approve)."""
    grant(kube, namespace, "alice", rule(GROUP, "agentruns", "get", "patch", "approve"), name="approver")
    return kube.user_client("alice", ["approvers"])


def policy(runs: Runs) -> None:
    spec = {
        "version": "v1",
        "tiers": {"http.post": "consequential"},
        "approvalRequiredTiers": ["consequential"],
        "approvalExpiry": "1h",
    }
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "pay"},
        "spec": spec,
    }
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentpolicies", body)


def nest(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def effect(name: str, url: str, arguments: Any, **target: Any) -> dict[str, Any]:
    return {
        "name": name,
        "effect": {
            "effect": "http.post",
            "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects", **target},
            "arguments": arguments,
        },
    }


def spec_of(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"taskType": "limits", "objective": "try a limit", "steps": list(steps), **extra}


def finish() -> dict[str, Any]:
    return {"name": "done", "complete": {"result": "ok"}}


@contextmanager
def deep_json() -> Iterator[None]:
    """The Python client serializes recursively: room for the 1500-level documents we send."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)


def refusal(call: Callable[[], Any]) -> tuple[int, str]:
    with pytest.raises(client.ApiException) as err, deep_json():
        call()
    body = err.value.body
    try:
        message = str(json.loads(body).get("message", body))
    except (TypeError, ValueError):
        message = str(body)
    return int(err.value.status), message


def create(runs: Runs, spec: dict[str, Any], name: str) -> None:
    """Through the webhook as a user writes it (not pre-stamped by the test kit)."""
    runs.create(spec, name=name, stamped=False)


def bad_cases(url: str) -> list[tuple[str, dict[str, Any], str]]:
    return [
        (
            "arguments-900kb",
            spec_of(effect("pay", url, {"blob": "x" * 900_000})),
            "spec.steps[0].effect.arguments:",
        ),
        ("objective-1mb", spec_of(finish(), objective="x" * 1_000_000), "spec.objective: 1000000 characters"),
        (
            "nested-700",
            spec_of(effect("pay", url, nest(700))),
            "spec.steps[0].effect.arguments: nested more than 32",
        ),
        (
            "nested-1500",
            spec_of(effect("pay", url, nest(1500))),
            "spec.steps[0].effect.arguments: nested more than",
        ),
        (
            "target-nested-40",
            spec_of(effect("pay", url, {"n": 1}, extra=nest(40))),
            "spec.steps[0].effect.target: nested more than 32",
        ),
        (
            "duration-overflow",
            spec_of({"name": "q", "ask": {"question": "?", "expiresIn": "99999999999999999999h"}}),
            "spec.steps[0].ask.expiresIn: '99999999999999999999h' is not a duration",
        ),
        (
            "duration-digits",
            spec_of({"name": "w", "await": {"event": "go", "expiresIn": "1" * 31 + "s"}}),
            "spec.steps[0].await.expiresIn:",
        ),
        (
            "duration-over-a-year",
            spec_of(
                {
                    "name": "c",
                    "child": {"taskType": "t", "objective": "o", "steps": [finish()], "expiresIn": "9000h"},
                }
            ),
            "spec.steps[0].child.expiresIn: '9000h' is longer than 8760h (one year)",
        ),
        (
            "question-5000",
            spec_of({"name": "q", "ask": {"question": "q" * 5000}}),
            "spec.steps[0].ask.question: 5000 characters, at most 4096",
        ),
        (
            "steps-65",
            spec_of(*({"name": f"s{i}", "complete": {}} for i in range(65))),
            "spec.steps: Too many",
        ),
        (
            "total-over-budget",
            spec_of(*(effect(f"pay-{i}", url, {"blob": "x" * 60_000}) for i in range(8))),
            "spec: the run takes",
        ),
    ]


@pytest.mark.local_plane("webhook")
def test_each_bad_input_is_refused_naming_the_field_and_valid_runs_still_complete(
    webhook_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    op = webhook_operator()
    for case, spec, field in bad_cases(refsystem.url):
        status, message = refusal(lambda spec=spec, case=case: create(runs, spec, f"bad-{case}"))
        print(f"\n[{case}] HTTP {status}: {message}")
        assert status == 422, (case, status, message)
        assert field in message, (case, message)
        if "arguments" in field or "spec:" in field:
            assert '{"valueFrom": {"secretKeyRef": {"name": ..., "key": ...}}}' in message
        good = f"good-after-{case}"
        create(runs, spec_of(finish()), good)
        runs.wait_state(good, "completed", timeout=Within.COMMIT)
    assert not [run for run in runs.all() if run["metadata"]["name"].startswith("bad-")]
    assert op.alive, "the operator never restarted"


def test_the_schema_refuses_long_durations_without_the_webhook(runs: Runs) -> None:
    """The API server's own rule (CEL, in the AgentRun spec policy: api/spec_policy.py): a duration
    over a year, named by the API server."""
    spec = spec_of({"name": "q", "ask": {"question": "?", "expiresIn": "8761h"}})
    status, message = refusal(lambda: runs.create(spec, name="over-a-year"))
    print(f"\n[schema] HTTP {status}: {message}")
    assert status == 422
    assert "spec.steps[].ask.expiresIn: expiresIn must be at most 8760h (one year)" in message
    status, message = refusal(
        lambda: runs.create(spec_of({"name": "q", "ask": {"question": "?", "expiresIn": "1234567h"}}))
    )
    assert status == 422
    assert "spec.steps[0].ask.expiresIn" in message


def at_the_bounds(url: str) -> dict[str, Any]:
    """Every per-field bound at once, and the whole run near its creation budget: a question of
    4096 characters, a one-year wait, arguments of exactly 64 KiB nested 32 levels, targets of
    64 KiB, a 4096-character objective."""
    deep = nest(MAX_NESTING - 1)  # with the arguments object itself: 32 levels
    pad = MAX_VALUE_BYTES - len(canonical_json({"blob": "", "deep": deep}))
    arguments = {"blob": "x" * pad, "deep": deep}
    assert len(canonical_json(arguments)) == MAX_VALUE_BYTES
    target_pad = "t" * (MAX_VALUE_BYTES - 200)
    steps = [
        {"name": "confirm", "ask": {"question": "q" * 4096, "expiresIn": "8760h"}},
        *(effect(f"pay-{i}", url, arguments, pad=target_pad) for i in range(2)),
        effect("pay-2", url, arguments),
        finish(),
    ]
    return spec_of(*steps, objective="o" * 4096, policyRef={"name": "pay"})


def asked(runs: Runs, name: str, step: str) -> dict[str, Any] | None:
    run = runs.get(name)
    status = run.get("status") or {}
    waiting = status.get("state") == "waiting_approval"
    return run if waiting and (status.get("approvalRequest") or {}).get("step") == step else None


@pytest.mark.local_plane("users", "webhook")
def test_a_run_at_the_bounds_completes_and_can_be_answered_approved_and_cancelled(
    webhook_operator: Callable[..., OperatorProcess],
    runs: Runs,
    alice: client.ApiClient,
    refsystem: ReferenceSystemThread,
) -> None:
    policy(runs)
    webhook_operator()
    spec = at_the_bounds(refsystem.url)
    name = "b" * 253  # the longest name the API allows
    probe = {
        "metadata": {"name": name, "annotations": {"durable-agents.io/data-key": "k" * 80}},
        "spec": spec,
    }
    size = stored_size(probe)
    print(f"\nrun at the bounds: {size} bytes as stored (budget {CREATE_BUDGET})")
    assert CREATE_BUDGET - 64 * 1024 < size <= CREATE_BUDGET
    create(runs, spec, name)
    runs.wait_state(name, "waiting_input", timeout=Within.COMMIT)

    # An answer over 4096 characters is refused by name; one at the bound is taken (an UPDATE of
    # a large run: the review holds the object twice, which aiohttp's 1 MiB default refused).
    status, message = refusal(
        lambda: runs.patch_spec(name, {"answers": {"confirm": "y" * 4097}}, stamped=False)
    )
    print(f"[answer-too-long] HTTP {status}: {message}")
    assert status == 422
    assert "spec.answers['confirm']: 4097 characters, at most 4096" in message
    runs.patch_spec(name, {"answers": {"confirm": "y" * 4096}}, stamped=False)

    for step in ("pay-0", "pay-1", "pay-2"):
        run = eventually(
            lambda step=step: asked(runs, name, step), Within.COMMIT, f"the approval request for {step}"
        )
        request = run["status"]["approvalRequest"]
        assert "durable-agents.io/sealed" in request["arguments"], "the arguments are copied, sealed"
        whole = len(json.dumps(run, separators=(",", ":")))
        print(f"{step}: the run with its approval request is {whole} bytes")
        decision = {"digest": request["digest"], "decision": "approve"}
        client.CustomObjectsApi(alice).patch_namespaced_custom_object(
            GROUP,
            VERSION,
            runs.namespace,
            "agentruns",
            name,
            {"spec": {"approvals": {request["requestId"]: decision}}},
        )
    done = runs.wait_state(name, "completed", timeout=Within.TAKEOVER)
    assert len(refsystem.counts()) == 3
    assert set(refsystem.counts().values()) == {1}
    print(f"completed: {len(json.dumps(done, separators=(',', ':')))} bytes")

    # The same run, cancelled while it waits: an UPDATE of a large run that must work.
    other = "c" * 253
    create(runs, spec, other)
    runs.wait_state(other, "waiting_input", timeout=Within.COMMIT)
    runs.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        runs.namespace,
        "agentruns",
        other,
        {"spec": {"cancellations": {"stop": {"scope": "task"}}}},
    )
    canceled = runs.wait_state(other, "canceled", timeout=Within.COMMIT)
    assert canceled["status"]["outcome"]["reason"]
