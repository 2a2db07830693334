"""An OTLP/HTTP trace receiver on loopback, for tests: what an OpenTelemetry collector would get.

``POST /v1/traces`` with a protobuf ``ExportTraceServiceRequest`` (gzip or not), decoded with
``opentelemetry-proto``'s classes; every span is kept with its resource's attributes (which tell
the exporting processes apart: ``service.instance.id``, ``process.pid``). Point an operator at it
with ``OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint``. Anything else is answered 404 / 400 / 415.

    with OtlpReceiver() as receiver:
        ...  # processes export to receiver.endpoint
        [trace] = receiver.traces().values()
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto
from opentelemetry.proto.trace.v1.trace_pb2 import Status

PROTOBUF = "application/x-protobuf"
MAX_BODY = 16 * 1024 * 1024


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, kind)


def attributes(items: Any) -> dict[str, Any]:
    """OTLP ``KeyValue`` list -> a dict (arrays as tuples)."""
    out: dict[str, Any] = {}
    for item in items:
        assert isinstance(item, KeyValue)
        out[item.key] = _value(item.value)
    return out


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # 32 lowercase hex
    span_id: str  # 16 lowercase hex
    parent_span_id: str | None
    name: str
    kind: str  # SPAN_KIND_INTERNAL, SPAN_KIND_CLIENT, ...
    attributes: dict[str, Any]
    resource: dict[str, Any]  # the exporting process's resource attributes
    scope: str
    events: tuple[tuple[str, dict[str, Any]], ...] = ()
    status_code: str = "STATUS_CODE_UNSET"
    status_message: str = ""
    start_ns: int = 0
    end_ns: int = 0

    @property
    def instance(self) -> str | None:
        """The process that exported it (``service.instance.id``)."""
        value = self.resource.get("service.instance.id")
        return value if isinstance(value, str) else None

    def texts(self) -> list[str]:
        """Every string this span shows: name, attribute and event values, status message."""
        out = [self.name, self.status_message]
        values: list[Any] = [*self.attributes.values()]
        for name, attrs in self.events:
            out.append(name)
            values.extend(attrs.values())
        while values:
            value = values.pop()
            if isinstance(value, tuple):
                values.extend(value)
            elif isinstance(value, Mapping):
                values.extend(value.values())
            elif value is not None:
                out.append(value.decode(errors="replace") if isinstance(value, bytes) else str(value))
        return out


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        name=span.name,
                        kind=SpanProto.SpanKind.Name(span.kind),
                        attributes=attributes(span.attributes),
                        resource=resource,
                        scope=scope_spans.scope.name,
                        events=tuple((e.name, attributes(e.attributes)) for e in span.events),
                        status_code=Status.StatusCode.Name(span.status.code),
                        status_message=span.status.message,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return spans


@dataclass
class _Store:
    lock: threading.Lock = field(default_factory=threading.Lock)
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    refused: int = 0


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: a test's output is not the place for every export

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        store = self.server.store
        if self.path.split("?", 1)[0] != "/v1/traces":
            self._answer(404, b"only /v1/traces")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            self._answer(400, b"a body of 1 byte to 16 MiB is expected")
            return
        body = self.rfile.read(length)
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != PROTOBUF:
            with store.lock:
                store.refused += 1
            self._answer(415, f"only {PROTOBUF}".encode())
            return
        try:
            if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                body = gzip.decompress(body)
            spans = decode(body)
        except (DecodeError, OSError, EOFError) as err:
            with store.lock:
                store.refused += 1
            self._answer(400, f"not an ExportTraceServiceRequest: {err}".encode())
            return
        with store.lock:
            store.requests += 1
            store.spans.extend(spans)
        self._answer(200, ExportTraceServiceResponse().SerializeToString(), PROTOBUF)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        super().__init__(address, _Handler)
        self.store = _Store()


class OtlpReceiver:
    """The receiver, serving in a thread from :meth:`start` (or ``with``) until :meth:`stop`; on
    loopback unless given another address (a collector Pod serves on every address)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = _Server((host, port))
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """The base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter adds ``/v1/traces``)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(10)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in the order they arrived."""
        with self._server.store.lock:
            return list(self._server.store.spans)

    def traces(self) -> dict[str, list[ReceivedSpan]]:
        """The spans received so far, by trace ID."""
        out: dict[str, list[ReceivedSpan]] = {}
        for span in self.spans():
            out.setdefault(span.trace_id, []).append(span)
        return out

    @property
    def requests(self) -> int:
        """Export requests accepted."""
        with self._server.store.lock:
            return self._server.store.requests

    @property
    def refused(self) -> int:
        """Requests refused as undecodable or of another content type."""
        with self._server.store.lock:
            return self._server.store.refused


def span_line(span: ReceivedSpan) -> str:
    """One span as a JSON line (what a collector Pod logs, for a test to read back)."""
    return json.dumps(dataclasses.asdict(span), default=str, sort_keys=True)


def serve(host: str, port: int) -> None:
    """Receive on ``host:port`` and print every span as a JSON line on stdout until killed: the
    receiver as a collector Pod runs it (``python otlp.py [HOST:PORT]``; this file needs only
    protobuf and opentelemetry-proto, which the operator's image has)."""
    receiver = OtlpReceiver(host, port).start()
    print(f"otlp receiver on {host}:{receiver.port}", flush=True)
    printed = 0
    while True:
        spans = receiver.spans()
        for span in spans[printed:]:
            print(span_line(span), flush=True)
        printed = len(spans)
        time.sleep(0.2)


if __name__ == "__main__":
    where = sys.argv[1] if len(sys.argv) > 1 else "0.0.0.0:4318"
    serve(where.rpartition(":")[0], int(where.rpartition(":")[2]))
