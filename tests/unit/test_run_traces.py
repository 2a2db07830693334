"""One trace per run (shell/observability/run_traces.py) and the JSON log lines
(shell/observability/json_logs.py),
without a cluster: the trace ID written with the first commit and kept; units, transitions, dispatches and
queries as spans of the run's trace under its remote parent; the W3C traceparent an effect sends;
and a transition's log line as one JSON object with its fields.

The spans go to an in-memory exporter through a provider of the test's own (``tracing.tracer``
patched): the process's global provider is never touched."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.unit.builders import T0, UID, apply, commit_of, new_run, snap, step

from durable_agents.api.v1alpha1 import ActionTier
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine.snapshot import run_trace_id, run_traceparent
from durable_agents.shell.effects import Action, Applied, EffectContext, NotApplied
from durable_agents.shell.effects.mcp import McpCall
from durable_agents.shell.ground import tracing
from durable_agents.shell.ledger.dispatch_config import DispatcherConfig
from durable_agents.shell.observability import run_traces
from durable_agents.shell.observability.json_logs import JsonFormatter, configure_logging
from durable_agents.shell.observability.reporting import CommitReporter
from durable_agents.shell.ownership.rights import Right
from durable_agents_testkit.mcpserver import McpServerThread

pytestmark = pytest.mark.unit

HEX32 = re.compile(r"^[0-9a-f]{32}$")
LOG_KEYS = {"run", "namespace", "stateVersion", "event", "traceId", "region", "shard", "holder"}


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "tracer", lambda: provider.get_tracer("test"))
    yield exporter
    provider.shutdown()


def test_the_first_commit_writes_the_trace_id_and_later_ones_keep_it() -> None:
    run = new_run()
    first = commit_of(step(run, T0))
    trace_id = first.wire_status()["traceId"]
    assert HEX32.match(trace_id)
    assert trace_id == run_trace_id(UID)
    # The checkpoint's trace link is the trace's root: the remote parent of every process's spans.
    assert first.checkpoint is not None
    link = first.checkpoint["traceLink"]
    assert link == run_traceparent(trace_id)
    assert re.match(rf"^00-{trace_id}-[0-9a-f]{{16}}-01$", link)
    later = apply(run, first)
    assert commit_of(step(later, T0)).wire_status()["traceId"] == trace_id
    # A run restored from a backup (a new uid) keeps the trace it had, as it keeps its run ID.
    restored = apply(run, first)
    restored["metadata"]["uid"] = "5f0b6c1e-0000-4000-8000-00000000beef"
    restored["status"]["traceId"] = "0af7651916cd43dd8448eb211c80319c"
    assert commit_of(step(restored, T0)).wire_status()["traceId"] == "0af7651916cd43dd8448eb211c80319c"
    assert run_trace_id("another run") != trace_id


def _right(shard: int = 5) -> Right:
    hold, epoch = SimpleNamespace(shard=shard), SimpleNamespace(lease_transitions=4)
    return cast(Right, SimpleNamespace(hold=hold, epoch=epoch))


async def test_a_unit_and_its_transitions_are_spans_of_the_runs_trace(exporter: InMemorySpanExporter) -> None:
    run = new_run()
    commit = commit_of(step(run, T0))
    body = apply(run, commit)
    fields: dict[str, Any] = {}

    async def work() -> None:
        fields.update(run_traces.committed(body, RunState.PENDING, commit)[run_traces.FIELDS])

    await run_traces.unit("worker-a", "eu", snap(run), _right(), work())
    transition, unit = exporter.get_finished_spans()
    trace_id = commit.status.trace_id
    assert trace_id is not None
    remote = run_traces.run_context(trace_id)
    from opentelemetry import trace

    parent = trace.get_current_span(remote).get_span_context()
    assert unit.name == "run unit"
    assert unit.context is not None
    assert format(unit.context.trace_id, "032x") == trace_id
    assert unit.parent is not None
    assert unit.parent.is_remote
    assert unit.parent.span_id == parent.span_id == int(run_traceparent(trace_id).split("-")[2], 16)
    assert dict(unit.attributes or {}) == {
        "durable_agents.run": "team-a/run-1",
        "durable_agents.run_id": UID,
        "durable_agents.state": "pending",
        "durable_agents.state_version": 0,
        "durable_agents.attempt": 0,
        "durable_agents.holder": "worker-a",
        "durable_agents.epoch": 4,
        "durable_agents.takeover": False,  # a new run: nobody held it
        "durable_agents.region": "eu",
        "durable_agents.shard": 5,
    }
    assert transition.name == f"transition {commit.event.value}"
    assert transition.parent is not None
    assert transition.parent.span_id == unit.context.span_id
    assert dict(transition.attributes or {}) == {
        "durable_agents.run": "team-a/run-1",
        "durable_agents.event": commit.event.value,
        "durable_agents.from": "pending",
        "durable_agents.to": commit.status.state.value,
        "durable_agents.state_version": commit.status.state_version,
    }
    assert fields["traceId"] == trace_id
    assert (fields["region"], fields["shard"], fields["holder"]) == ("eu", 5, "worker-a")


class Recorded:
    """An effect that keeps the W3C headers current while it dispatches or is queried."""

    name = "test.recorded"
    tier = ActionTier.CONSEQUENTIAL
    reversible = False
    compensation: str | None = None

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    async def dispatch(self, ctx: EffectContext, action: Action) -> Applied:
        self.headers.append(tracing.traceparent())
        return Applied({"receipt": "r-1"})

    async def query(self, ctx: EffectContext, action: Action) -> NotApplied:
        self.headers.append(tracing.traceparent())
        return NotApplied()


async def test_dispatches_and_queries_are_spans_of_the_runs_trace_and_send_its_traceparent(
    exporter: InMemorySpanExporter,
) -> None:
    run = apply(new_run(), commit_of(step(new_run(), T0)))
    trace_id = run["status"]["traceId"]
    config = DispatcherConfig(identity="dispatcher-b", region="eu")
    extra = run_traces.effect_extra(run, "run-1", "team-a", config)
    ctx = EffectContext(cast(Any, None), "team-a", "default", 5.0, extra)
    effect = Recorded()
    action = Action("key-1", {"secret": "a target"}, {"note": "an argument"})

    assert isinstance(await run_traces.dispatched(effect, ctx, action), Applied)
    assert isinstance(await run_traces.queried(effect, ctx, action), NotApplied)
    dispatch, query = exporter.get_finished_spans()
    assert (dispatch.name, query.name) == ("dispatch test.recorded", "query test.recorded")
    for span, headers in ((dispatch, effect.headers[0]), (query, effect.headers[1])):
        assert span.context is not None
        assert format(span.context.trace_id, "032x") == trace_id
        assert span.parent is not None
        assert span.parent.is_remote
        assert headers["traceparent"] == f"00-{trace_id}-{span.context.span_id:016x}-01"
        shown = json.dumps(dict(span.attributes or {}))
        assert "an argument" not in shown
        assert "a target" not in shown
    assert (dispatch.attributes or {})["durable_agents.outcome"] == "Applied"
    assert (query.attributes or {})["durable_agents.outcome"] == "NotApplied"
    assert (dispatch.attributes or {})["durable_agents.holder"] == "dispatcher-b"


class NoEvents:
    async def record(self, *args: Any, **kwargs: Any) -> None:
        pass


async def test_a_transitions_log_line_is_one_json_object_with_its_fields(
    exporter: InMemorySpanExporter,
) -> None:
    run = new_run()
    commit = commit_of(step(run, T0))
    body = apply(run, commit)
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep()
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("durable_agents.shell.runs.worker")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        CommitReporter(cast(Any, NoEvents())).report(body, RunState.PENDING, commit)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    [line] = [line for line in lines if commit.event.value in line]
    assert "\n" not in line
    parsed = json.loads(line)
    assert set(parsed) >= LOG_KEYS, parsed
    assert parsed["run"] == "run-1"
    assert parsed["namespace"] == "team-a"
    assert parsed["stateVersion"] == commit.status.state_version
    assert parsed["event"] == commit.event.value
    assert parsed["traceId"] == commit.status.trace_id
    assert parsed["holder"] == "worker-a"
    assert isinstance(parsed["shard"], int)
    assert parsed["level"] == "INFO"
    assert parsed["logger"] == "durable_agents.shell.runs.worker"
    assert parsed["message"].startswith(f"team-a/run-1 {commit.event.value}: ")


def test_a_json_line_keeps_the_exception_and_only_text_or_json_is_a_format() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info())
    parsed = json.loads(JsonFormatter().format(record))
    assert parsed["message"] == "failed here"
    assert "Traceback" in parsed["exception"]
    assert "ValueError: boom" in parsed["exception"]
    with pytest.raises(ValueError, match="expected one of text, json"):
        configure_logging("INFO", "yaml")


async def test_an_mcp_calls_meta_carries_the_dispatch_spans_traceparent(
    exporter: InMemorySpanExporter,
) -> None:
    run = apply(new_run(), commit_of(step(new_run(), T0)))
    trace_id = run["status"]["traceId"]
    extra = run_traces.effect_extra(run, "run-1", "team-a", DispatcherConfig(identity="dispatcher-b"))
    ctx = EffectContext(cast(Any, None), "team-a", "default", 10.0, extra)
    with McpServerThread() as server:
        target = {"server": "tickets", "url": server.url, "tool": "close_ticket"}
        action = Action("run-1/step-3", target, {"id": "T-100", "resolution": "replaced the toner"})
        assert isinstance(await run_traces.dispatched(McpCall(), ctx, action), Applied)
        [closure] = server.closures()
    [dispatch] = exporter.get_finished_spans()
    assert dispatch.name == "dispatch mcp.call"
    assert dispatch.context is not None
    assert closure.traceparent == f"00-{trace_id}-{dispatch.context.span_id:016x}-01"
    assert "replaced the toner" not in json.dumps(dict(dispatch.attributes or {}))
