"""An application's observer, given in its `Definition`, hears each delivery of a real pool once.

A real `actonce worker` (prefork, two children) and dispatcher run the demo with `Tally`
(`observed_apps.counted`), which appends a line per event it is told to a file every process
shares. Runs that succeed at once, succeed on their second attempt, die at their first, and are
delivered twice, and a message the intake refuses, are each heard once per delivery, with what the
lifecycle's table made of it, in the process that settled it: the children for attempts, the
worker's main process for the intake.
"""

import json
import pickle
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import kombu
import pytest
from observed_apps import FILE_VARIABLE
from pools import POOL_ENV, Pool, broker_url, running_pool, wait_for

from actonce.tasks.attempt import ATTEMPT_TASK
from actonce.worker.settings import ATTEMPTS_QUEUE
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def heard_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("observed") / "heard.jsonl"


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
    heard_file: Path,
) -> Iterator[Pool]:
    env = {
        **POOL_ENV,
        "ACTONCE_APP": "tests.worker.observed_apps:counted",
        "ACTONCE_BROKER_URL": broker_url(redis_server, 9),
        FILE_VARIABLE: str(heard_file),
    }
    base = tmp_path_factory.mktemp("observed-pool")
    with running_pool("sqlite", env, base, postgres_database, workers=1, concurrency=2) as pool:
        yield pool


def heard(path: Path) -> list[dict[str, Any]]:
    """Every line the pool's observers wrote so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_each_attempt_delivery_is_heard_once_with_what_followed(
    pool: Pool, heard_file: Path
) -> None:
    scene = pool.scene("observed")
    # Given work that succeeds, work refused once, and work its allowlist forbids
    scene.request("ok")
    scene.request("refused", refuse_first=True)
    scene.request("forbidden", die=True)

    # When the pool has run them
    runs = {run.status + str(run.attempts): run for run in scene.settled(runs=3)}
    ok, refused, forbidden = runs["succeeded1"], runs["succeeded2"], runs["dead1"]
    lines = wait_for(lambda: _attempts_of(heard_file, 4), "four attempt deliveries heard")

    # Then each delivery was heard once, as the table settled it, with its letter if it made one
    by_run = {
        run.id: [(line["happened"], line["letter"]) for line in lines if line["run_id"] == run.id]
        for run in (ok, refused, forbidden)
    }
    assert by_run[ok.id] == [("succeeded", None)]
    assert by_run[refused.id] == [("retrying", None), ("succeeded", None)]
    assert by_run[forbidden.id] == [("dead", "not_allowed")]
    assert {line["rule"] for line in lines} == {"demo:work"}

    # When the successful run is delivered again
    scene.send(ok.id)

    # Then the duplicate is heard once, as having changed nothing
    again = wait_for(lambda: _attempts_of(heard_file, 5), "the duplicate heard")
    heard_of_ok = [(line["happened"], line["made"]) for line in again if line["run_id"] == ok.id]
    assert [happened for happened, _ in heard_of_ok] == ["succeeded", "not_claimed"]
    assert heard_of_ok[0][1] > 0 and heard_of_ok[1][1] == 0, "the duplicate made no write"


def test_a_message_the_intake_refuses_is_heard_once_in_the_workers_main_process(
    pool: Pool, heard_file: Path
) -> None:
    # Given a run the children attempted
    scene = pool.scene("refusal")
    scene.request("seen")
    (run,) = scene.settled()
    wait_for(lambda: [ln for ln in heard(heard_file) if ln.get("run_id") == run.id] or None, "it")

    # When a pickled body is published to the attempts queue
    task_id = str(uuid.uuid4())
    with kombu.Connection(pool.env["ACTONCE_BROKER_URL"]) as connection:
        connection.Producer().publish(
            pickle.dumps(((), {"run_id": "fir_x"}, {})),
            exchange=ATTEMPTS_QUEUE,
            routing_key=ATTEMPTS_QUEUE,
            content_type="application/x-python-serialize",
            content_encoding="binary",
            headers={"id": task_id, "task": ATTEMPT_TASK, "lang": "py"},
            declare=[kombu.Queue(ATTEMPTS_QUEUE, kombu.Exchange(ATTEMPTS_QUEUE, "direct"))],
        )

    # Then the refusal is heard once, with its reason, in the process that read the queue
    def refusals() -> list[dict[str, Any]] | None:
        found = [line for line in heard(heard_file) if line.get("task_id") == task_id]
        return found or None

    (line,) = wait_for(refusals, "the refusal heard")
    assert (line["hook"], line["reason"]) == ("refused", "unsupported_content")
    attempt_pids = {entry["pid"] for entry in heard(heard_file) if entry["hook"] == "attempt"}
    assert line["pid"] not in attempt_pids, "the intake runs in the worker's main process"


def test_without_the_otel_variables_no_process_sets_telemetry_up(pool: Pool) -> None:
    # This pool runs without OTEL_* variables, as every pool but telemetry's own does
    assert not any(name.startswith("OTEL_") for name in pool.env)

    assert "telemetry on" not in pool.worker_log()


def _attempts_of(path: Path, count: int) -> list[dict[str, Any]] | None:
    lines = [line for line in heard(path) if line["hook"] == "attempt"]
    return lines if len(lines) >= count else None
