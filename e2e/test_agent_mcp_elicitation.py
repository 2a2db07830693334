"""A server that asks for input before it completes a call (issue 36, item 1), on the operator's
path, as far as it is built: a model-planned run's approved call of the asking reference server's
``book_room`` (2026-07-28: an ``InputRequiredResult`` with request state) is a definite failure of
its ActionRecord (``McpInputRequired``: nothing applied, the round trip being stateless), never
``outcome_unknown``, sent once, and the server's question kept out of the unsealed record.

Recording the question on the run (``waiting_input``) and retrying the same ledger action with the
person's answer is not built yet (docs/agent/mcp.md, "Input required").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from e2e.test_agent import agent_namespace, agent_spec, approve, model

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.eventually import Within
from durable_agents_testkit.mcpasking import AskingServerThread
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

__all__ = ["agent_namespace", "model"]  # the fixtures, as test_agent defines them


def booking_script() -> dict[str, Any]:
    return {
        "model": "scripted-refunds",
        "rules": [
            {
                "when": {"notCalled": ["book_room"]},
                "content": "Booking the room.",
                "toolCalls": [{"name": "book_room", "arguments": {"room": "7"}}],
            },
            {"when": {"called": ["book_room"]}, "content": "Done."},
        ],
    }


def test_an_approved_call_that_asks_for_input_fails_definitely_and_applies_nothing(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
) -> None:
    with AskingServerThread() as hotel:
        model.set_script(booking_script())
        spec = agent_spec(model, refsystem)
        spec["agent"]["tools"] = []
        spec["agent"]["mcpServers"] = [{"name": "hotel", "url": hotel.url, "tools": ["book_room"]}]
        start_operator("agent-mcp-elicitation")
        name = runs.create(spec)
        assert approve(runs, name)["effect"] == "mcp.call"
        done = runs.wait_state(name, "failed", timeout=Within.RUN)
        assert done["status"]["outcome"]["reason"] == "ActionFailed", done["status"]["outcome"]
        listed = runs.custom.list_namespaced_custom_object(GROUP, VERSION, runs.namespace, "actionrecords")
        (record,) = [r for r in listed["items"] if r["spec"]["runRef"]["name"] == name]
        status = record["status"]
        assert status["state"] == "failed", status
        assert status["reason"] == "McpInputRequired", status
        assert "asks for input before it completes (stay); nothing was applied" in status["message"]
        assert "arrive" not in json.dumps(status), "the server's question is not in the unsealed record"
        assert status["attempts"] == 1, "sent once: a definite answer is not sent again"
        assert hotel.asked() == 1, "asked once"
        assert hotel.applications() == []
