"""``kubectl agentrun cancel`` and ``retry`` choose a request ID (a token) that an entry written by
hand cannot take from them: the maps are append-only, so an ID once written stays, refused or not
(issue 30, item 2: the same shape as an unstamped reconciliation)."""

from __future__ import annotations

from typing import Any

import pytest

from durable_agents.kubectl import main as kubectl_plugin

pytestmark = pytest.mark.unit


class Api:
    """A stand-in for CustomObjectsApi: one run, and the patches sent."""

    def __init__(self, run: dict[str, Any]) -> None:
        self.run = run
        self.patches: list[dict[str, Any]] = []

    def get_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        return self.run

    def patch_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        self.patches.append(args[-1])
        return self.run


def run(status: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "pay", "namespace": "team-a"}, "spec": spec, "status": status}


def test_a_cancellation_takes_the_next_request_id_not_taken() -> None:
    api = Api(run({"state": "waiting_input"}))
    kubectl_plugin.cancel(api, "team-a", "pay", "task", None)  # type: ignore[arg-type]
    assert list(api.patches[-1]["spec"]["cancellations"]) == ["cancel-01"]
    # Written by hand with the webhook off, under the ID the next cancellation would have taken.
    api.run["spec"]["cancellations"] = {"cancel-02": {"scope": "task", "reason": ""}}
    said = kubectl_plugin.cancel(api, "team-a", "pay", "task", None)  # type: ignore[arg-type]
    assert list(api.patches[-1]["spec"]["cancellations"]) == ["cancel-03"]
    assert said.endswith("task cancellation cancel-03 requested")


def test_a_retry_takes_another_token_when_the_operator_refused_this_one() -> None:
    quarantined = {"state": "quarantined", "stateVersion": 7}
    api = Api(run(quarantined))
    kubectl_plugin.retry(api, "team-a", "pay")  # type: ignore[arg-type]
    assert api.patches[-1] == {"spec": {"retryQuarantine": "retry-7"}}
    # retry-7 was set by hand (the webhook off) and refused: the same token again would be no
    # new request at all (the webhook stamps a token only when it changes).
    refused = [{"field": "retryQuarantine", "key": "retry-7", "reason": "Unstamped"}]
    api.run = run({**quarantined, "refusedRequests": refused}, retryQuarantine="retry-7")
    said = kubectl_plugin.retry(api, "team-a", "pay")  # type: ignore[arg-type]
    assert api.patches[-1] == {"spec": {"retryQuarantine": "retry-7.2"}}
    assert said.endswith("retry retry-7.2 requested")
    refused.append({"field": "retryQuarantine", "key": "retry-7.2", "reason": "StampInvalid"})
    kubectl_plugin.retry(api, "team-a", "pay")  # type: ignore[arg-type]
    assert api.patches[-1] == {"spec": {"retryQuarantine": "retry-7.3"}}
