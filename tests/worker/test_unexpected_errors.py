"""An error nothing expected, for real: Sentry gets its type and stack, never its text.

In a task, Celery's events and Flower get its types and the task's ids, its text stays in the
worker's log, and the run or turn is done once when the cause is gone; in `actonce dead replay`,
the operator reads it, and the letter and run are left as they were. A trigger refuses a write
made outside any action (reflexr's claim of a run, the count of a turn's ask, the operator's
retry of a run) with a message standing for what a database error may quote. The test receives
every Celery event (what Flower shows) and every Sentry envelope the processes send.
"""

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Final

import pytest
from celery_events import celery_events
from pools import POOL_ENV, Pool, broker_url, execute, running_pool, wait_for
from sentry_capture import SentryCapture
from turn_pools import TurnPool, pool_maker

from actonce.worker.settings import Settings
from lab.processes import environment
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow

REDIS_DB: Final = 13
"""The private Redis's database of the module's attempt pool."""

TURNS_REDIS_DB: Final = 10
"""The turn pool's: the attempt pool, alive for the module, serves the turns queue too."""

QUOTED: Final = "quoted-by-the-database-5be1"
"""The trigger's message: what a library's error text may carry, and nothing may publish."""

REFUSE_CLAIMS: Final = (
    "CREATE FUNCTION refuse_claims() RETURNS trigger AS $$ BEGIN "
    f"IF NEW.status = 'running' THEN RAISE EXCEPTION '{QUOTED}'; END IF; RETURN NEW; "
    "END $$ LANGUAGE plpgsql",
    "CREATE TRIGGER refuse_claims BEFORE UPDATE ON reflexr_runs "
    "FOR EACH ROW EXECUTE FUNCTION refuse_claims()",
)


REFUSE_RETRIES: Final = (
    "CREATE FUNCTION refuse_retries() RETURNS trigger AS $$ BEGIN "
    f"IF NEW.status = 'pending' THEN RAISE EXCEPTION '{QUOTED}'; END IF; RETURN NEW; "
    "END $$ LANGUAGE plpgsql",
    "CREATE TRIGGER refuse_retries BEFORE UPDATE ON reflexr_runs "
    "FOR EACH ROW EXECUTE FUNCTION refuse_retries()",
)

REFUSE_ASKS: Final = (
    "CREATE FUNCTION refuse_asks() RETURNS trigger AS $$ BEGIN "
    f"IF NEW.asks > OLD.asks THEN RAISE EXCEPTION '{QUOTED}'; END IF; RETURN NEW; "
    "END $$ LANGUAGE plpgsql",
    "CREATE TRIGGER refuse_asks BEFORE UPDATE ON actonce_turn_requests "
    "FOR EACH ROW EXECUTE FUNCTION refuse_asks()",
)


