"""What waits for one person (core/inbox): the access review's answer, four-eyes, decisions given
under a quorum, expiry; and the refusal of a decision pinned to a request that was superseded."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_agents.core.inbox import SERVER_ANSWER, answer_command, decide_command, entries, superseded

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def request(**extra: Any) -> dict[str, Any]:
    return {
        "requestId": "pay-1",
        "digest": DIGEST,
        "step": "pay",
        "effect": "http.post",
        "tier": "consequential",
        "target": {"url": "https://pay.example/effects"},
        "policyVersion": "v1",
        "policyReason": "policy payments v1 asks for consequential",
        "expiresAt": (NOW + timedelta(hours=1)).isoformat(),
        "allowedDecisions": ["approve", "reject"],
        "approverVerb": "approve",
        "approverResource": "agentruns",
        **extra,
    }


def run(
    name: str, creator: str = "carol", since: int = 0, approvals: Any = None, **req: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"createdBy": {"username": creator}, "approvals": approvals or {}},
        "status": {
            "state": "waiting_approval",
            "stateSince": (NOW - timedelta(minutes=since)).isoformat(),
            "approvalRequest": request(**req),
        },
    }


def question(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {},
        "status": {
            "state": "waiting_input",
            "waitingFor": "input:confirm-1",
            "stateSince": NOW.isoformat(),
            "checkpoint": {
                "pendingInput": {
                    "requestId": "confirm-1",
                    "question": "x",
                    "expiresAt": "2027-01-01T00:00:00Z",
                }
            },
        },
    }


def may_all(asked: list[tuple[str, str, str, str]]) -> Any:
    def may(ns: str, verb: str, resource: str, name: str) -> bool:
        asked.append((ns, verb, resource, name))
        return not name.startswith("denied")

    return may


def test_oldest_first_with_the_pinned_command_and_the_verb_asked_for_each_run() -> None:
    asked: list[tuple[str, str, str, str]] = []
    found = entries(
        [run("new", since=1), run("old", since=30), run("denied-1")], "alice", may_all(asked), NOW
    )
    assert [e.run for e in found] == ["old", "new"]
    assert found[0].command == (f"kubectl agentrun approve old -n team-a --request pay-1 --digest {DIGEST}")
    assert ("team-a", "approve", "agentruns", "denied-1") in asked, "asked for the run's name"
    assert found[0].approvals is None


def test_four_eyes_excludes_the_creator_only_under_four_eyes() -> None:
    may = may_all([])
    assert entries([run("mine", creator="alice", fourEyes=True)], "alice", may, NOW) == []
    assert [e.run for e in entries([run("mine", creator="alice")], "alice", may, NOW)] == ["mine"]
    assert [e.run for e in entries([run("mine", creator="alice", fourEyes=True)], "bob", may, NOW)] == [
        "mine"
    ]


def test_a_quorum_hides_the_request_from_who_decided_it_and_counts_the_votes() -> None:
    decided = {"pay-1": {"digest": DIGEST, "decision": "approve", "approver": {"username": "alice"}}}
    quorum = run("q", approvals=decided, quorum=2)
    may = may_all([])
    assert entries([quorum], "alice", may, NOW) == []
    (waiting,) = entries([quorum], "bob", may, NOW)
    assert waiting.approvals == "1 of 2"
    verified = run("v", quorum=2, approvedBy=[{"approver": "bob", "key": "pay-1"}])
    assert entries([verified], "bob", may, NOW) == []
    rejected = {"pay-1": {"digest": DIGEST, "decision": "reject", "approver": {"username": "alice"}}}
    assert entries([run("r", approvals=rejected, quorum=2)], "bob", may, NOW) == [], "one rejection decides"


def test_expired_requests_and_questions() -> None:
    may = may_all([])
    expired = run("late", expiresAt=(NOW - timedelta(seconds=1)).isoformat())
    assert entries([expired], "alice", may, NOW) == []
    (asked,) = entries([question("ask")], "alice", may, NOW)
    assert (asked.kind, asked.request) == ("question", "confirm-1")
    assert asked.command == "kubectl agentrun answer ask -n team-a --question confirm-1 '<answer>'"


def test_the_answer_command_is_pinned_to_the_question_read_and_a_servers_in_its_form() -> None:
    """The command answers the question the person read and no other (the plugin refuses it once
    the run waits on another); an MCP server's question is answered in the form the server asks."""
    assert answer_command("r", "team-a", "confirm.2") == (
        "kubectl agentrun answer r -n team-a --question confirm.2 '<answer>'"
    )
    server = answer_command("r", "team-a", "mcp-0-1-stay")
    assert server == f"kubectl agentrun answer r -n team-a --question mcp-0-1-stay '{SERVER_ANSWER}'"
    assert json.loads(SERVER_ANSWER.replace("{...}", "{}")) == {"action": "accept", "content": {}}
    assert "'x; rm -rf /'" in answer_command("x; rm -rf /", "team-a", "q"), "names are quoted"
    asked = question("mcp")
    asked["status"]["waitingFor"] = "input:mcp-3-2-k1"
    (entry,) = entries([asked], "alice", may_all([]), NOW)
    assert entry.command.endswith(f"--question mcp-3-2-k1 '{SERVER_ANSWER}'")


def test_a_superseded_request_names_both_digests_and_the_new_command() -> None:
    current = request(requestId="pay-2", digest=OTHER, policyVersion="v2")
    said = superseded("pay", "team-a", current, "pay-1", DIGEST)
    assert said is not None
    assert "the request you reviewed was superseded" in said
    assert DIGEST in said
    assert OTHER in said
    assert "policy version v2" in said
    assert decide_command("pay", "team-a", current) in said
    assert superseded("pay", "team-a", current, "pay-2", OTHER) is None
    assert "no pending approval request" in (superseded("pay", "team-a", None, "pay-1", DIGEST) or "")
