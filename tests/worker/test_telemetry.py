"""Telemetry through the door: a real pool exporting OTLP over HTTP to a receiver in the test.

A worker (prefork, two children) and a dispatcher run with `OTEL_EXPORTER_OTLP_ENDPOINT` naming a
loopback receiver (`otlp_receiver`), as an operator turns telemetry on. The test publishes an
event inside a span of its own, as an application serving a request would: the run's send (in the
dispatcher), its attempt (in a child), reflexr's run span and one span per write carry that span's
trace id, and a retried attempt joins the same trace. The metrics the processes export count the
runs' outcomes and writes, and nothing the pool wrote, nor an action's error text, is in anything
exported. Without the variables a pool exports nothing (every other pool test runs so).
"""

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from otlp_receiver import Received, Span, otlp_receiver
from pools import POOL_ENV, TENANT, Pool, Scene, broker_url, running_pool, wait_for

from actonce.tasks.tracing import in_current_context
from demo.definition import WorkRequested
from demo.feed import request_work
from lab.processes import environment
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow

EXPORT_EVERY_MS = "300"


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[str, Received]]:
    with otlp_receiver() as served:
        yield served


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
    receiver: tuple[str, Received],
) -> Iterator[Pool]:
    endpoint, _ = receiver
    env = {
        **POOL_ENV,
        "ACTONCE_BROKER_URL": broker_url(redis_server, 10),
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_METRIC_EXPORT_INTERVAL": EXPORT_EVERY_MS,
        "OTEL_BSP_SCHEDULE_DELAY": EXPORT_EVERY_MS,
        "OTEL_SERVICE_NAME": "actonce-under-test",
    }
    base = tmp_path_factory.mktemp("telemetry-pool")
    with running_pool("sqlite", env, base, postgres_database, workers=1, concurrency=2) as pool:
        yield pool


def published(scene: Scene, key: str, **knobs: bool) -> str:
    """Publish the demo's work `key` inside a span of the test's own; return its trace id."""
    tracer = TracerProvider().get_tracer("the application")
    event = WorkRequested(key=key, **knobs)
    with tracer.start_as_current_span("publish") as span:
        publishing = request_work(scene.pool.runtime.reflexr, TENANT, scene.workspace_id, event)
        scene.pool.run(in_current_context(publishing))
    return format(span.get_span_context().trace_id, "032x")


def in_trace(received: Received, trace_id: str, *names: str) -> list[Span] | None:
    """The spans of `trace_id` once each of `names` is among them (a name may be a prefix)."""
    with received.lock:
        spans = [span for span in received.spans if span.trace_id == trace_id]
    found = all(any(span.name.startswith(name) for span in spans) for name in names)
    return spans if found else None


def test_a_runs_spans_join_the_publishers_trace_and_the_metrics_count_it(
    pool: Pool, receiver: tuple[str, Received]
) -> None:
    _, received = receiver
    scene = pool.scene("traced")
    key = f"k{uuid.uuid4().hex[:8]}"

    # Given work published inside the application's span
    trace_id = published(scene, key)

    # When the pool has run it
    (run,) = scene.settled()
    assert run.status == "succeeded", run
    names = ("actonce.send", "actonce.attempt", "invoke_workflow", "actonce.write")
    spans = wait_for(lambda: in_trace(received, trace_id, *names), "the run's spans")

    # Then the send, the attempt, reflexr's run and every write are in the publisher's trace,
    # the attempt continuing the dispatcher's send
    (send,) = [span for span in spans if span.name == "actonce.send demo:work"]
    (attempt,) = [span for span in spans if span.name == "actonce.attempt"]
    assert attempt.parent_id == send.span_id
    assert attempt.attributes["actonce.run_id"] == run.id
    assert attempt.attributes["actonce.outcome"] == "succeeded"
    writes = [span for span in spans if span.name == "actonce.write"]
    assert writes and {w.attributes["actonce.write.outcome"] for w in writes} == {"made"}
    assert all(w.attributes["actonce.write.id"] not in ("", "-") for w in writes)

    # And the metrics count the outcome and the writes, for this workspace
    labels = {"actonce.workspace.id": scene.workspace_id}

    def counted() -> bool | None:
        attempts = received.sum_of("actonce.attempts", **labels, **{"actonce.outcome": "succeeded"})
        made = received.sum_of("actonce.writes", **labels, **{"actonce.write.outcome": "made"})
        return True if (attempts, made) == (1, len(writes)) else None

    wait_for(counted, "the attempt and its writes counted")
    assert "telemetry on in the child" in pool.worker_log()
    # and the dispatcher reports its polls and the queues it feeds
    wait_for(lambda: received.sum_of("actonce.dispatcher.poll.duration") or None, "polls counted")
    depths = wait_for(
        lambda: [p for p in received.points if p[0] == "actonce.queue.depth"] or None, "depths"
    )
    assert {labels["actonce.queue"] for _, labels, _ in depths} == {
        "actonce.attempts",
        "actonce.turns",
    }


