"""The admission limits (durable_agents.core.limits): the iterative walk (depth, size, budget),
each field check with the message a user sees, and the arithmetic that makes a run at every bound
fit in etcd together with the largest status the operator writes for it."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.limits_worst_case import worst_checkpoint, worst_status

from durable_agents.api.v1alpha1 import (
    ActionRecord,
    ActionRecordSpec,
    ActionRecordStatus,
    AgentRunStatus,
    RejectionRule,
    ResolvedReference,
)
from durable_agents.api.v1alpha1.agentrun import HISTORY_LIMIT, REFUSED_LIMIT
from durable_agents.api.v1alpha1.meta import ActionTier, RunReference
from durable_agents.core import limits
from durable_agents.core.agent.limits import (
    DEFAULT_MAX_FACTS_BYTES,
    MAX_AGENT_STEPS,
    AgentLimits,
    facts_bytes,
)
from durable_agents.core.agent_facts import (
    ARGUMENTS_MAX_BYTES,
    REASON_MAX_CHARS,
    SEALED_TOKEN_MAX,
    TokenUsage,
    new_facts,
    new_turn,
    settle_last,
    settle_turn,
    with_turn,
)
from durable_agents.core.checkpoint import ApprovalRecord, dump_checkpoint
from durable_agents.core.digest import canonical_json
from durable_agents.core.limits import (
    CREATE_BUDGET,
    ETCD_REQUEST_LIMIT,
    MAX_NESTING,
    MAX_VALUE_BYTES,
    STATUS_ROOM,
    UPDATE_BUDGET,
    LimitExceeded,
    refusal,
    walk,
)
from durable_agents.core.sealed_values import SEALED_KEY, new_data_key, outcome_label, seal_spec, seal_value
from durable_agents.shell.agent.mcp_tools import OUTCOME_MAX_BYTES
from durable_agents.shell.effects.http import BODY_MAX_BYTES

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def nest(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def run(*steps: dict[str, Any], name: str = "r", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"taskType": "t", "objective": "o", "steps": list(steps) or [effect("s")]}
    body.update(spec)
    return {
        "apiVersion": "durable-agents.io/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": body,
    }


def effect(name: str, arguments: Any = None, target: Any = None) -> dict[str, Any]:
    return {
        "name": name,
        "effect": {
            "effect": "http.post",
            "target": target or {"url": "http://x"},
            "arguments": arguments or {"n": 1},
        },
    }


def ask(expires: str) -> dict[str, Any]:
    return {"name": "a", "ask": {"question": "q", "expiresIn": expires}}


# --- the walk ------------------------------------------------------------------------------------


def test_walk_measures_depth_and_the_exact_compact_json_size() -> None:
    value = {"a": [1, "x", {"b": None}], "c": "é\n", "d": True, "e": 1.5, "f": {}}
    walked = walk(value)
    assert walked.depth == 3
    assert walked.size == len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


@given(st.dictionaries(st.text(), st.text() | st.text(alphabet=st.characters(max_codepoint=127))))
def test_walk_sizes_every_string_as_compact_json_does(value: dict[str, str]) -> None:
    """Plain ASCII strings are sized without json.dumps (a 64 KiB blob in each review of a large
    run): the same number, escapes (quotes, backslashes, control characters) and UTF-8 included."""
    assert walk(value).size == len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


@pytest.mark.parametrize("depth", [700, 1500, 100_000])
def test_walk_stops_at_the_depth_limit_without_recursion(depth: int) -> None:
    with pytest.raises(LimitExceeded) as err:
        walk(nest(depth), ("spec",), max_depth=32)
    assert "nested more than 32 levels deep" in str(err.value)
    assert err.value.field == "spec"
    assert len(err.value.at) == 33  # stopped at the first level past the limit, not at the bottom


def test_walk_stops_at_the_byte_budget() -> None:
    with pytest.raises(LimitExceeded, match="larger than 1000 bytes"):
        walk({"a": ["x" * 100] * 100}, budget=1000)
    assert walk({"a": ["x" * 100] * 9}, budget=1000).size < 1000


def test_sealed_size_is_what_sealing_makes() -> None:
    data_key = new_data_key(entropy=os.urandom)
    for plain in ({"n": "x" * 1000}, {"n": "y" * 65000}, "a question"):
        sealed = seal_spec(
            {"steps": [{"name": "s", "ask": {"question": plain}}]}, data_key, entropy=os.urandom
        )
        stored = len(json.dumps(sealed["steps"][0]["ask"]["question"], separators=(",", ":")))
        assert stored == limits.sealed_size(len(canonical_json(plain)), isinstance(plain, str))


# --- each limit, and its message -------------------------------------------------------------------


@pytest.mark.parametrize("depth", [33, 700, 1500])
def test_nested_arguments_are_refused_naming_the_field(depth: int) -> None:
    refused = refusal(run(effect("s", nest(depth))), "CREATE")
    assert refused is not None
    assert refused.field == "spec.steps[0].effect.arguments"
    assert f"nested more than {MAX_NESTING} levels deep" in str(refused)
    assert '"secretKeyRef"' in str(refused)
    assert refusal(run(effect("s", nest(MAX_NESTING - 1))), "CREATE") is None


def test_nested_target_in_a_child_step_is_refused_naming_the_field() -> None:
    child = {
        "name": "c",
        "child": {"taskType": "t", "objective": "o", "steps": [effect("in", target=nest(40))]},
    }
    refused = refusal(run(child), "CREATE")
    assert refused is not None
    assert refused.field == "spec.steps[0].child.steps[0].effect.target"


def test_large_arguments_are_refused_pointing_at_a_secret_reference() -> None:
    refused = refusal(run(effect("s", {"blob": "x" * 900_000})), "CREATE")
    assert refused is not None
    assert refused.field == "spec.steps[0].effect.arguments"
    assert '{"valueFrom": {"secretKeyRef": {"name": ..., "key": ...}}}' in str(refused)
    at_bound = {"blob": "x" * (MAX_VALUE_BYTES - len(canonical_json({"blob": ""})))}
    assert len(canonical_json(at_bound)) == MAX_VALUE_BYTES
    assert refusal(run(effect("s", at_bound)), "CREATE") is None
    over = {"blob": at_bound["blob"] + "x"}
    refused = refusal(run(effect("s", over)), "CREATE")
    assert refused is not None
    assert f"{MAX_VALUE_BYTES + 1} bytes in canonical JSON" in str(refused)


def test_a_large_objective_is_refused_naming_it() -> None:
    refused = refusal(run(objective="x" * 1_000_000), "CREATE")
    assert str(refused) == "spec.objective: 1000000 characters, at most 4096"
    assert refusal(run(objective="x" * 4096), "CREATE") is None


@pytest.mark.parametrize(
    ("expires", "why"),
    [
        ("99999999999999999999h", "is not a duration"),
        ("1" * 31 + "s", "is not a duration"),
        ("9000h", "is longer than 8760h (one year)"),
        ("525601m", "is longer than 8760h (one year)"),
        ("8759.99h1h", "is longer than 8760h (one year)"),
        ("1x", "is not a duration"),
    ],
)
def test_bad_durations_are_refused_naming_the_field(expires: str, why: str) -> None:
    refused = refusal(run(ask(expires)), "CREATE")
    assert refused is not None
    assert refused.field == "spec.steps[0].ask.expiresIn"
    assert why in str(refused)


@pytest.mark.parametrize("expires", ["8760h", "525600m", "8759.5h30m", "1h30m", "90s", "999999ms"])
def test_durations_up_to_one_year_pass(expires: str) -> None:
    assert refusal(run(ask(expires)), "CREATE") is None


def test_answers_are_bounded_each_and_together() -> None:
    refused = refusal(run(answers={"confirm": "x" * 4097}), "UPDATE")
    assert refused is not None
    assert refused.field == "spec.answers['confirm']"
    many = {f"q{i}": "x" * 4096 for i in range(17)}
    refused = refusal(run(answers=many), "UPDATE")
    assert refused is not None
    assert "answers and events hold 69632 bytes together, at most 65536" in str(refused)
    assert refusal(run(answers=dict(list(many.items())[:16])), "UPDATE") is None


def test_the_whole_run_is_bounded_as_stored_with_sealed_values_counted_sealed() -> None:
    big = {"blob": "x" * 60_000}
    refused = refusal(run(*(effect(f"s{i}", big) for i in range(8))), "CREATE")
    assert refused is not None
    assert refused.field == "spec"
    assert f"at most {CREATE_BUDGET}" in str(refused)
    assert "largest: spec.steps" in str(refused)
    # The same five steps fit: and an UPDATE gets the room reserved for requests.
    assert refusal(run(*(effect(f"s{i}", big) for i in range(5))), "CREATE") is None


def test_refusal_never_raises_on_odd_documents() -> None:
    for odd in (
        None,
        [],
        "x",
        {"spec": {"steps": "x"}},
        {"spec": {"steps": [1, {"effect": 2}]}},
    ):
        assert refusal(odd, "CREATE") is None
    assert refusal({"spec": {"answers": {"a": 1}}}, "UPDATE") is not None
    # A spec that is not an object is refused before the webhook patches into it (it answered 500).
    assert str(refusal({"spec": []}, "CREATE")) == "spec: must be an object"
    # Numbers canonical JSON cannot hold exactly are refused before sealing (it answered 500).
    big = {"spec": {"steps": [{"name": "a", "effect": {"effect": "x", "arguments": {"n": 2**60}}}]}}
    assert "beyond ±2^53" in str(refusal(big, "CREATE"))


def test_deep_nesting_outside_arguments_is_refused_naming_the_field() -> None:
    refused = refusal(run(extra=nest(100)), "CREATE")
    assert refused is not None
    assert str(refused).startswith(
        "spec.extra.a.a: nested more than 64 levels deep (at spec.extra.a.a.a.a.a.a...)"
    )
    deep_metadata = {**run(), "metadata": {"name": "r", "labels": nest(80)}}
    refused = refusal(deep_metadata, "CREATE")
    assert refused is not None
    assert refused.field == "metadata.labels.a.a"


def test_the_status_is_not_walked() -> None:
    assert refusal({**run(), "status": {"checkpoint": nest(5000)}}, "UPDATE") is None


# --- the arithmetic: a run at every bound fits in etcd with its largest status ----------------------


def test_the_budgets_leave_the_status_its_room() -> None:
    assert CREATE_BUDGET < UPDATE_BUDGET
    assert UPDATE_BUDGET + STATUS_ROOM + 64 * 1024 == ETCD_REQUEST_LIMIT


def test_the_worst_case_status_fits_its_room() -> None:
    """Every list at its limit, every string the engine writes at its longest, the approval request
    with the largest target and sealed arguments, the pending question sealed, 64 steps each with
    its records, and the failed attempts the engine keeps (see limits_worst_case)."""
    status = worst_status(NOW)
    AgentRunStatus.model_validate(status)  # a status the API types accept
    assert len(status["history"]) == HISTORY_LIMIT
    assert len(status["refusedRequests"]) == REFUSED_LIMIT
    size = len(json.dumps(status, separators=(",", ":")).encode())
    checkpoint = len(json.dumps(status["checkpoint"], separators=(",", ":")).encode())
    print(f"worst-case status {size} bytes (checkpoint {checkpoint}), room {STATUS_ROOM}")
    assert size <= STATUS_ROOM


def test_a_run_at_every_bound_fits_in_etcd_with_its_largest_status() -> None:
    """The largest spec the webhook lets through (an UPDATE at its budget) plus the worst status,
    as one JSON object, stays under etcd's request limit with room for the request's framing."""
    status = worst_status(NOW)
    spec_at_budget = run(objective="o")
    spec_at_budget["metadata"]["annotations"] = {"filler": ""}
    filler = "x" * (UPDATE_BUDGET - limits.stored_size(spec_at_budget))
    spec_at_budget["metadata"]["annotations"] = {"filler": filler}
    assert limits.stored_size(spec_at_budget) == UPDATE_BUDGET
    whole = {**spec_at_budget, "status": status}
    size = len(json.dumps(whole, separators=(",", ":")).encode())
    print(f"a run at the bounds with its worst status: {size} bytes of {ETCD_REQUEST_LIMIT}")
    assert size < ETCD_REQUEST_LIMIT - 32 * 1024


def test_the_worst_checkpoint_is_a_valid_checkpoint() -> None:
    checkpoint = worst_checkpoint(NOW + timedelta(seconds=1))
    assert dump_checkpoint(checkpoint)["schemaVersion"] == 3


# --- the webhook server's own first step ------------------------------------------------------------


def test_the_webhook_parses_a_deep_review_and_answers_with_a_denial_naming_the_field() -> None:
    """kopf's json.loads hit the recursion limit at about 1000 levels (a 500); the server parses
    with room, restores the limit, and the walk refuses by name."""
    from durable_agents_controllers.webhook import _denial, _parse

    limit = sys.getrecursionlimit()
    body = run()
    text = (
        '{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u1", "object": '
    )
    text += _deep_json(body) + "}}"
    review = _parse(text)
    assert sys.getrecursionlimit() == limit
    refused = refusal(review["request"]["object"], "CREATE")
    assert refused is not None
    denial = _denial(review, refused)
    assert denial["response"] == {
        "uid": "u1",
        "allowed": False,
        "status": {"code": 422, "reason": "Invalid", "message": str(refused)},
    }
    assert denial["response"]["status"]["message"].startswith(
        "spec.steps[0].effect.arguments: nested more than 32"
    )


def _deep_json(body: dict[str, Any]) -> str:
    """JSON text of a run whose arguments are nested 5000 levels, written without recursion."""
    arguments = '{"a":' * 5000 + "1" + "}" * 5000
    placeholder = {**body, "spec": {**body["spec"], "steps": [effect("s", {"PLACEHOLDER": 0})]}}
    return json.dumps(placeholder).replace('{"PLACEHOLDER": 0}', arguments)


def _worst_facts(max_bytes: int) -> dict[str, Any]:
    """Agent facts as large as the model planner lets them grow: turns with the longest arguments,
    reason and result are added while the facts are within ``max_bytes`` (the limit is checked
    before each model call, so the last turn lands on facts just under it)."""
    key = new_data_key(entropy=os.urandom)
    facts = new_facts(
        model="m" * 253, prompt_digest="sha256:" + "0" * 64, tool_set_digest="sha256:" + "1" * 64
    )
    arguments = {"a": "x" * (ARGUMENTS_MAX_BYTES - 16)}
    while facts_bytes(facts) <= max_bytes:
        index = len(facts.turns)
        turn = new_turn(
            key,
            index=index,
            call_id="c" * 64,
            tool="t" * 64,
            arguments=arguments,
            reason="r" * REASON_MAX_CHARS,
            step_index=index,
            usage=TokenUsage(input_tokens=10**9, output_tokens=10**9),
            entropy=os.urandom,
        )
        facts = settle_last(
            with_turn(facts, turn), key, outcome="succeeded", result={"r": "y" * 10**5}, entropy=os.urandom
        )
    return facts.model_dump(mode="json", by_alias=True, exclude_none=True)


def test_a_model_run_with_its_largest_facts_fits_the_status_room() -> None:
    """A model run takes at most 63 tool calls (steps), within the 64 steps the worst status
    counts; its facts stop growing at DEFAULT_MAX_FACTS_BYTES (the run fails with
    AgentLimitExceeded before the next model call), plus the one turn that crossed it."""
    assert AgentLimits().max_tool_calls <= MAX_AGENT_STEPS < 64
    with pytest.raises(ValueError, match="max_tool_calls"):
        AgentLimits(max_tool_calls=MAX_AGENT_STEPS + 1)
    status = worst_status(NOW)
    status["checkpoint"]["agent"] = _worst_facts(DEFAULT_MAX_FACTS_BYTES)
    size = len(json.dumps(status, separators=(",", ":")).encode())
    facts = len(json.dumps(status["checkpoint"]["agent"], separators=(",", ":")).encode())
    print(f"worst-case model-run status {size} bytes (facts {facts}), room {STATUS_ROOM}")
    assert size <= STATUS_ROOM


def test_a_model_run_at_its_rejection_cap_fits_the_status_room() -> None:
    """Under ``rejection.response: replan`` each rejection moves the run to a new step, leaving its
    approval record (the rejected turn is in the facts, which stay bounded): at the policy's largest
    maxRejections, on top of the largest model-run status, the status still fits its room."""
    cap = RejectionRule.model_json_schema()["properties"]["maxRejections"]["maximum"]
    status = worst_status(NOW)
    status["checkpoint"]["agent"] = _worst_facts(DEFAULT_MAX_FACTS_BYTES)
    rejected = [
        ApprovalRecord(
            request_id=f"agent-{MAX_AGENT_STEPS + n}-99",
            digest="sha256:" + "0" * 64,
            step_index=MAX_AGENT_STEPS + n,
            expires_at=NOW,
            policy_version="v" * 63,
            decision="rejected",
            decided_by="d" * 253,
            decided_at=NOW,
        ).model_dump(mode="json", by_alias=True, exclude_none=True)
        for n in range(cap)
    ]
    status["checkpoint"]["approvals"] += rejected
    size = len(json.dumps(status, separators=(",", ":")).encode())
    print(f"worst-case model-run status with {cap} rejections {size} bytes, room {STATUS_ROOM}")
    assert size <= STATUS_ROOM


def test_the_largest_action_record_with_its_recorded_response_fits_in_etcd() -> None:
    """An ActionRecord keeps the effect's response (issue 36, item 5): an ``http.post``'s body or an
    MCP tool's content, each cut at 16 KiB, sealed. With the largest intent (sealed 64 KiB arguments,
    a 64 KiB target), every string at its bound and 32 resolved references, the record stays far
    under etcd's request limit; and the model's turn that takes the response stays within the
    sealed-value bound the facts were sized with (the cut told by ``resultTruncated``)."""
    key = new_data_key(entropy=os.urandom)
    name = "ar-" + "a" * 60
    largest = max(BODY_MAX_BYTES, OUTCOME_MAX_BYTES)
    # A body of escapes: as text in canonical JSON it grows most (a quote or backslash is two bytes).
    response = {"status": 201, "receipt": "r" * 253, "body": '"' * largest, "bodyTruncated": True}
    sealed = seal_value(key, response, outcome_label(name), entropy=os.urandom)
    arguments = seal_value(key, {"a": "x" * (MAX_VALUE_BYTES - 16)}, "steps/s/arguments", entropy=os.urandom)
    record = ActionRecord(
        metadata={"name": name, "namespace": "n" * 63, "labels": {"durable-agents.io/run": "r" * 63}},
        spec=ActionRecordSpec(
            idempotency_key="k" * 253,
            run_ref=RunReference(name="r" * 253, uid="u" * 64),
            service_account_name="s" * 253,
            step_index=63,
            effect="e" * 128,
            tier=ActionTier.CONSEQUENTIAL,
            target={"url": "x" * (MAX_VALUE_BYTES - 16)},
            arguments=arguments,
            approval_request_id="q" * 128,
            compensates="c" * 253,
            status_stamped=True,
        ),
        status=ActionRecordStatus(
            state="succeeded",
            attempts=10**6,
            queries=10**6,
            claimed_by="h" * 253,
            claim_expires_at=NOW,
            first_dispatched_at=NOW,
            last_attempt_at=NOW,
            outcome_unknown_since=NOW,
            finished_at=NOW,
            outcome=sealed,
            reason="R" * 128,
            message="m" * 4096,
            resolved_references=[
                ResolvedReference(
                    path="p" * 253,
                    secret="s" * 253,
                    key="k" * 253,
                    resource_version="v" * 64,
                    digest="d" * 128,
                )
            ]
            * 32,
            stamp="t" * 256,
        ),
    )
    size = len(json.dumps(record.wire(), separators=(",", ":")).encode())
    print(f"the largest ActionRecord: {size} bytes of {ETCD_REQUEST_LIMIT}")
    assert size < 256 * 1024 < ETCD_REQUEST_LIMIT

    turn = new_turn(
        key, entropy=os.urandom, index=0, call_id="c", tool="t", arguments={}, reason=None, step_index=0
    )
    result = {"step": 0, "outcome": "succeeded", "error": None, "response": response}
    settled = settle_turn(turn, key, entropy=os.urandom, outcome="succeeded", result=result)
    assert settled.result_truncated, (
        "a response at its bound, with the result around it, is cut: the model is told"
    )
    token = settled.result if isinstance(settled.result, str) else settled.result[SEALED_KEY]
    assert len(token) <= SEALED_TOKEN_MAX
