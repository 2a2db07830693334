"""Traces and structured logs on the operator's path (shell/observability/run_traces.py,
shell/observability/json_logs.py).

Operators export over OTLP/HTTP to the test kit's receiver (testkit otlp.py) with a short batch
delay. A run is worked on by three processes, two of which die by SIGKILL at a commit boundary
(DURABLE_AGENTS_TEST_KILL_AT=before:N, as in test_recovery): it is ONE trace, whose ID is the
run's status.traceId, with spans from all three (told apart by service.instance.id). A process
that is killed loses the spans it has not exported yet, so each victim is killed only once the
receiver has its spans of an earlier unit (its batch delay is 50 ms); the unit it dies in
committed nothing, so every committed transition still has its span. A model-planner run's spans
(model calls, the approved effect's dispatch) carry none of what was said, the effect's request
carries the dispatch span's W3C traceparent, and its JSON log lines carry the run's fields.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from e2e import test_agent

from durable_agents_testkit.agent_sample import sample_of, script
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.otlp import OtlpReceiver, ReceivedSpan
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import (
    EXPECTED_EVENTS,
    Runs,
    assert_history_is_gapless,
    read_ask_await_complete,
)

LEASE = 2  # seconds: quick takeovers
HEX32 = re.compile(r"^[0-9a-f]{32}$")
# The model sample's fixtures and helpers, as test_agent has them.
model = test_agent.model
agent_namespace = test_agent.agent_namespace


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def traced(receiver: OtlpReceiver, **env: str) -> dict[str, str]:
    """An operator's environment exporting its spans to ``receiver`` within 50 ms."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50", **env}


def spans_by(receiver: OtlpReceiver, trace_id: str, op: OperatorProcess, name: str) -> list[ReceivedSpan]:
    return [
        s
        for s in receiver.traces().get(trace_id, [])
        if s.instance == op.identity and s.name.startswith(name)
    ]


def received(
    receiver: OtlpReceiver,
    trace_id: str,
    op: OperatorProcess,
    name: str,
    count: int = 1,
    in_unit: bool = True,
) -> None:
    """Wait for ``count`` spans named ``name...`` of ``op`` in the trace, and (``in_unit``) for the
    units they are children of (a unit ends after its children: exported in a later batch)."""

    def arrived() -> bool:
        spans = spans_by(receiver, trace_id, op, name)
        units = {s.span_id for s in spans_by(receiver, trace_id, op, "run unit")}
        return len(spans) >= count and (not in_unit or all(s.parent_span_id in units for s in spans))

    eventually(arrived, Within.COMMIT, f"{count} {name!r} span(s) of {op.identity} and their units")


def test_a_run_two_processes_died_on_is_one_trace_with_spans_of_all_three(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    readable_configmap: str,
    receiver: OtlpReceiver,
) -> None:
    # The first dies before its 2nd write (the answer's batch); the second before its 3rd (the
    # completion's: its 1st is the fencing write of its takeover, its 2nd the answer's batch).
    first = start_operator("traced-1", LEASE, **traced(receiver, DURABLE_AGENTS_TEST_KILL_AT="before:2"))
    name = runs.create(read_ask_await_complete(readable_configmap))
    parked = runs.wait_state(name, "waiting_input", timeout=Within.COMMIT)
    trace_id = parked["status"]["traceId"]
    assert HEX32.match(trace_id), trace_id
    received(receiver, trace_id, first, "transition", 3)  # accepted, the read, the question
    runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    assert first.wait_killed(Within.COMMIT) == -signal.SIGKILL

    second = start_operator("traced-2", LEASE, **traced(receiver, DURABLE_AGENTS_TEST_KILL_AT="before:3"))
    runs.wait_state(name, "waiting_external", timeout=Within.TAKEOVER)
    received(receiver, trace_id, second, "transition", 3)  # the answer, revalidated, the wait
    runs.patch_spec(name, {"events": {"window-open": "now"}})
    assert second.wait_killed(Within.COMMIT) == -signal.SIGKILL, "the second took the completion's write"

    third = start_operator("traced-3", LEASE, **traced(receiver))
    done = runs.wait_state(name, "completed", timeout=Within.TAKEOVER)
    received(receiver, trace_id, third, "transition", 3)

    assert done["status"]["traceId"] == trace_id, "the trace ID never changes"
    history = assert_history_is_gapless(done)
    assert [h["event"] for h in history] == EXPECTED_EVENTS
    ops = (first, second, third)
    assert [h["holder"] for h in history] == [op.identity for op in ops for _ in range(3)]
    ours = [
        s for s in receiver.spans() if s.attributes.get("durable_agents.run") == f"{runs.namespace}/{name}"
    ]
    assert {s.trace_id for s in ours} == {trace_id}, "every span of the run is in its one trace"
    spans = receiver.traces()[trace_id]
    assert {s.instance for s in spans} == {op.identity for op in ops}
    assert len({s.resource["process.pid"] for s in spans}) == 3
    # Each process's units hang off the same remote parent: the span ID derived from the trace ID.
    units = [s for s in spans if s.name == "run unit"]
    assert {s.instance for s in units} == {op.identity for op in ops}
    root = done["status"]["checkpoint"]["traceLink"]  # the checkpoint's link: 00-<trace>-<root span>-01
    assert {f"00-{s.trace_id}-{s.parent_span_id}-01" for s in units} == {root}
    assert {s.attributes["durable_agents.holder"] for s in units} == {op.identity for op in ops}
    # A takeover shows: the second's and the third's first units name the process that died.
    takeovers = {
        (s.attributes.get("durable_agents.previous_holder"), s.instance)
        for s in units
        if s.attributes["durable_agents.takeover"]
    }
    assert takeovers == {(first.identity, second.identity), (second.identity, third.identity)}
    # Every committed transition is a span, a child of its process's unit.
    transitions = sorted(
        (s for s in spans if s.name.startswith("transition ")),
        key=lambda s: s.attributes["durable_agents.state_version"],
    )
    assert [s.attributes["durable_agents.event"] for s in transitions] == EXPECTED_EVENTS
    assert [s.attributes["durable_agents.state_version"] for s in transitions] == list(range(1, 10))
    unit_of = {s.span_id: s for s in units}
    for span, entry in zip(transitions, history, strict=True):
        assert span.instance == entry["holder"]
        assert unit_of[span.parent_span_id or ""].instance == span.instance
        assert (span.attributes["durable_agents.from"], span.attributes["durable_agents.to"]) == (
            entry["from"],
            entry["to"],
        )


