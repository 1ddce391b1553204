"""A loopback OTLP/HTTP receiver for the tests: it keeps every span and metric point it is sent.

It answers `POST /v1/traces` and `POST /v1/metrics` (protobuf, as the SDK's OTLP/HTTP exporters
send them) with 200, decodes each request with OpenTelemetry's own protobuf types, and keeps the
raw bytes too, so a test can search everything a pool exported for a string.
"""

import contextlib
import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass
class Span:
    """One exported span, as the receiver read it."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    scope: str
    attributes: dict[str, Any]


@dataclass
class Received:
    """Everything a receiver was sent: spans, metric points by name, and the raw bodies."""

    spans: list[Span] = field(default_factory=list)
    points: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sum_of(self, metric: str, **attributes: str) -> float:
        """The latest cumulative value of `metric` summed over the series matching
        `attributes` (each process exports its own series)."""
        with self.lock:
            latest: dict[tuple[tuple[str, Any], ...], float] = {}
            for name, labels, value in self.points:
                if name == metric and all(labels.get(k) == v for k, v in attributes.items()):
                    latest[tuple(sorted(labels.items()))] = value
        return sum(latest.values())


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _number(data: str, point: Any) -> float:
    """A point's value: a histogram's count, else its number."""
    if data == "histogram":
        return float(point.count)
    return float(point.as_int if point.HasField("as_int") else point.as_double)


def _take(received: Received, path: str, body: bytes) -> None:
    with received.lock:
        received.raw.append(body)
        if path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scoped in resource.scope_spans:
                    for span in scoped.spans:
                        received.spans.append(
                            Span(
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_id=span.parent_span_id.hex(),
                                scope=scoped.scope.name,
                                attributes=_attributes(span.attributes),
                            )
                        )
        elif path == "/v1/metrics":
            metrics = ExportMetricsServiceRequest.FromString(body)
            for resource in metrics.resource_metrics:
                # Each process exports its own series: keep them apart by its instance.
                instance = _attributes(resource.resource.attributes).get("service.instance.id")
                for scoped in resource.scope_metrics:
                    for metric in scoped.metrics:
                        data = metric.WhichOneof("data")
                        for point in getattr(metric, data).data_points:
                            labels = {**_attributes(point.attributes), "_instance": instance}
                            if data == "histogram":
                                value: float = point.count
                            else:
                                value = (
                                    point.as_int if point.HasField("as_int") else point.as_double
                                )
                            received.points.append((metric.name, labels, value))


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """Serve an OTLP/HTTP receiver on a free loopback port; yield its base URL and what it
    receives; stop it after."""
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            _take(received, self.path, body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
