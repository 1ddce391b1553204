"""Telemetry in a pool process: the lattice's `configure_telemetry`, when the standard variables
ask for it, and nothing at all when they do not.

A process wants telemetry when `OTEL_EXPORTER_OTLP_ENDPOINT` (or a signal's own endpoint) is set,
or `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER` names an exporter other than `none`, and
`OTEL_SDK_DISABLED` is not `true`. Then `start` calls `lattice_core.otel.configure_telemetry`
with reflexr's, artifactr's and relayr's contributions and actonce's own (`contribution`), under
`OTEL_SERVICE_NAME` (default `actonce`), the rest read from the standard `OTEL_*` variables;
`ACTONCE_METRICS_DETAIL` says how much tenancy the metrics keep.
Without them, nothing is imported beyond the OpenTelemetry API, whose no-op tracer and meter the
code records through.

Every long-lived process starts it once: a worker's main process at `worker_init`, each prefork
child at `worker_process_init` (after the fork: the SDK's export threads do not survive one), the
dispatcher, and the commands that write. `stop` flushes and shuts it down: at a child's
`worker_process_shutdown` (so a child recycled by `max_tasks_per_child` or a warm stop loses
nothing it recorded), at the worker's shutdown and at the dispatcher's exit. Each process exports
its own counts, so a prefork child's are neither lost with it nor counted twice.

Log records are not exported: a library's error text in a log line may quote content, and the
process's log already holds them. Spans leave without status texts and exception messages
(`worker.process.exporting.ScrubbedSpans`), for the same reason.
"""

import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from lattice_core.otel.configure import TelemetryHandle
    from lattice_core.otel.contribution import Contribution, MetricsDetail
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.metrics.view import View
    from opentelemetry.sdk.trace import ReadableSpan

log = logging.getLogger("actonce.telemetry")

ENDPOINTS: Final = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)
"""The standard variables that name where OTLP goes: any one of them turns telemetry on."""

EXPORTERS: Final = ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER")
"""The standard variables that name an exporter: one other than `none` turns telemetry on."""

_handle: "TelemetryHandle | None" = None
_server: "WSGIServer | None" = None


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Return whether the standard variables ask this process for telemetry."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if any(env.get(name, "").strip() for name in ENDPOINTS):
        return True
    return any(env.get(name, "none").strip().lower() not in ("", "none") for name in EXPORTERS)


def start(
    role: str,
    *,
    detail: "MetricsDetail" = "workspace",
    forks: bool = False,
    prometheus: tuple[str, int] | None = None,
) -> "TelemetryHandle | None":
    """Configure telemetry in this process if the variables ask for it, once; return its handle,
    or None when it does not run. `role` (`worker`, `child`, `dispatcher`, a command's name) is
    logged, never exported; `detail` is `ACTONCE_METRICS_DETAIL`. With `prometheus` (a host and
    a port), the metrics are served there for Prometheus to scrape instead of sent over OTLP,
    from a registry of the process's own, and spans go over OTLP only if the variables ask.

    A process that `forks` (a prefork worker's main process) keeps its providers to itself
    (`set_global=False`, so each child sets up its own as the global ones) and exports only from
    itself: a child carries a copy of what the parent had recorded, which it must not send again.
    """
    global _handle
    if _handle is not None:
        return _handle
    otlp = wanted()
    if not otlp and prometheus is None:
        return None
    import artifactr.otel
    import reflexr.otel
    import relayr.otel
    from lattice_core.otel.configure import configure_telemetry
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from actonce.worker.process.exporting import Nowhere, OwnSpans, ScrubbedSpans

    spans = ScrubbedSpans(OTLPSpanExporter()) if otlp else Nowhere()
    own: dict[str, Any] = {"span_exporter": spans}
    if prometheus is not None:
        own["metric_reader"] = _served(*prometheus)
    if forks:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        from actonce.worker.process.exporting import OwnMetrics

        own["span_exporter"] = OwnSpans(spans)
        if prometheus is None:
            own["metric_reader"] = PeriodicExportingMetricReader(OwnMetrics(OTLPMetricExporter()))
        own["set_global"] = False
    _handle = configure_telemetry(
        reflexr.otel.telemetry(),
        artifactr.otel.telemetry(),
        relayr.otel.telemetry(),
        contribution(),
        service_name=os.environ.get("OTEL_SERVICE_NAME", "actonce"),
        metrics_detail=detail,
        # The pool's own statements are many per attempt: their spans would cost more than
        # the attempt's; reflexr's and artifactr's spans say which transaction ran.
        instrument=(),
        logs=False,
        **own,
    )
    said = "OTLP, from the OTEL_* variables" if otlp else "no OTLP"
    if prometheus is not None:
        said += f"; metrics for Prometheus on {prometheus[0]}:{prometheus[1]}"
    log.info("telemetry on in the %s (%s)", role, said)
    return _handle


def running() -> bool:
    """Whether telemetry runs in this process."""
    return _handle is not None


def stop() -> None:
    """Flush what this process recorded and shut its telemetry down, if it runs."""
    global _handle, _server
    handle, _handle = _handle, None
    server, _server = _server, None
    if server is not None:
        server.shutdown()
        server.server_close()
    if handle is not None:
        handle.shutdown()


def forget_after_fork() -> None:
    """Drop the parent's handle in a forked child, which starts its own: the parent's exports
    only from the parent (`start(forks=True)`), and its metrics endpoint is served by the
    parent's thread, which the child does not have."""
    global _handle, _server
    _handle = None
    _server = None


def _served(host: str, port: int) -> "MetricReader":
    """Return a Prometheus reader over a registry of this process's own, served on `port`."""
    global _server
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    _server, _ = start_http_server(port, addr=host, registry=registry)
    return reader


def contribution() -> "Contribution":
    """Return actonce's contribution: its metric views, and its spans in the pool's traces."""
    from lattice_core.otel.contribution import Contribution

    return Contribution(
        name="actonce",
        metric_views=metric_views,
        should_export_span=_in_actonces_traces,
        instrument=frozenset(),
    )


def metric_views(detail: "MetricsDetail" = "workspace") -> "Sequence[View]":
    """Return views that keep only the attributes actonce's metrics may carry at `detail`."""
    from opentelemetry.sdk.metrics.view import View

    from actonce.worker.observers.metrics import METRICS, SCOPE, kept_attributes

    return [
        View(
            instrument_name=metric.name,
            meter_name=SCOPE,
            attribute_keys=set(kept_attributes(metric, detail)),
        )
        for metric in METRICS.values()
    ]


def _in_actonces_traces(span: "ReadableSpan") -> bool:
    return span.instrumentation_scope is not None and span.instrumentation_scope.name == "actonce"
