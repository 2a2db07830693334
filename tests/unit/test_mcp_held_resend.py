"""A call lost while held open (2025-11-25) is sent again only when the run's policy, read when
the loss is found, trusts the tool as idempotent (``spec.mcp.idempotentTools``); else unknown."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from durable_agents.api.v1alpha1 import (
    ActionInput,
    ActionRecordSpec,
    ActionRecordStatus,
    ActionState,
    ActionTask,
    ActionTier,
    AgentPolicySpec,
    IdempotentMcpTools,
    RunReference,
)
from durable_agents.core.agent.mcp_trust import trusted_idempotent
from durable_agents.shell.effects import Applied, Failed, Unknown
from durable_agents.shell.ground.store import Gone
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.ledger.held_calls import HELD_CALL_RESENT, HeldCalls
from durable_agents.shell.ledger.record_writes import HELD_CALL_LOST, RecordWrites

pytestmark = pytest.mark.unit

URL = "http://everything.tools.svc/mcp"
TOOL = "trigger-elicitation-request"


def _policy(*entries: dict[str, Any]) -> AgentPolicySpec:
    return AgentPolicySpec.model_validate({"version": "v1", "mcp": {"idempotentTools": list(entries)}})


TRUSTING = _policy({"url": URL, "tools": [TOOL]})


def test_only_a_tool_named_on_its_servers_exact_url_is_trusted_as_idempotent() -> None:
    assert trusted_idempotent(TRUSTING, URL, TOOL)
    assert not trusted_idempotent(TRUSTING, URL, "get-sum"), "another tool of that server"
    assert not trusted_idempotent(TRUSTING, URL + "/", TOOL), "another URL, even a near one"
    assert not trusted_idempotent(TRUSTING, "http://other.svc/mcp", TOOL)
    assert not trusted_idempotent(TRUSTING, URL, TOOL.upper()), "names match exactly"
    assert not trusted_idempotent(None, URL, TOOL), "no policy: nothing trusted"
    assert not trusted_idempotent(_policy(), URL, TOOL), "the default trusts nothing"
    both = _policy({"url": "http://other.svc/mcp", "tools": ["x"]}, {"url": URL, "tools": ["a", TOOL]})
    assert trusted_idempotent(both, URL, TOOL)


def test_trusted_servers_are_not_idempotent_tools() -> None:
    annotations_only = AgentPolicySpec.model_validate(
        {"version": "v1", "mcp": {"trustedServers": [{"url": URL}]}}
    )
    assert not trusted_idempotent(annotations_only, URL, TOOL)


@pytest.mark.parametrize(
    "entry",
    [
        {"url": URL, "tools": []},  # no wildcard: a whole server is never trusted
        {"url": URL},
        {"url": URL, "tools": [""]},
        {"url": URL, "tools": ["t" * 65]},
        {"url": "ftp://x/mcp", "tools": [TOOL]},
        {"url": URL, "tools": [f"t{i}" for i in range(65)]},
    ],
)
def test_an_entry_names_its_tools_within_bounds(entry: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        IdempotentMcpTools.model_validate(entry)


def test_the_list_is_bounded() -> None:
    with pytest.raises(ValidationError):
        _policy(*({"url": f"http://s{i}.svc/mcp", "tools": [TOOL]} for i in range(33)))


# --- the decision, with the run and its policy read at that time -----------------------------------


class _Runs:
    def __init__(self, run: dict[str, Any] | None) -> None:
        self.run = run

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        if self.run is None:
            raise Gone(name)
        return self.run


class _Writes:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def event(self, body: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append((reason, message))

    async def record(self, body: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append((reason, message))


SPEC = ActionRecordSpec(
    idempotency_key="uid/2/call",
    run_ref=RunReference(name="r", uid="run-uid"),
    step_index=2,
    effect="mcp.call",
    tier=ActionTier.CONSEQUENTIAL,
    target={"server": "everything", "url": URL, "tool": TOOL},
)
NOW = datetime(2030, 1, 1, tzinfo=UTC)
BODY = {"metadata": {"namespace": "ns", "name": "act-1"}}
RUN = {"metadata": {"namespace": "ns", "name": "r"}, "spec": {"policyRef": {"name": "p"}}}
HELD = ActionRecordStatus(
    state=ActionState.INPUT_REQUIRED,
    attempts=1,
    claimed_by="op-1",
    claim_expires_at=NOW + timedelta(minutes=1),
    input=ActionInput(round=1, keys=["k"], held_open=True, asked_at=NOW),
)


def _decide(
    status: ActionRecordStatus = HELD,
    spec: ActionRecordSpec = SPEC,
    policy: AgentPolicySpec | None = TRUSTING,
    run: dict[str, Any] | None = RUN,
    key: tuple[str, str] = ("ns", "p"),
) -> tuple[bool, _Writes]:
    """The decision, with the operator's own policy cache holding ``policy`` under ``key``."""
    writes, policies = _Writes(), PolicyCache(None)  # type: ignore[arg-type]  # nothing here reaches the API
    if policy is not None:
        policies.policies[key] = policy
    else:  # known missing: read() asks nobody
        policies.absent[key] = time.monotonic() + 60
    calls = HeldCalls(_Runs(run), writes, None, policies, 30.0)  # type: ignore[arg-type]
    return asyncio.run(calls.resend_lost(BODY, status, spec)), writes