@pytest.fixture(scope="module")
def watched(
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> Iterator[tuple[Pool, SentryCapture]]:
    """A pool on PostgreSQL (one worker, one child, a dispatcher) reporting to a Sentry here;
    each test counts the events it caused from those there before it."""
    tmp_path = tmp_path_factory.mktemp("unexpected")
    with SentryCapture(key="unexpectedkey") as sentry:
        env = {
            **POOL_ENV,
            "ACTONCE_BROKER_URL": broker_url(redis_server, REDIS_DB),
            "SENTRY_DSN": sentry.dsn,
        }
        with running_pool(
            "postgres", env, tmp_path, postgres_database, workers=1, concurrency=1
        ) as pool:
            yield pool, sentry


@pytest.fixture
def make_turn_pool(tmp_path: Path, redis_server: RedisHandle) -> Iterator[Callable[..., TurnPool]]:
    """Build a turn pool's stores and runtime; its processes start later."""
    with pool_maker(tmp_path, redis_server, TURNS_REDIS_DB) as make:
        yield make


def test_an_unexpected_error_is_published_by_type_reported_by_stack_and_its_run_done_once(
    watched: tuple[Pool, SentryCapture],
) -> None:
    pool, sentry = watched
    before = len(sentry.events())
    events: list[dict[str, Any]] = []
    with celery_events(Settings.from_env(pool.env), events):
        # Given claims refused by the database with a message that quotes data
        url = pool.env["ACTONCE_DATABASE_URL"]
        pool.run(execute(url, *REFUSE_CLAIMS))

        # When a run is fired and its attempt's claim fails
        scene = pool.scene("unexpected")
        scene.request("refused")

        # Then its task fails naming the error's types and the run, not the error's text
        failed = wait_for(lambda: _failed(events), "a task-failed event", timeout_s=30)
        (run,) = scene.runs()
        assert failed["exception"] == (
            "UnexpectedError('unexpected_error: ExceptionGroup(DBAPIError) in attempt "
            f"run_id={run.id}; its traceback is in the worker log')"
        ), failed
        # Sentry hears of it from the worker's log line, by type and stack, not from Celery
        reported = sentry.wait_for(lambda found: len(found) > before, "a Sentry event")[before:]
        for event in reported:
            assert event["logger"] == "actonce.attempt", event
            assert event["logentry"]["message"] == "%s failed unexpectedly (%s)", event
        types = [value["type"] for value in reported[0]["exception"]["values"]]
        assert "RaiseError" in types and "DBAPIError" in types, types
        frames = reported[0]["exception"]["values"][-1]["stacktrace"]["frames"]
        assert any(frame["module"] == "reflexr.workspace.executor" for frame in frames)
        # The worker's own log keeps the text, with its traceback (what an operator reads)
        log = pool.local.log("worker0")
        assert "failed unexpectedly (ExceptionGroup(DBAPIError))" in log
        assert QUOTED in log
        pool.assert_alive()

        # When the cause is gone, the sweep sends the run again: done, its notice posted once
        pool.run(execute(url, "DROP TRIGGER refuse_claims ON reflexr_runs"))
        (done,) = scene.settled(timeout_s=30)
        assert done.status == "succeeded", done
        assert scene.census().messages[done.output["notice"]] == 1

    # And none of its deliveries published or reported the error's text
    assert QUOTED not in json.dumps(events, default=str)
    assert QUOTED.encode() not in sentry.received()


def test_an_unexpected_error_in_a_turn_is_published_by_type_and_the_turn_taken_once(
    postgres_url: str, make_turn_pool: Callable[..., TurnPool]
) -> None:
    # Given a pool on PostgreSQL whose run sent a message, its turn not yet taken
    pool = make_turn_pool(
        "tests.worker.turn_apps:counted",
        ACTONCE_DATABASE_URL=postgres_url,
        ACTONCE_TURN_GRACE_S="1",
    )
    pool.serve()
    pool.request(ask=True)
    pool.wait_for(lambda: pool.run_status() == "succeeded" or None, "run succeeded")
    [request] = pool.wait_for(lambda: pool.requests() or None, "the turn request")
    # and the database refusing to count an ask, with a message that quotes data
    pool.runtime.run(execute(postgres_url, *REFUSE_ASKS))
    events: list[dict[str, Any]] = []
    with celery_events(Settings.from_env(pool.env), events):
        # When a turn worker starts and its ask is refused
        pool.worker("turns", "actonce.turns")

        # Then its task fails naming the error's types and the message, not the error's text
        failed = pool.wait_for(lambda: _failed(events), "a task-failed event", timeout_s=30)
        assert re.fullmatch(
            r"UnexpectedError\('unexpected_error: \w+(\(\w+\))? in turn "
            rf"message_id={request.message_id}; its traceback is in the worker log'\)",
            failed["exception"],
        ), failed
        assert QUOTED in pool.log("turns")
        assert pool.processes["turns"].poll() is None, pool.log("turns")

        # When the cause is gone, the sweep announces it again: one turn takes it
        pool.runtime.run(execute(postgres_url, "DROP TRIGGER refuse_asks ON actonce_turn_requests"))
        pool.wait_for(lambda: all(r.taken_at for r in pool.requests()) or None, "request taken")
        seen = pool.thread()
        assert (len(seen.rule_messages), seen.turns, seen.replies, seen.model_calls) == (1, 1, 1, 1)

    # And none of its deliveries published the error's text
    assert QUOTED not in json.dumps(events, default=str)


def test_dead_replay_reports_an_unexpected_error_and_changes_nothing(
    watched: tuple[Pool, SentryCapture],
) -> None:
    pool, sentry = watched
    # Given a dead run's letter, and the database refusing the operator's retry of the run
    scene = pool.scene("replay")
    scene.request("dies", die=True)
    (run,) = scene.settled()
    letter = scene.letter_of(run.id, timeout_s=20)
    reported = len(sentry.wait_for(lambda found: _tagged(found, run.id), "the letter's report"))
    url = pool.env["ACTONCE_DATABASE_URL"]
    pool.run(execute(url, *REFUSE_RETRIES))

    # When an operator replays it
    done = _replay(pool, letter.id)

    # Then it fails in one line naming the error, no traceback; Sentry hears of it by type
    # and stack
    assert done.returncode == 1, done
    [said] = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert said.startswith(f"Error: replaying {letter.id} failed: DBAPIError"), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    events = sentry.wait_for(lambda found: len(found) > reported, "the replay's report")
    [failure] = events[reported:]
    assert failure["tags"]["component"] == "dead replay", failure
    values = failure["exception"]["values"]
    assert "DBAPIError" in [value["type"] for value in values], values
    assert values[-1]["stacktrace"]["frames"], values[-1]
    assert QUOTED.encode() not in sentry.received()
    # and nothing changed: the letter is not replayed, the run still dead, nothing sent
    [kept] = [each for each in pool.letters() if each.id == letter.id]
    assert kept.replays == 0, kept
    assert [each.status for each in scene.runs()] == ["dead"]

    # When the cause is gone, the replay goes through, though a letter named beside it is gone
    pool.run(execute(url, "DROP TRIGGER refuse_retries ON reflexr_runs"))
    again = _replay(pool, "dl_gone", letter.id)
    assert again.stdout.startswith(f"replayed {letter.id}: run {run.id}"), again.stdout
    # and the command exits 1, naming the letter it could not replay
    assert again.returncode == 1, again
    errors = [line for line in again.stderr.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: no dead letter dl_gone"], again.stderr


def _replay(pool: Pool, *letter_ids: str) -> "subprocess.CompletedProcess[str]":
    """Run `actonce dead replay letter_ids…` as an operator does, with the pool's settings."""
    return subprocess.run(
        [sys.executable, "-m", "actonce.worker.cli", "dead", "replay", *letter_ids],
        env=environment(pool.env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _tagged(events: list[dict[str, Any]], run_id: str) -> bool:
    """Whether one of `events` is tagged with `run_id` (a dead letter's report)."""
    return any((event.get("tags") or {}).get("run_id") == run_id for event in events)


def _failed(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((e for e in events if e.get("type") == "task-failed"), None)
