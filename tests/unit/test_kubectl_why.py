"""``kubectl agentrun why``: what it says a run waits for and what would wake it, per wait."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from durable_agents.kubectl import why as kubectl_why

PATCH = "kubectl patch agentrun r1 -n ns --type merge -p "
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LAST = {
    "stateVersion": 4,
    "event": "input_requested",
    "from": "ready",
    "to": "waiting_input",
    "at": "2026-12-01T11:00:00Z",
    "holder": "op-1",
    "epoch": 2,
}


def run(state: str, waiting_for: str | None = None, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "r1", "namespace": "ns"},
        "spec": {"taskType": "t", "objective": "o"},
        "status": {
            "state": state,
            "stateVersion": 4,
            "stateSince": "2026-12-01T11:00:00Z",
            "history": [LAST],
            **({"waitingFor": waiting_for} if waiting_for else {}),
            **status,
        },
    }


@pytest.mark.parametrize(
    ("state", "waiting_for", "command"),
    [
        (
            "waiting_input",
            "input:ask",
            PATCH + """'{"spec": {"answers": {"ask": "<answer>"}}}'""",
        ),
        (
            "waiting_external",
            "event:go",
            PATCH + """'{"spec": {"events": {"go": "<payload>"}}}'""",
        ),
        ("waiting_external", "child:r1-sub", "kubectl agentrun why r1-sub -n ns"),
        ("quarantined", None, "kubectl agentrun retry r1 -n ns"),
        ("pending", "agentpolicy:pol", "kubectl apply -n ns -f <AgentPolicy pol>"),
    ],
)
def test_the_command_that_wakes_each_wait(state: str, waiting_for: str | None, command: str) -> None:
    answer = kubectl_why.explain(run(state, waiting_for))
    assert command in [c for way in answer["wakeBy"] for c in way["commands"]]
    assert command in kubectl_why.text(answer, NOW)


def test_an_action_with_an_unknown_outcome_names_the_reconcile_command() -> None:
    answer = kubectl_why.explain(run("waiting_external", "action:act-1"), unknown=["act-1"])
    commands = [c for way in answer["wakeBy"] for c in way["commands"]]
    assert commands == ["kubectl agentrun reconcile r1 -n ns --action act-1 --applied|--not-applied"]


def test_expiry_last_transition_and_stuck() -> None:
    expiry = {"expiresAt": "2026-12-01T13:00:00Z"}
    stuck = {
        "type": "Stuck",
        "status": "True",
        "reason": "Quarantined",
        "message": "retry it",
        "lastTransitionTime": "2026-12-01T11:00:01Z",
    }
    answer = kubectl_why.explain(
        run(
            "waiting_input",
            "input:ask",
            checkpoint={"schemaVersion": 3, "pendingInput": expiry},
            conditions=[stuck],
        )
    )
    assert answer["expiresAt"] == "2026-12-01T13:00:00+00:00"
    assert answer["lastTransition"]["holder"] == "op-1"
    said = kubectl_why.text(answer, NOW)
    assert "Expires:          2026-12-01T13:00:00+00:00 (1h00m from now)" in said
    assert (
        "Last transition:  input_requested ready -> waiting_input at 2026-12-01T11:00:00Z "
        "by op-1 (epoch 2), stateVersion 4" in said
    )
    assert "Stuck:            Quarantined since 2026-12-01T11:00:01Z" in said
    assert "  fix: retry it" in said


def test_a_wait_without_expiry_and_an_ended_run() -> None:
    said = kubectl_why.text(kubectl_why.explain(run("waiting_external", "child:r1-sub")), NOW)
    assert "Expires:          never (no expiry, no deadline)" in said
    assert "Stuck:            no" in said
    ended = kubectl_why.explain(run("completed", outcome={"reason": "Completed"}))
    assert ended["expiresAt"] is None
    assert ended["wakeBy"] == [{"what": "nothing: the run has ended (Completed)", "commands": []}]


def test_a_retry_window_says_why_the_last_attempt_failed() -> None:
    failure = "ModelReplyNotJson: http://m.example/v1 answered HTTP 200 with an HTML page (text/html): ..."
    waiting = run(
        "waiting_retry",
        "retry:2026-12-01T12:00:05+00:00",
        retryAt="2026-12-01T12:00:05Z",
        checkpoint={"retry": {"attempts": 1, "lastFailure": failure}},
    )
    said = kubectl_why.text(kubectl_why.explain(waiting), NOW)
    assert (
        f"the retry time 2026-12-01T12:00:05Z: the operator retries then; the last attempt failed: {failure}"
        in said
    )
