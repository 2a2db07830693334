"""One trace per run, across processes and crashes; and the structured fields of its log lines.

A run's trace ID is in its status (``status.traceId``, written with its first commit and kept:
:attr:`~durable_agents.core.engine.RunSnapshot.trace_id`). Every process that works on the run
parents its spans on a *remote* parent made from that ID (the span ID derived from it), so the
spans of a process that died and of the one that took over land in the same trace:

- ``run unit``: one per unit of work that advances the run (the worker's ``_advance``), with the
  run ID, state version, attempt, policy version, parent run, holder (and the previous one: a
  ``takeover`` when another process held it), region and shard; the model planner's
  ``chat``/``execute_tool`` spans are its children;
- ``transition {event}``: one per committed transition, a child of its unit (event, from, to,
  state version);
- ``dispatch {effect}`` and ``query {effect}``: one per effect dispatch and per reconciliation
  query of the action ledger. While one is current, the W3C ``traceparent`` goes with the request
  (an HTTP effect's header, an MCP call's ``_meta``: :func:`durable_agents.shell.ground.tracing.traceparent`).

No span carries what was said (prompts, completions, tool arguments or results, effect arguments):
only identities, versions, states and outcome classes. There is no opt-in for content.

The same fields go on the log lines of transitions and dispatches as ``extra`` under
:data:`FIELDS` (the JSON log formatter, :mod:`.json_logs`, puts them at the top level).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import Commit, RunSnapshot
from durable_agents.core.engine.snapshot import run_trace_id, run_traceparent
from durable_agents.core.regions import DEFAULT_REGION
from durable_agents.shell.effects.base import (
    Action,
    Applied,
    DispatchResult,
    Effect,
    EffectContext,
    QueryResult,
)
from durable_agents.shell.ground import tracing
from durable_agents.shell.ownership.shards import shard_of

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

    from durable_agents.shell.ownership.rights import Right

FIELDS = "durable_agents"
"""The LogRecord attribute (``extra``) holding a line's structured fields."""
_EFFECT_KEY = "durable_agents.trace"  # where an EffectContext's ``extra`` keeps the dispatch's fields
_dispatch_log = logging.getLogger("durable_agents.shell.ledger.dispatcher")

_unit: ContextVar[dict[str, Any] | None] = ContextVar("durable_agents_unit", default=None)
_shards = 16  # this process's shard count (configure): a dispatch line names its run's shard


def configure(instance: str, shards: int) -> None:
    """At start-up: install the tracer provider (off unless the OTEL_* variables say otherwise),
    naming this process (``service.instance.id``), and note the region's shard count."""
    global _shards
    _shards = shards
    tracing.configure(instance=instance)


