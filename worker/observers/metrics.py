"""actonce's metrics: one registry of every instrument the pool records, and the observer that
records them from the lifecycle's announcements.

Each `Metric` declares its name, instrument, unit, description and the attributes it may carry,
as the lattice libraries' registries do; `MetricsObserver` records only declared attributes, so a
metric cannot grow one by accident, and the docs' list of metrics is generated from `METRICS`.

The cardinality policy is the lattice's: run, message, task and event ids are never attributes
(traces carry them); rule names and reason codes are, since code bounds them; tenant and
workspace are by default, and `ACTONCE_METRICS_DETAIL` (`worker.process.telemetry`) drops them
before aggregation through the contribution's views. Nothing here needs the SDK: with no
telemetry configured, the API's meter records nothing and costs next to nothing.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import redis
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from actonce.tasks.observers import (
    WRITE_KINDS,
    AttemptSettled,
    MessageRefused,
    Observer,
    RunLettered,
    TurnSettled,
)
from actonce.worker.process.broker_access import broker_client
from actonce.worker.settings import Settings

SCOPE: Final = "actonce"
"""The instrumentation scope of actonce's own spans and metrics."""

TENANT: Final = "actonce.tenant.id"
WORKSPACE: Final = "actonce.workspace.id"
RULE: Final = "actonce.rule"
OUTCOME: Final = "actonce.outcome"
FOLLOWS: Final = "actonce.follows"
REASON: Final = "actonce.reason"
WRITE: Final = "actonce.write.outcome"
QUEUE: Final = "actonce.queue"

SCOPED: Final = frozenset({TENANT, WORKSPACE})
"""The tenancy attributes, which the metrics detail limits."""

DURATION_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
"""Bucket boundaries for attempts and settle latencies, in seconds."""

type Instrument = Literal["counter", "histogram", "gauge"]
"""The kind of OpenTelemetry instrument a metric is recorded with."""


