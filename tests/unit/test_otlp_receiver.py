"""The test kit's OTLP/HTTP receiver (testkit otlp.py) against the SDK's own OTLP/HTTP exporter:
spans arrive decoded, with their attributes, parents, events, status and resource attributes;
what is not an export is refused."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, StatusCode

from durable_agents_testkit.otlp import OtlpReceiver

pytestmark = pytest.mark.unit


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def export(
    receiver: OtlpReceiver, instance: str, compression: Compression = Compression.NoCompression
) -> None:
    resource = Resource.create({"service.name": "unit", "service.instance.id": instance})
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    exporter = OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces", compression=compression)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("unit-test")
    with (
        tracer.start_as_current_span("outer", attributes={"n": 3, "tags": ("a", "b")}),
        tracer.start_as_current_span("inner", kind=SpanKind.CLIENT) as inner,
    ):
        inner.add_event("retried", {"attempt": 2})
        inner.set_status(StatusCode.ERROR, "Timeout")
    provider.shutdown()


def test_exported_spans_arrive_decoded_with_their_resource(receiver: OtlpReceiver) -> None:
    export(receiver, "process-a")
    export(receiver, "process-b", Compression.Gzip)

    assert receiver.requests == 4  # one request per span (SimpleSpanProcessor)
    spans = receiver.spans()
    assert [(s.name, s.instance) for s in spans] == [
        ("inner", "process-a"),
        ("outer", "process-a"),
        ("inner", "process-b"),
        ("outer", "process-b"),
    ]
    inner, outer = spans[:2]
    assert inner.trace_id == outer.trace_id
    assert len(inner.trace_id) == 32
    assert inner.parent_span_id == outer.span_id
    assert outer.parent_span_id is None
    assert outer.attributes == {"n": 3, "tags": ("a", "b")}
    assert inner.kind == "SPAN_KIND_CLIENT"
    assert inner.events == (("retried", {"attempt": 2}),)
    assert (inner.status_code, inner.status_message) == ("STATUS_CODE_ERROR", "Timeout")
    assert inner.resource["service.name"] == "unit"
    assert inner.scope == "unit-test"
    assert "Timeout" in inner.texts()
    assert "b" in outer.texts()
    assert len(receiver.traces()) == 2  # one per process's outer span


def post(receiver: OtlpReceiver, path: str, body: bytes, content_type: str, **headers: str) -> int:
    request = urllib.request.Request(
        f"{receiver.endpoint}{path}",
        data=body,
        headers={"Content-Type": content_type, **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_what_is_not_an_export_is_refused(receiver: OtlpReceiver) -> None:
    assert post(receiver, "/v1/metrics", b"x", "application/x-protobuf") == 404
    assert post(receiver, "/v1/traces", b"{}", "application/json") == 415
    assert post(receiver, "/v1/traces", b"\xff\xff\xff", "application/x-protobuf") == 400
    protobuf, gzipped = "application/x-protobuf", {"Content-Encoding": "gzip"}
    assert post(receiver, "/v1/traces", b"not gzip", protobuf, **gzipped) == 400
    assert post(receiver, "/v1/traces", gzip.compress(b""), protobuf, **gzipped) == 200  # an empty export
    assert receiver.spans() == []
    assert receiver.refused == 3
