"""OpenTelemetry traces of the model planner's calls, named and attributed per the GenAI semantic
conventions: a ``chat {model}`` span per model call, an ``execute_tool {tool}`` span per read-only
MCP tool call.

Off unless configured (the API's no-op tracer then costs next to nothing), with the standard
OpenTelemetry variables rather than one of our own: ``OTEL_TRACES_EXPORTER=console`` prints each
span as JSON on stderr (the SDK's ConsoleSpanExporter behind a BatchSpanProcessor), and
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (or
``OTEL_TRACES_EXPORTER=otlp``) sends them over OTLP/HTTP (``opentelemetry-exporter-otlp-proto-http``,
a dependency; gRPC only when its optional package is installed). ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_BSP_*`` keep their SDK meaning. Each process names itself
with ``service.instance.id`` (its worker identity) and ``process.pid``.

Spans carry what a call was (model, tokens, finish reasons, endpoint, run and step, the failure's
reason), never what was said: prompts, replies, tool arguments and results are sealed data and
never become span attributes or events. Exceptions are not recorded on spans for the same reason
(their messages may quote a reply); ``error.type`` names their class instead.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from durable_agents import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

INSTRUMENTATION = "durable_agents"
SERVICE_NAME = "durable-agents-operator"
# The OTLP exporters of opentelemetry-exporter-otlp, by OTEL_EXPORTER_OTLP_PROTOCOL.
OTLP_EXPORTERS = {
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
}

_provider: TracerProvider | None = None


def tracer() -> Tracer:
    """The operator's tracer from the global provider: a no-op until :func:`configure` installs
    one (a tracer taken earlier follows the provider installed later)."""
    return trace.get_tracer(INSTRUMENTATION, __version__)


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint and not names:
        names = ["otlp"]
    return [n for n in names if n != "none"]


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter | None:
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    module_name = OTLP_EXPORTERS.get(protocol)
    if module_name is None:
        log.warning("tracing: OTLP protocol %r is not supported (http/protobuf or grpc)", protocol)
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        log.warning("tracing: OTLP export needs the opentelemetry-exporter-otlp package; not exporting")
        return None
    return cast("SpanExporter", module.OTLPSpanExporter())


def configure(env: Mapping[str, str] | None = None, *, instance: str | None = None) -> TracerProvider | None:
    """Install the SDK's tracer provider when tracing is configured (see the module); once per
    process. Returns the provider, or None when tracing stays off."""
    global _provider
    if _provider is not None:
        return _provider
    env = os.environ if env is None else env
    exporters: list[SpanExporter] = []
    for name in _exporter_names(env):
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter(out=sys.stderr))
        elif name == "otlp":
            otlp = _otlp_exporter(env)
            if otlp is not None:
                exporters.append(otlp)
        else:
            log.warning("tracing: unknown OTEL_TRACES_EXPORTER %r (console, otlp or none)", name)
    if not exporters:
        return None
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Ours first, then what OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES say (they win).
    ours: dict[str, Any] = {
        "service.name": SERVICE_NAME,
        "service.version": __version__,
        "process.pid": os.getpid(),
    }
    if instance:
        ours["service.instance.id"] = instance  # tells the processes of one run's trace apart
    resource = Resource.create(ours).merge(OTELResourceDetector().detect())
    provider = TracerProvider(resource=resource)  # flushed and shut down at exit
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _provider = provider
    log.info("tracing: exporting spans to %s", ", ".join(type(e).__name__ for e in exporters))
    return provider


def traceparent() -> dict[str, str]:
    """The W3C ``traceparent`` (and ``tracestate``) of the current span, for an outgoing request;
    empty when no span is current."""
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


def server_attributes(url: str) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of an endpoint's URL (the scheme's port if none)."""
    parts = urlsplit(url)
    out: dict[str, Any] = {}
    if parts.hostname:
        out["server.address"] = parts.hostname
    try:
        port = parts.port
    except ValueError:
        port = None
    port = port or {"http": 80, "https": 443}.get(parts.scheme)
    if port:
        out["server.port"] = port
    return out


def failed(span: Span, error_type: str) -> None:
    """Mark a span as failed: ``error.type`` and status ERROR, described by the type only."""
    span.set_attribute("error.type", error_type)
    span.set_status(StatusCode.ERROR, error_type)


@contextmanager
def call_span(tracer: Tracer, name: str, kind: SpanKind, attributes: Mapping[str, Any]) -> Iterator[Span]:
    """A span around one outgoing call. An exception escaping it sets ``error.type`` to its class
    name and is not recorded (its message may carry sealed data)."""
    with tracer.start_as_current_span(
        name, kind=kind, attributes=dict(attributes), record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield span
        except BaseException as exc:
            failed(span, type(exc).__name__)
            raise
