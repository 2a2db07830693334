"""The pure pieces of "no run is ever stuck silently": long names fit labels, an unparseable URL
is a definite failure, and the worker's failure count is bounded, with backoff."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.core.engine import RunSnapshot
from durable_agents.core.engine.children import child_run_name, label_value
from durable_agents.shell.effects.http import target_problem
from durable_agents.shell.ownership.leases import LeaseRecord, lease_name, run_label, run_of_lease
from durable_agents.shell.runs.failures import Failures, describe, transient

pytestmark = pytest.mark.unit

LABEL = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LONG = ("a" * 60 + ".") * 4 + "b" * 8  # 252 characters, dots where a cut may fall


@pytest.mark.parametrize("name", ["run-1", "x" * 63, "x" * 64, LONG, "r" * 253, "a" * 239 + ".b"])
def test_a_runs_label_and_lease_name_are_valid_whatever_its_length(name: str) -> None:
    label, lease = run_label(name), lease_name(name)
    assert len(label) <= 63
    assert LABEL.match(label), label
    assert len(lease) <= 253
    assert SUBDOMAIN.match(lease), lease
    if len(name) <= 63:
        assert label == name, "a name that fits is its own label (selectors keep working)"
    assert run_label(name) == label, "stable: a selector on it finds what was labelled"


def test_long_names_that_share_a_prefix_get_different_labels_and_leases() -> None:
    one, two = "a" * 252 + "1", "a" * 252 + "2"
    assert run_label(one) != run_label(two)
    assert lease_name(one) != lease_name(two)
    assert child_run_name("p" * 60, "step") == label_value("p" * 60 + "-step")


def _lease(run: str, label: str, owner: str) -> dict[str, Any]:
    return {
        "name": lease_name(run),
        "namespace": "ns",
        "resourceVersion": "1",
        "labels": {RUN_LABEL: label},
        "ownerReferences": [{"kind": "AgentRun", "name": owner, "uid": "u1"}],
    }


def test_a_long_named_runs_lease_is_traced_back_to_the_run_and_is_its_own() -> None:
    name = "r" * 253
    meta = _lease(name, run_label(name), name)
    assert run_of_lease(meta) == name
    record = LeaseRecord.from_dict({"metadata": meta, "spec": {}})
    assert record.foreign_because(name, "u1") is None
    # A label that names another run is not this run's, however long.
    other = _lease(name, run_label("s" * 253), name)
    assert run_of_lease(other) == run_label("s" * 253)
    assert LeaseRecord.from_dict({"metadata": other, "spec": {}}).foreign_because(name, "u1") is not None


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[not-a-url", "is not a URL"),
        ("ftp://files.example/x", "not an http(s) URL"),
        ("payments.example/api", "not an http(s) URL"),
        ("http://", "names no host"),
        ("https://a.example:99999/", "is not a URL"),
        (None, "needs target.url"),
        (42, "needs target.url"),
    ],
)
def test_an_http_target_that_cannot_be_posted_to_is_a_definite_error(url: object, why: str) -> None:
    problem = target_problem(url)
    assert problem is not None
    assert why in problem


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/pay", "https://payments.example/api?x=1"])
def test_a_valid_http_target_has_no_problem(url: str) -> None:
    assert target_problem(url) is None


def _run(version: int, state: str = "ready") -> RunSnapshot:
    return RunSnapshot.from_object(
        {
            "metadata": {"name": "r", "namespace": "ns", "uid": "u", "resourceVersion": "1"},
            "spec": {"taskType": "t", "objective": "o"},
            "status": {"state": state, "stateVersion": version},
        }
    )


KEY = ("ns", "r")


def test_failures_are_retried_with_exponential_backoff_then_quarantined() -> None:
    failures = Failures()
    failures.at(KEY, "commit", _run(3), "step_completed")
    verdicts = [failures.failed(KEY, KeyError("x")) for _ in range(5)]
    assert [v.attempts for v in verdicts] == [1, 2, 3, 4, 5]
    assert [v.delay for v in verdicts] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert [v.quarantine for v in verdicts] == [False, False, False, False, True]
    assert verdicts[-1].where.describe() == "commit of the transition ready --step_completed-->"


def test_failures_count_per_state_version_and_a_finished_unit_clears_them() -> None:
    failures = Failures()
    failures.at(KEY, "decide", _run(3))
    for _ in range(4):
        failures.failed(KEY, ValueError("x"))
    failures.at(KEY, "decide", _run(4))  # the run moved on: a new count
    assert failures.failed(KEY, ValueError("x")).attempts == 1
    failures.succeeded(KEY)
    failures.at(KEY, "decide", _run(4))
    assert failures.failed(KEY, ValueError("x")).attempts == 1


@pytest.mark.parametrize(
    "err", [ApiException(status=503), ApiException(status=429), ConnectionRefusedError(), TimeoutError()]
)
def test_the_api_servers_unavailability_is_waited_out_never_quarantined(err: Exception) -> None:
    assert transient(err)
    failures = Failures()
    failures.at(KEY, "commit", _run(1))
    verdicts = [failures.failed(KEY, err) for _ in range(20)]
    assert not any(v.quarantine for v in verdicts)
    assert max(v.delay for v in verdicts) == 60.0


@pytest.mark.parametrize("err", [ApiException(status=422), ApiException(status=403), KeyError("k")])
def test_a_definite_error_counts(err: Exception) -> None:
    assert not transient(err)


def test_the_message_names_the_exception_type() -> None:
    assert describe(OverflowError("cannot convert float infinity to integer")) == (
        "OverflowError: cannot convert float infinity to integer"
    )
    assert describe(KeyError()) == "KeyError"


@pytest.mark.parametrize("url", ["http://[not-a-url", "ftp://x/y", "http://"])
def test_http_post_fails_an_invalid_target_before_sending_and_its_query_says_not_applied(url: str) -> None:
    import asyncio

    from durable_agents.shell.effects.base import Action, EffectContext, Failed, NotApplied
    from durable_agents.shell.effects.http import HttpPost

    ctx = EffectContext(kube=None, namespace="ns", service_account="sa")  # type: ignore[arg-type]
    action = Action(key="k", target={"url": url}, arguments={})
    sent = asyncio.run(HttpPost().dispatch(ctx, action))
    assert isinstance(sent, Failed)
    assert sent.reason == "InvalidTarget"
    assert isinstance(asyncio.run(HttpPost().query(ctx, action)), NotApplied)