def test_a_retried_attempt_joins_the_same_trace_and_no_content_is_exported(
    pool: Pool, receiver: tuple[str, Received]
) -> None:
    _, received = receiver
    scene = pool.scene("retried")
    key = f"k{uuid.uuid4().hex[:8]}"

    # Given work whose first attempt fails after its writes, with an error text of its own
    trace_id = published(scene, key, fail_first=True)

    # When the pool has run it, twice
    (run,) = scene.settled()
    assert (run.status, run.attempts) == ("succeeded", 2), run

    # Then both deliveries are in the publisher's trace, the second finding its writes done
    def both() -> list[Span] | None:
        spans = in_trace(received, trace_id, "actonce.attempt") or []
        attempts = [span for span in spans if span.name == "actonce.attempt"]
        return spans if len(attempts) == 2 else None

    spans = wait_for(both, "both attempts in the trace")
    outcomes = sorted(s.attributes["actonce.outcome"] for s in spans if s.name == "actonce.attempt")
    assert outcomes == ["retrying", "succeeded"]
    writes = {s.attributes["actonce.write.outcome"] for s in spans if s.name == "actonce.write"}
    assert "already" in writes, writes

    # And nothing the run wrote, nor its action's error text, left in any span or metric
    with received.lock:
        exported = b"".join(received.raw)
    for written in (f"Working on {key}.", f"check {key}", "failed after its writes"):
        assert written.encode() not in exported, written


def test_an_operators_replay_joins_the_runs_trace(
    pool: Pool, receiver: tuple[str, Received]
) -> None:
    _, received = receiver
    scene = pool.scene("replayed")

    # Given a run whose allowlist forbids its work, dead-lettered
    trace_id = published(scene, f"k{uuid.uuid4().hex[:8]}", die=True)
    (run,) = scene.settled()
    letter = scene.letter_of(run.id)

    # When an operator replays its letter, with the pool's variables
    replayed = subprocess.run(
        [sys.executable, "-m", "actonce.worker.cli", "dead", "replay", letter.id],
        env=environment(pool.env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert replayed.returncode == 0, replayed.stderr

    # Then the replay and the attempt it sent are in the trace the run's event was published in
    def replayed_attempt() -> list[Span] | None:
        spans = in_trace(received, trace_id, "actonce.replay") or []
        attempts = [span for span in spans if span.name == "actonce.attempt"]
        return spans if len(attempts) == 2 else None

    spans = wait_for(replayed_attempt, "the replayed attempt in the run's trace")
    (replay,) = [span for span in spans if span.name == "actonce.replay"]
    assert any(span.parent_id == replay.span_id for span in spans if span.name == "actonce.attempt")


def test_a_warm_stop_flushes_what_every_process_recorded(
    redis_server: RedisHandle,
    tmp_path: Path,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> None:
    # Given a pool that would export its metrics only once an hour: a stop must send them
    with otlp_receiver() as (endpoint, received):
        env = {
            **POOL_ENV,
            "ACTONCE_BROKER_URL": broker_url(redis_server, 12),
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_METRIC_EXPORT_INTERVAL": "3600000",
            "OTEL_BSP_SCHEDULE_DELAY": "3600000",
        }
        with running_pool(
            "sqlite", env, tmp_path, postgres_database, workers=1, concurrency=2
        ) as pool:
            scene = pool.scene("stopped")
            scene.request("one")
            scene.request("two")
            scene.settled(runs=2)
            labels = {"actonce.workspace.id": scene.workspace_id, "actonce.outcome": "succeeded"}
            assert received.sum_of("actonce.attempts", **labels) == 0, "nothing sent before a stop"

        # When the pool has stopped warm (SIGTERM to each process), then
        # Then the children's counts and spans arrived on their way out
        assert received.sum_of("actonce.attempts", **labels) == 2
        with received.lock:
            names = {span.name for span in received.spans}
        assert {"actonce.attempt", "actonce.send demo:work"} <= names
