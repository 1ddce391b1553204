"""Which observers a pool process tells of its lifecycle: the log lines, and Sentry when it runs.

Every process that settles deliveries, keeps refused messages or sweeps dead runs (a worker's
main process and each prefork child, the dispatcher, `actonce dead replay`) calls `observe` once
it has its settings: it starts Sentry when a DSN is set, and installs the observers in
`tasks.observers`, in the order they are told; it starts the process's telemetry too, whose
metrics are one more observer. Once the process has loaded the application's
definition, `observe_also` adds the application's own (`Definition.observers`) after them.
"""

from actonce.tasks import observers
from actonce.worker.definition import Definition
from actonce.worker.observers.metrics import MetricsObserver
from actonce.worker.observers.sentry import SentryObserver, init_sentry
from actonce.worker.process import telemetry
from actonce.worker.settings import Settings


def observe(
    settings: Settings, role: str, *, forks: bool = False, child: int | None = None
) -> None:
    """Start telemetry if the `OTEL_*` variables ask for it (`process.telemetry`, `forks` for a
    prefork worker's main process) and Sentry if a DSN is set, and install this process's
    observers: the log line, Sentry, and the metrics when telemetry runs. The prefork `child` of
    that index serves its metrics one port past its parent's and every child's before it."""
    port = settings.prometheus_port
    if role == "dispatcher" and settings.dispatcher_prometheus_port is not None:
        port = settings.dispatcher_prometheus_port
    prometheus = None
    if port is not None:
        prometheus = (settings.prometheus_host, port + (0 if child is None else 1 + child))
    handle = telemetry.start(
        role, detail=settings.metrics_detail, forks=forks, prometheus=prometheus
    )
    chosen: list[observers.Observer] = [*observers.default_observers()]
    if init_sentry(settings):
        chosen.append(SentryObserver())
    if handle is not None:
        chosen.append(MetricsObserver(handle.meter_provider))
    observers.install(chosen)


def observe_also(definition: Definition) -> None:
    """Add the application's own observers after those installed, each once however often
    the process calls it."""
    installed = observers.installed()
    added = [o for o in definition.observers if all(o is not i for i in installed)]
    observers.install([*installed, *added])