def test_a_lost_held_call_of_a_trusted_tool_is_sent_again_and_an_event_says_why() -> None:
    resend, writes = _decide()
    assert resend
    [(reason, message)] = writes.events
    assert reason == HELD_CALL_RESENT
    assert "idempotent" in message
    assert TOOL in message
    assert "same key" in message
    assert "'p'" in message, "the run's policy, named"


def test_the_policy_governing_the_run_decides_also_when_the_run_names_none() -> None:
    """Governed by default: a run naming no policy is governed by its namespace's default (or the
    cluster's baseline), and that policy's trust counts, as its hold bound does."""
    unnamed = {"metadata": {"namespace": "ns", "name": "r"}, "spec": {}}
    default = TRUSTING.model_copy(update={"default": True})
    resend, writes = _decide(run=unnamed, policy=default, key=("ns", "team-default"))
    assert resend
    assert "'team-default'" in writes.events[0][1]
    resend, writes = _decide(run=unnamed, policy=default, key=("", "baseline"))
    assert resend, "the cluster's default policy"
    assert "'baseline'" in writes.events[0][1]
    resend, _ = _decide(run=unnamed, policy=TRUSTING, key=("ns", "not-a-default"))
    assert not resend, "a policy that governs nothing trusts nothing"


def test_an_untrusted_or_unreadable_case_is_never_sent_again() -> None:
    other_tool = SPEC.model_copy(update={"target": {"url": URL, "tool": "get-sum"}})
    not_held = HELD.model_copy(
        update={"input": ActionInput(round=1, keys=["k"], held_open=False, asked_at=NOW)}
    )
    dispatching = HELD.model_copy(update={"state": ActionState.DISPATCHING})
    task = ActionTask(id="t-1", server=URL, status="input_required", created_at=NOW, protocol="2025-11-25")
    task_question = HELD.model_copy(update={"task": task})  # the task is polled again, never re-called
    http = SPEC.model_copy(update={"effect": "http.post"})
    for resend, writes in (
        _decide(policy=_policy()),
        _decide(policy=None),
        _decide(spec=other_tool),
        _decide(status=not_held),
        _decide(status=dispatching),
        _decide(status=task_question),
        _decide(spec=http),
        _decide(run=None),
        _decide(run={"spec": {}}),
    ):
        assert not resend
        assert writes.events == []


class _Store:
    async def commit_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        return {**body, "status": status}


def test_a_resend_refused_before_it_is_sent_leaves_the_lost_call_unknown_never_failed() -> None:
    """The first send's outcome is unknown: a refusal of the second (run ended, policy changed)
    must not record a definite failure over it."""
    events = _Writes()
    writes = RecordWrites(_Store(), events, "op-2", timedelta(seconds=30))  # type: ignore[arg-type]
    out = asyncio.run(writes.fail_unsent(dict(BODY), HELD, False, "RunEnded", "not dispatched: canceled"))
    status = ActionRecordStatus.model_validate(out["status"])
    assert (status.state, status.attempts, status.reason) == (ActionState.OUTCOME_UNKNOWN, 1, HELD_CALL_LOST)
    assert "RunEnded" in (status.message or "")
    assert [reason for reason, _ in events.events] == [HELD_CALL_LOST]
    durable = HELD.model_copy(update={"input": HELD.input.model_copy(update={"held_open": False})})  # type: ignore[union-attr]
    out = asyncio.run(writes.fail_unsent(dict(BODY), durable, False, "RunEnded", "not dispatched"))
    assert out["status"]["state"] == "failed", "a durable round was never sent: a definite failure"


def test_a_resend_that_fails_leaves_the_first_sends_outcome_unknown() -> None:
    """The re-send's failure says nothing of the lost first send: unknown, to be asked about."""
    failed = Failed("McpError", "not sent: connection refused")
    answer = HeldCalls.resent_answer(HELD, failed)
    assert isinstance(answer, Unknown)
    assert answer.reason == HELD_CALL_LOST
    assert "connection refused" in answer.message
    applied = Applied({"content": "ok"})
    assert HeldCalls.resent_answer(HELD, applied) is applied, "a re-send that applied is the outcome"
    durable = HELD.model_copy(update={"input": HELD.input.model_copy(update={"held_open": False})})  # type: ignore[union-attr]
    assert HeldCalls.resent_answer(durable, failed) is failed, "a durable round's retry was never sent"
    fresh = HELD.model_copy(update={"state": ActionState.INTENT, "input": None})
    assert HeldCalls.resent_answer(fresh, failed) is failed, "a first send's failure is definite"