def said_in(spec: dict[str, Any]) -> list[str]:
    """What was said in the model sample's run: the prompt, the objective, the model's replies
    and its calls' arguments, the limits it read."""
    prompt = sample_of("ConfigMap")["data"]["v1"]
    rules = script()["rules"]
    said = [line.strip() for line in prompt.splitlines() if line.strip()]
    said += [spec["objective"], *(rule["content"] for rule in rules), "A-1042", "maxAmount"]
    return said


def test_a_model_runs_spans_say_nothing_and_its_effect_carries_the_trace(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    agent_namespace: str,
    model: ModelServerThread,
    refsystem: ReferenceSystemThread,
    receiver: OtlpReceiver,
) -> None:
    op = start_operator("traced-agent", **traced(receiver, DURABLE_AGENTS_LOG_FORMAT="json"))
    spec = test_agent.agent_spec(model, refsystem)
    name = runs.create(spec)
    test_agent.approve(runs, name)
    done = runs.wait_state(name, "completed", timeout=90)
    trace_id = done["status"]["traceId"]
    received(receiver, trace_id, op, "chat ", 3)
    received(receiver, trace_id, op, "dispatch http.post", in_unit=False)  # the dispatcher's: no unit

    spans = receiver.traces()[trace_id]
    units = {s.span_id for s in spans if s.name == "run unit"}
    chats = [s for s in spans if s.name == f"chat {spec['agent']['model']}"]
    assert len(chats) >= 3
    assert all(s.parent_span_id in units for s in chats), "model calls are children of a unit"
    [dispatch] = [s for s in spans if s.name == "dispatch http.post"]
    assert dispatch.attributes["durable_agents.outcome"] == "Applied"
    [record] = refsystem.records()
    assert record.traceparent == f"00-{trace_id}-{dispatch.span_id}-01", "the request carries the span"
    shown = [text for s in receiver.spans() for text in s.texts()]
    for text in said_in(spec):
        assert not [t for t in shown if text in t], f"a span shows what was said: {text!r}"

    # JSON log lines: one object a line; transitions and the dispatch with the run's fields.
    logged = [line for line in op.log_path.read_text().splitlines() if line.strip()]
    assert not [line for line in logged if not line.startswith("{")], "every line is a JSON object"
    lines = [json.loads(line) for line in logged]
    ours = [line for line in lines if line.get("run") == name]
    transitions = [line for line in ours if line.get("stateVersion") and line.get("event") != "Dispatched"]
    assert [line["stateVersion"] for line in transitions] == [
        h["stateVersion"] for h in done["status"]["history"]
    ]
    [dispatched] = [line for line in ours if line.get("event") == "Dispatched"]
    for line in [*transitions, dispatched]:
        assert line["traceId"] == trace_id
        assert line["namespace"] == runs.namespace
        assert line["holder"] == op.identity
        assert line["region"]
        assert isinstance(line["shard"], int)
    assert dispatched["result"] == "Applied"
    assert not op.logged("Traceback")