@dataclass(frozen=True)
class Metric:
    """One of actonce's metrics: what it measures, and the attributes it may carry."""

    name: str
    instrument: Instrument
    unit: str
    description: str
    attributes: frozenset[str] = SCOPED

    @property
    def prometheus_series(self) -> frozenset[str]:
        """Every series name Prometheus stores this metric under, as OpenTelemetry's
        Prometheus translation writes it: dots become underscores, seconds are named,
        counters end in `_total`, histograms are buckets, a sum and a count."""
        name = self.name.replace(".", "_")
        if self.unit == "s":
            name += "_seconds"
        if self.instrument == "counter":
            return frozenset({f"{name}_total"})
        if self.instrument == "histogram":
            return frozenset({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
        return frozenset({name})


def _metric(
    name: str, instrument: Instrument, unit: str, description: str, *attributes: str
) -> Metric:
    return Metric(name, instrument, unit, description, frozenset(attributes) | SCOPED)


ATTEMPTS = _metric(
    "actonce.attempts",
    "counter",
    "{delivery}",
    "Attempt deliveries settled, by rule, what happened and what followed.",
    RULE,
    OUTCOME,
    FOLLOWS,
)
ATTEMPT_DURATION = _metric(
    "actonce.attempt.duration",
    "histogram",
    "s",
    "How long an attempt delivery took, from the task's start to its settling.",
    RULE,
    OUTCOME,
)
SETTLE_LATENCY = _metric(
    "actonce.run.settle_latency",
    "histogram",
    "s",
    "From a run's firing to the delivery that settled it (succeeded or dead).",
    RULE,
    OUTCOME,
)
WRITES = _metric(
    "actonce.writes",
    "counter",
    "{write}",
    "Writes attempts made (`made`), found done already (`already`: the act-once ratio), were "
    "refused (`refused`) or met a version conflict (`conflicts`).",
    RULE,
    WRITE,
)
DEAD_LETTERS = _metric(
    "actonce.dead_letters",
    "counter",
    "{letter}",
    "Dead letters kept, by reason and rule.",
    REASON,
    RULE,
)
REFUSED = _metric(
    "actonce.messages.refused",
    "counter",
    "{message}",
    "Messages the intake refused before Celery read them, by reason and queue.",
    REASON,
    QUEUE,
)
POLL_DURATION = _metric(
    "actonce.dispatcher.poll.duration",
    "histogram",
    "s",
    "How long one of the dispatcher's polls took: ticking, evaluating, sending, sweeping.",
)
DISPATCH_LAG = Metric(
    "actonce.dispatcher.lag",
    "gauge",
    "s",
    "How late the dispatcher's last sends were: from the oldest sent run's due time to its "
    "send; 0 after a poll that had nothing to send.",
    frozenset(),
)
QUEUE_WAIT = _metric(
    "actonce.dispatcher.queue_wait",
    "histogram",
    "s",
    "How long a run waited in the dispatcher, from when it first saw the run due (fired, or "
    "found due) to its send: with fair share, its wait for its tenant's turn.",
)
QUEUE_DEPTH = Metric(
    "actonce.queue.depth",
    "gauge",
    "{message}",
    "Messages waiting in each of actonce's queues, read by the dispatcher.",
    frozenset({QUEUE}),
)
UNACKED = Metric(
    "actonce.queue.unacked",
    "gauge",
    "{message}",
    "Messages delivered to workers and not acknowledged yet, read by the dispatcher.",
    frozenset(),
)
TURNS = _metric(
    "actonce.turns",
    "counter",
    "{delivery}",
    "Turn deliveries settled, by what the ask found and what followed.",
    OUTCOME,
    FOLLOWS,
)

METRICS: Final[Mapping[str, Metric]] = {
    metric.name: metric
    for metric in (
        ATTEMPTS,
        ATTEMPT_DURATION,
        SETTLE_LATENCY,
        WRITES,
        DEAD_LETTERS,
        REFUSED,
        TURNS,
        POLL_DURATION,
        DISPATCH_LAG,
        QUEUE_WAIT,
        QUEUE_DEPTH,
        UNACKED,
    )
}
"""Every metric actonce records, by name."""


def kept_attributes(metric: Metric, detail: str) -> frozenset[str]:
    """Return the attributes of `metric` kept at a metrics detail (`workspace`, `tenant`,
    `none`)."""
    dropped = {"workspace": frozenset[str](), "tenant": frozenset({WORKSPACE}), "none": SCOPED}
    return metric.attributes - dropped[detail]


class MetricsObserver(Observer):
    """Records actonce's metrics from each announcement, through the OpenTelemetry API."""

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)
        self._attempts = _counter(meter, ATTEMPTS)
        self._duration = _histogram(meter, ATTEMPT_DURATION)
        self._latency = _histogram(meter, SETTLE_LATENCY)
        self._writes = _counter(meter, WRITES)
        self._letters = _counter(meter, DEAD_LETTERS)
        self._refused = _counter(meter, REFUSED)
        self._turns = _counter(meter, TURNS)

    def attempt_settled(self, event: AttemptSettled) -> None:
        """Count the delivery, its duration, its writes, its latency and its letter."""
        scoped = _scoped(event.tenant_id, event.workspace_id)
        rule = event.rule or "-"
        outcome = {**scoped, RULE: rule, OUTCOME: event.happened.value}
        self._attempts.add(1, {**outcome, FOLLOWS: event.follows.value})
        self._duration.record(event.duration_s, outcome)
        for kind in WRITE_KINDS:
            if count := event.writes.get(kind, 0):
                self._writes.add(count, {**scoped, RULE: rule, WRITE: kind})
        if event.settled_after_s is not None:
            self._latency.record(event.settled_after_s, outcome)
        if event.letter is not None:
            self._letters.add(1, {**scoped, RULE: rule, REASON: str(event.letter.reason)})

    def turn_settled(self, event: TurnSettled) -> None:
        """Count the turn's delivery, and its letter."""
        scoped = _scoped(event.tenant_id, event.workspace_id)
        self._turns.add(1, {**scoped, OUTCOME: event.outcome, FOLLOWS: event.follows.value})
        if event.letter is not None:
            rule = event.letter.rule or "-"
            self._letters.add(1, {**scoped, RULE: rule, REASON: str(event.letter.reason)})

    def message_refused(self, event: MessageRefused) -> None:
        """Count the refusal, and its letter when it is new."""
        self._refused.add(1, {**_scoped(None, None), REASON: str(event.reason), QUEUE: event.queue})
        if event.letter is not None:
            reason = str(event.letter.reason)
            self._letters.add(1, {**_scoped(None, None), RULE: "-", REASON: reason})

    def run_lettered(self, event: RunLettered) -> None:
        """Count the letter the sweep wrote."""
        letter = event.letter
        scoped = _scoped(letter.tenant_id, letter.workspace_id)
        self._letters.add(1, {**scoped, RULE: letter.rule or "-", REASON: str(letter.reason)})


def _counter(meter: metrics.Meter, metric: Metric) -> metrics.Counter:
    return meter.create_counter(metric.name, metric.unit, metric.description)


def _histogram(meter: metrics.Meter, metric: Metric) -> metrics.Histogram:
    return meter.create_histogram(
        metric.name,
        metric.unit,
        metric.description,
        explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
    )


def _scoped(tenant_id: str | None, workspace_id: str | None) -> dict[str, str]:
    return {TENANT: tenant_id or "-", WORKSPACE: workspace_id or "-"}


class DispatcherMetrics:
    """The dispatcher's own metrics: its polls, how late it sends, and the queues it feeds.

    The queue gauges are read from Redis when the process's metric reader collects, so a
    dispatcher without telemetry never reads them.

    Args:
        settings: The settings naming the broker the queues are in.
        queues: The queues to report.
        unacked_key: kombu's hash of delivered, unacknowledged messages.
    """

    def __init__(self, settings: Settings, queues: Sequence[str], unacked_key: str) -> None:
        meter = metrics.get_meter(SCOPE)
        self._polls = _histogram(meter, POLL_DURATION)
        self._waits = _histogram(meter, QUEUE_WAIT)
        self._lag = meter.create_gauge(
            DISPATCH_LAG.name, DISPATCH_LAG.unit, DISPATCH_LAG.description
        )
        self._settings = settings
        self._queues = tuple(queues)
        self._unacked_key = unacked_key
        self._client: redis.Redis | None = None
        meter.create_observable_gauge(
            QUEUE_DEPTH.name, [self._depths], QUEUE_DEPTH.unit, QUEUE_DEPTH.description
        )
        meter.create_observable_gauge(
            UNACKED.name, [self._unacked], UNACKED.unit, UNACKED.description
        )

    def polled(self, seconds: float) -> None:
        """Record one poll's duration."""
        self._polls.record(seconds, _scoped(None, None))

    def waited(self, tenant_id: str, workspace_id: str, seconds: float) -> None:
        """Record how long a run waited in the dispatcher before its send."""
        self._waits.record(max(0.0, seconds), _scoped(tenant_id, workspace_id))

    def sent(self, late_s: float) -> None:
        """Record how late the oldest run of a send was (0 when nothing was sent)."""
        self._lag.set(max(0.0, late_s))

    def _redis(self) -> redis.Redis:
        if self._client is None:
            self._client = broker_client(self._settings, socket_timeout=2)
        return self._client

    def _depths(self, _: CallbackOptions) -> Iterable[Observation]:
        try:
            return [
                Observation(int(self._redis().llen(queue)), {QUEUE: queue})
                for queue in self._queues
            ]
        except (redis.RedisError, OSError):
            return []  # a broker away is said by the dispatcher's own log, not by a gauge

    def _unacked(self, _: CallbackOptions) -> Iterable[Observation]:
        try:
            return [Observation(int(self._redis().hlen(self._unacked_key)))]
        except (redis.RedisError, OSError):
            return []
