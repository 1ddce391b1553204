"""The pool's span and metric exporters: what leaves a process, and from which process.

`ScrubbedSpans` keeps text out of every span a pool process exports: reflexr sets a failed run's
span status to the action's error, and artifactr records a refused commit's exception, and either
text may quote what an action wrote. A span keeps its error status and its exception's type.

`OwnSpans` and `OwnMetrics` export only from the process that made them. A prefork worker's main
process records what its intake refuses; each child it forks carries a copy of its providers,
whose export threads the SDK restarts after the fork. Wrapped in these, the copy in a child
exports nothing, so what the parent recorded is sent once, by the parent.
"""

import os
from collections.abc import Sequence
from typing import Any, Final

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Status


class OwnMetrics(MetricExporter):
    """A metric exporter that exports only in the process that made it."""

    def __init__(self, inner: MetricExporter) -> None:
        # The reader reads the temporality and aggregation it asks for from its exporter.
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._pid = os.getpid()

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        """Export `metrics_data` from the maker's process; elsewhere drop it."""
        if os.getpid() != self._pid:
            return MetricExportResult.SUCCESS
        return self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Flush the inner exporter, in the maker's process."""
        return os.getpid() != self._pid or self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Shut the inner exporter down, in the maker's process."""
        if os.getpid() == self._pid:
            self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class OwnSpans(SpanExporter):
    """A span exporter that exports only in the process that made it."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner
        self._pid = os.getpid()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export `spans` from the maker's process; elsewhere drop them."""
        if os.getpid() != self._pid:
            return SpanExportResult.SUCCESS
        return self._inner.export(spans)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the inner exporter, in the maker's process."""
        return os.getpid() != self._pid or self._inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Shut the inner exporter down, in the maker's process."""
        if os.getpid() == self._pid:
            self._inner.shutdown()


DROPPED_EVENT_ATTRIBUTES: Final = frozenset({"exception.message", "exception.stacktrace"})
"""What an exception event loses on its way out: its message and its traceback's text."""


class ScrubbedSpans(SpanExporter):
    """A span exporter that drops span status texts and exceptions' messages, then exports."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export `spans` without their status texts and exception messages."""
        return self._inner.export([_scrubbed(span) for span in spans])

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the inner exporter."""
        return self._inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Shut the inner exporter down."""
        self._inner.shutdown()


def _scrubbed(span: ReadableSpan) -> ReadableSpan:
    texts = bool(span.status.description) or any(
        DROPPED_EVENT_ATTRIBUTES & set(event.attributes or {}) for event in span.events
    )
    if not texts:
        return span
    events = [
        Event(
            event.name,
            {
                k: v
                for k, v in (event.attributes or {}).items()
                if k not in DROPPED_EVENT_ATTRIBUTES
            },
            event.timestamp,
        )
        for event in span.events
    ]
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=span.attributes,
        events=events,
        links=span.links,
        kind=span.kind,
        status=Status(span.status.status_code),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class Nowhere(SpanExporter):
    """A span exporter that sends nothing: spans for a process that serves only metrics."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Drop `spans`."""
        return SpanExportResult.SUCCESS
