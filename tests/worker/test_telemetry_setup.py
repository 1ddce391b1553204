"""Telemetry's set-up: when the standard variables turn it on, and what leaves a process.

In process: which `OTEL_*` variables turn telemetry on (none does by default); a span's status
text and an exception's message never leave (`ScrubbedSpans`); and what a forked child inherits
of its parent's exporters sends nothing from the child (`OwnSpans`, `OwnMetrics`), checked in a
real forked child. The pool itself is tested through the door in `test_telemetry.py`.
"""

import os
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from actonce.worker.process.exporting import OwnMetrics, OwnSpans, ScrubbedSpans
from actonce.worker.process.telemetry import wanted


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_SERVICE_NAME": "actonce"}, False),
    ],
)
def test_only_the_standard_variables_turn_telemetry_on(env: dict[str, str], on: bool) -> None:
    assert wanted(env) is on


def test_a_spans_status_text_and_an_exceptions_message_do_not_leave() -> None:
    kept = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ScrubbedSpans(kept)))
    tracer = provider.get_tracer("test")

    with tracer.start_as_current_span("invoke_workflow", record_exception=False) as span:
        span.set_attribute("reflexr.run.id", "fir_1")
        span.record_exception(ValueError("the artifact holds 'secret content'"))
        span.set_status(Status(StatusCode.ERROR, "RuntimeError: wrote 'secret content'"))

    (exported,) = kept.get_finished_spans()
    assert exported.status.status_code is StatusCode.ERROR
    assert not exported.status.description
    (event,) = exported.events
    assert event.attributes is not None and event.attributes["exception.type"] == "ValueError"
    assert "secret content" not in repr(exported.to_json())
    assert exported.attributes is not None and exported.attributes["reflexr.run.id"] == "fir_1"


class CountingSpans(SpanExporter):
    """Counts the exports that reach it."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls.append("spans")
        return SpanExportResult.SUCCESS


class CountingMetrics(MetricExporter):
    """Counts the exports that reach it."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 0, **kwargs: object
    ) -> MetricExportResult:
        self.calls.append("metrics")
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 0) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 0, **kwargs: object) -> None:
        return None


def test_what_a_child_inherits_of_its_parents_exporters_sends_nothing_from_it() -> None:
    calls: list[str] = []
    spans, metrics = OwnSpans(CountingSpans(calls)), OwnMetrics(CountingMetrics(calls))

    pid = os.fork()
    if pid == 0:  # the child: export through what it inherited; its exit status says what went
        spans.export([])
        metrics.export(MetricsData(resource_metrics=[]))
        os._exit(len(calls))
    _, status = os.waitpid(pid, 0)
    spans.export([])
    metrics.export(MetricsData(resource_metrics=[]))

    assert os.waitstatus_to_exitcode(status) == 0, "the child sent what it inherited"
    assert calls == ["spans", "metrics"], "the parent still exports"
