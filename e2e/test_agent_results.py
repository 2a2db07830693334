"""The response of an approved call reaches the model (issue 36, item 5): what the ledger recorded
of an approved ``http.post`` (its status and body: the reference system's receipt, a transaction
ID) and of an approved MCP call (the tool's content: the closed ticket, with the key it was closed
under) is the model's next input, also when the operator is SIGKILLed right after the outcome was
recorded and before the next model call: the rescuer reads the response from the ActionRecord (its
outcome stamp verified), never by calling again (the reference system and the MCP server count 1).

The run is test_agent_recovery's (read, read, MCP read, a refused refund, the refund approved, the
ticket's closure approved, a question, the answer), driven by its helpers; the kill points are its
writes of record: 6, the refund's ActionRecord settled; 10, the closure's.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import Any

import pytest
from e2e.test_agent_recovery import (
    FAST_CLAIMS,
    LEASE,
    WRITES,
    Servers,
    Victim,
    agent_namespace,
    agent_spec,
    committed_by,
    drive,
    protocol,
    recover,
    servers,
)

from durable_agents_testkit.eventually import Within
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import receipt_for
from durable_agents_testkit.runs import Runs

__all__ = ["agent_namespace", "protocol", "servers"]  # the fixtures, as test_agent_recovery defines them


def tool_results(requests: list[dict[str, Any]], tool: str) -> list[str]:
    """The results of ``tool``'s calls as the model was given them, request by request."""
    out = []
    for request in requests:
        names = {
            call["id"]: call["function"]["name"]
            for message in request["messages"]
            if message["role"] == "assistant"
            for call in message.get("tool_calls") or []
        }
        out.extend(
            m["content"]
            for m in request["messages"]
            if m["role"] == "tool" and names.get(m.get("tool_call_id")) == tool
        )
    return out


def responses(results: list[str]) -> list[dict[str, Any]]:
    """The recorded responses among a tool's results (a call refused before it ran has none)."""
    return [r["response"] for r in map(json.loads, results) if "response" in r]


@pytest.mark.parametrize("nth", [6, 10], ids=["after-refund-outcome", "after-closure-outcome"])
def test_the_response_of_an_approved_call_reaches_the_model_after_a_kill_without_calling_again(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    servers: Servers,
    nth: int,
) -> None:
    assert WRITES[nth - 1] == ("record", None), "the kill point is an ActionRecord's outcome"
    committed = committed_by(nth)
    process = start_operator("victim", LEASE, DURABLE_AGENTS_TEST_KILL_AT=f"after:{nth}", **FAST_CLAIMS)
    victim = Victim(process, committed, committed, servers.model.calls()["total"])
    name = runs.create(agent_spec(servers), name=f"results-{nth}")
    drive(runs, name, Within.RUN, until=lambda: not process.alive)
    assert process.wait_killed(Within.COMMIT) == -signal.SIGKILL
    killed_at = servers.model.calls()["total"]
    # The rescuer completes the run; recover checks each effect applied once (the reference system
    # and the MCP server count 1), the history gapless, the model calls the clean run's.
    recover(victim, f"after:{nth}", start_operator, runs, name, servers)
    done = runs.get(name)

    requests: list[dict[str, Any]] = servers.model.calls()["requests"]
    after_kill = requests[len(requests) - (servers.model.calls()["total"] - killed_at) :]
    [refund_key] = [k for k in servers.refsystem.counts() if k.startswith(done["status"]["runId"] + "/")]
    [closure_key] = servers.tickets.counts()

    # The refund: the reference system's answer, status and body, with the receipt (a transaction
    # ID the model could have from nowhere else: it derives from the idempotency key).
    refund = responses(tool_results(after_kill, "refund"))
    assert refund, f"the refund's response never reached the model: {tool_results(after_kill, 'refund')}"
    receipt = receipt_for(refund_key)
    assert refund[0] == {
        "status": 201,
        "receipt": receipt,
        "key": refund_key,
        "body": {"key": refund_key, "applied": 1, "receipt": receipt},
    }
    # The closure: the MCP tool's content (the ticket closed under the call's own key).
    closure = responses(tool_results(after_kill, "close_ticket"))
    assert closure, (
        f"the closure's content never reached the model: {tool_results(after_kill, 'close_ticket')}"
    )
    told = json.dumps(closure[0])
    assert closure[0]["tool"] == "close_ticket"
    assert closure_key in told, told
    assert '\\"status\\": \\"closed\\"' in told or '"status": "closed"' in told, told
    # Sealed where it is recorded: neither the run's status nor the records show it in clear.
    assert receipt not in json.dumps(done["status"])