def run_context(trace_id: str) -> Context:
    """A context whose current span is the run's remote parent: the stored trace ID and a span ID
    derived from it (the same in every process)."""
    span_id = int(run_traceparent(trace_id).split("-")[2], 16)
    parent = SpanContext(
        int(trace_id, 16), span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


@contextmanager
def _span(name: str, parent: Context | None, kind: SpanKind, attributes: Mapping[str, Any]) -> Iterator[Span]:
    """A span that never records an exception's message (it may quote sealed data)."""
    with tracing.tracer().start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes={k: v for k, v in attributes.items() if v is not None},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            tracing.failed(span, type(exc).__name__)
            raise


def _checkpoint(snap: RunSnapshot) -> Mapping[str, Any]:
    return snap.raw_checkpoint if isinstance(snap.raw_checkpoint, Mapping) else {}


async def unit(identity: str, region: str, snap: RunSnapshot, right: Right, work: Awaitable[None]) -> None:
    """Run ``work`` (one unit of work on the run) under its ``run unit`` span."""
    checkpoint = _checkpoint(snap)
    raw_policy = checkpoint.get("policy")
    policy: Mapping[str, Any] = raw_policy if isinstance(raw_policy, dict) else {}
    parent = snap.spec.parent_ref
    fencing = checkpoint.get("fencing")
    previous = fencing.get("holder") if isinstance(fencing, dict) else None
    fields = {
        "run": snap.name,
        "namespace": snap.namespace,
        "traceId": snap.trace_id,
        "region": region,
        "shard": right.hold.shard,
        "holder": identity,
    }
    attributes = {
        "durable_agents.run": f"{snap.namespace}/{snap.name}",
        "durable_agents.run_id": snap.run_id,
        "durable_agents.state": snap.state.value,
        "durable_agents.state_version": snap.status.state_version,
        "durable_agents.attempt": int((checkpoint.get("retry") or {}).get("attempts", 0)),
        "durable_agents.policy": policy.get("name"),
        "durable_agents.policy_version": str(policy["version"]) if policy.get("version") else None,
        "durable_agents.parent_run": parent.uid if parent is not None else None,
        "durable_agents.holder": identity,
        "durable_agents.epoch": right.epoch.lease_transitions,
        # Who held the run before (its checkpoint's fencing, as read): another process's is a takeover.
        "durable_agents.previous_holder": previous,
        "durable_agents.takeover": previous is not None and previous != identity,
        "durable_agents.region": region,
        "durable_agents.shard": right.hold.shard,
    }
    token = _unit.set(fields)
    try:
        with _span("run unit", run_context(snap.trace_id), SpanKind.INTERNAL, attributes):
            await work
    finally:
        _unit.reset(token)


def committed(body: Mapping[str, Any], before: RunState, commit: Commit) -> dict[str, Any]:
    """A committed transition: its ``transition {event}`` span (a child of the unit's, or of the
    run's remote parent outside a unit); returns its log line's ``extra``."""
    status, meta = commit.status, body["metadata"]
    unit_fields = _unit.get() or {}
    holder = status.history[-1].holder if status.history else None
    trace_id = status.trace_id or run_trace_id(status.run_id or meta.get("uid", ""))
    fields = {
        "run": meta["name"],
        "namespace": meta["namespace"],
        "stateVersion": status.state_version,
        "event": commit.event.value,
        "from": before.value,
        "to": status.state.value,
        "traceId": trace_id,
        "region": unit_fields.get("region") or (body.get("spec") or {}).get("region") or DEFAULT_REGION,
        "shard": unit_fields.get("shard", shard_of(meta["namespace"], meta["name"], _shards)),
        "holder": holder or unit_fields.get("holder"),
    }
    attributes = {
        "durable_agents.run": f"{meta['namespace']}/{meta['name']}",
        "durable_agents.event": commit.event.value,
        "durable_agents.from": before.value,
        "durable_agents.to": status.state.value,
        "durable_agents.state_version": status.state_version,
    }
    parent = None if unit_fields else run_context(trace_id)
    with _span(f"transition {commit.event.value}", parent, SpanKind.INTERNAL, attributes):
        pass
    return {FIELDS: fields}


class Sender(Protocol):
    """Who sends an effect (a DispatcherConfig): its region and identity."""

    @property
    def region(self) -> str: ...

    @property
    def identity(self) -> str: ...


def effect_extra(
    run: Mapping[str, Any] | None, run_name: str, namespace: str, dispatcher: Sender
) -> dict[str, Any]:
    """An EffectContext's ``extra`` for a record of the run ``run`` (as read; None: gone), sent
    by the dispatcher configured so."""
    status = (run or {}).get("status") or {}
    meta = (run or {}).get("metadata") or {}
    trace_id = status.get("traceId") or (
        run_trace_id(status.get("runId") or meta["uid"]) if meta.get("uid") else None
    )
    fields = {
        "run": run_name,
        "namespace": namespace,
        "stateVersion": status.get("stateVersion"),
        "traceId": trace_id,
        "region": dispatcher.region,
        "shard": shard_of(namespace, run_name, _shards),
        "holder": dispatcher.identity,
    }
    return {_EFFECT_KEY: fields}


def _fields(ctx: EffectContext) -> dict[str, Any]:
    fields = ctx.extra.get(_EFFECT_KEY)
    return dict(fields) if isinstance(fields, dict) else {"namespace": ctx.namespace}


def _effect_span(kind: str, effect: Effect, ctx: EffectContext) -> Any:
    fields = _fields(ctx)
    trace_id = fields.get("traceId")
    attributes = {
        "durable_agents.run": f"{ctx.namespace}/{fields.get('run')}" if fields.get("run") else None,
        "durable_agents.effect": effect.name,
        "durable_agents.state_version": fields.get("stateVersion"),
        "durable_agents.holder": fields.get("holder"),
        "durable_agents.region": fields.get("region"),
        "durable_agents.shard": fields.get("shard"),
    }
    parent = run_context(trace_id) if isinstance(trace_id, str) else None
    return _span(f"{kind} {effect.name}", parent, SpanKind.CLIENT, attributes)


def _outcome(span: Span, result: DispatchResult | QueryResult) -> None:
    span.set_attribute("durable_agents.outcome", type(result).__name__)
    reason = getattr(result, "reason", None)
    if isinstance(reason, str) and not isinstance(result, Applied):
        span.set_attribute("durable_agents.reason", reason)


async def dispatched(effect: Effect, ctx: EffectContext, action: Action) -> DispatchResult:
    """``effect.dispatch`` under a ``dispatch {effect}`` span in its run's trace."""
    with _effect_span("dispatch", effect, ctx) as span:
        result = await effect.dispatch(ctx, action)
        _outcome(span, result)
    return result


async def queried(effect: Effect, ctx: EffectContext, action: Action) -> QueryResult:
    """``effect.query`` (a reconciliation query) under a ``query {effect}`` span."""
    with _effect_span("query", effect, ctx) as span:
        answer = await effect.query(ctx, action)
        _outcome(span, answer)
    return answer


def log_dispatch(
    ctx: EffectContext, record: Mapping[str, Any], effect: str, attempt: int, result: object
) -> None:
    """The dispatcher's line for one dispatch, with its structured fields."""
    name, outcome = record["metadata"]["name"], type(result).__name__
    fields = {
        **_fields(ctx),
        "event": "Dispatched",
        "actionRecord": name,
        "effect": effect,
        "attempt": attempt,
        "result": outcome,
    }
    _dispatch_log.info(
        "%s/%s %s attempt %d: %s", ctx.namespace, name, effect, attempt, outcome, extra={FIELDS: fields}
    )
