"""Turns under faults, attempts under a broker's restart, and a dispatcher's death, through the
door: real `actonce worker` and `actonce dispatch` processes.

Attempts and turns are served by separate workers (`-Q actonce.attempts`, `-Q actonce.turns`),
as the operations docs advise when turns are slow. Each test counts one turn as artifactr's log and
the model see it (`turn_pools.Turns`).
"""

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import pytest
import redis
from celery_events import celery_events
from pools import drop_the_waiting_connection
from reflexr.core import Run
from sentry_capture import SentryCapture
from turn_apps import RELEASE_FILE
from turn_pools import TENANT, WORKSPACE, TurnPool, Turns, pool_maker

from actonce.tasks.attempt import ATTEMPT_TASK
from actonce.tasks.turns import TURN_REQUESTS, TurnRequest
from actonce.worker.app import make_celery
from actonce.worker.dispatching.turn_sends import send_turn
from actonce.worker.settings import Settings
from demo.definition import THREAD_ID
from lab.redis import RedisHandle, find_or_start_redis

pytestmark = pytest.mark.slow

REDIS_DB: Final = 5
"""The private Redis's database these pools use: no other module's."""


@pytest.fixture
def make_pool(tmp_path: Path, redis_server: RedisHandle) -> Iterator[Callable[..., TurnPool]]:
    """Build a pool's stores and runtime for a definition and settings; processes start later."""
    with pool_maker(tmp_path, redis_server, REDIS_DB) as make:
        yield make


def test_a_turn_agent_that_cannot_take_messages_is_refused_at_start(
    make_pool: Callable[..., TurnPool],
) -> None:
    pool = make_pool("tests.worker.turn_apps:no_capability")
    pool.start("worker", "worker", "-c", "1")
    code = pool.processes["worker"].wait(timeout=60)
    refusals = [line for line in pool.log("worker").splitlines() if "refuses to start" in line]
    assert code == 3, pool.log("worker")
    assert refusals and "ArtifactWorkspace" in refusals[-1], pool.log("worker")


def test_a_worker_killed_after_the_commit_loses_no_turn_and_the_dispatcher_announces_it(
    make_pool: Callable[..., TurnPool],
) -> None:
    # Given a dispatcher with a 2 s grace, and a worker for attempts only: no turn worker yet
    pool = make_pool("tests.worker.turn_apps:counted", ACTONCE_TURN_GRACE_S="2")
    pool.serve()
    # When an attempt commits its message and is SIGKILLed while it sleeps, before any ask
    pool.request(ask=True, slow_s=30)
    pool.wait_for(lambda: pool.thread().rule_messages or None, "committed message")
    os.kill(pool.child_of("attempts"), signal.SIGKILL)
    # Then its retry succeeds, its message and request still one each, and no turn ran
    pool.wait_for(lambda: pool.run_status() == "succeeded" or None, "run retried to success")
    [message_id] = pool.thread().rule_messages
    [request] = pool.requests()
    assert request.taken_at is None and request.asks == 0
    # When every announcement is lost from Redis, and a turn worker starts
    redis.Redis.from_url(pool.env["ACTONCE_BROKER_URL"]).delete("actonce.turns")
    announced_before = pool.log("dispatcher").count(f"turn re-announced message_id={message_id}")
    pool.worker("turns", "actonce.turns")
    # Then the dispatcher announces it again, and one turn takes it
    pool.wait_for(lambda: pool.replied_and_ended(1, 1), "one turn")
    announced = pool.log("dispatcher").count(f"turn re-announced message_id={message_id}")
    assert announced > announced_before, pool.log("dispatcher")
    pool.wait_for(lambda: all(r.taken_at for r in pool.requests()) or None, "request taken")
    seen = pool.thread()
    assert (len(seen.rule_messages), seen.turns, seen.replies, seen.model_calls) == (1, 1, 1, 1)


def _queued_turn(make_pool: Callable[..., TurnPool]) -> tuple[TurnPool, "redis.Redis"]:
    """A dispatcher with a 1 s grace and an attempts worker, no turn worker, and a run that
    sent: its turn's announcement waits in the turns queue. Returns the pool and its broker."""
    pool = make_pool("tests.worker.turn_apps:counted", ACTONCE_TURN_GRACE_S="1")
    pool.serve()
    broker = redis.Redis.from_url(pool.env["ACTONCE_BROKER_URL"])
    pool.request(ask=True)
    pool.wait_for(lambda: pool.run_status() == "succeeded" or None, "run succeeded")
    return pool, broker


def test_a_turn_still_queued_is_not_announced_again(
    make_pool: Callable[..., TurnPool],
) -> None:
    # Given a dispatcher with a 1 s grace (a turn's mark lives 2 s), and no turn worker yet
    # When a run sends, and its turn's announcement waits in the turns queue
    pool, broker = _queued_turn(make_pool)
    assert broker.llen("actonce.turns") == 1

    def marked() -> list[Any] | None:
        return broker.keys("actonce:turn:*") or None

    # Then the dispatcher's sweep finds it untaken past its grace and marks it, and three of the
    # mark's lifetimes later it is still marked, with one announcement queued: none sent again
    pool.wait_for(marked, "the turn's mark")
    seen = time.monotonic()
    pool.wait_for(lambda: (time.monotonic() - seen > 6 and marked()) or None, "a kept mark")
    assert broker.llen("actonce.turns") == 1
    assert "turn re-announced" not in pool.log("dispatcher"), pool.log("dispatcher")
    # When a turn worker starts, one turn takes it
    pool.worker("turns", "actonce.turns")
    pool.wait_for(lambda: pool.replied_and_ended(1, 1), "one turn")
    pool.wait_for(lambda: all(r.taken_at for r in pool.requests()) or None, "request taken")
    seen_now = pool.thread()
    assert (len(seen_now.rule_messages), seen_now.turns, seen_now.replies) == (1, 1, 1)
    assert seen_now.model_calls == 1
    broker.close()


def test_a_lost_announcement_goes_again_while_others_wait_in_the_queue(
    make_pool: Callable[..., TurnPool],
) -> None:
    # Given a dispatcher with a 1 s grace (a turn's mark lives 2 s), and no turn worker yet
    # When a run sends, and its turn's announcement waits in the turns queue
    pool, broker = _queued_turn(make_pool)
    [request] = pool.wait_for(lambda: pool.requests() or None, "the turn request")
    [mine] = broker.lrange("actonce.turns", 0, -1)
    # and another request's announcement is queued, and this one's is lost
    celery = make_celery(Settings.from_env(pool.env))
    send_turn(celery, request.model_copy(update={"message_id": "msg_elsewhere"}))
    celery.close()
    assert broker.lrem("actonce.turns", 1, mine) == 1
    assert broker.llen("actonce.turns") == 1

    # Then, though the queue is not empty, the dispatcher announces the lost one again, once
    pool.wait_for(lambda: _reannounced(pool, request.message_id) or None, "a re-announcement")
    assert broker.llen("actonce.turns") == 2
    # And when a turn worker starts, one turn takes it, and the other announcement asks nothing
    pool.worker("turns", "actonce.turns")
    pool.wait_for(lambda: broker.llen("actonce.turns") == 0 or None, "the queue drained")
    pool.wait_for(lambda: all(r.taken_at for r in pool.requests()) or None, "request taken")
    seen = pool.thread()
    assert (len(seen.rule_messages), seen.turns, seen.replies, seen.model_calls) == (1, 1, 1, 1)
    assert len(_reannounced(pool, request.message_id)) == 1, pool.log("dispatcher")
    broker.close()


def test_a_request_whose_message_is_never_committed_is_read_once_in_five_minutes_asking_nothing(
    make_pool: Callable[..., TurnPool],
) -> None:
    # Given a turn request an attempt recorded an hour ago, and the message it never committed
    pool = make_pool("tests.worker.turn_apps:counted", ACTONCE_TURN_GRACE_S="1")
    orphan = TurnRequest(
        tenant_id=TENANT,
        workspace_id=WORKSPACE,
        thread_id=THREAD_ID,
        message_id="msg_never_committed",
        rule="demo:work",
        requested_at=datetime.now(UTC) - timedelta(hours=1),
    )
    assert pool.runtime.run(pool.runtime.turn_requests.request(orphan))

    # When the pool serves: the dispatcher's sweep announces it, and a turn worker looks
    pool.serve("turns")
    looked = f"turn message_id={orphan.message_id} outcome=pending asks=0"
    pool.wait_for(lambda: looked in pool.log("turns") or None, "the turn worker's look")

    # Then the look asked the Runner nothing, and put the next look five minutes off
    request = pool.runtime.run(pool.runtime.turn_requests.get(TENANT, WORKSPACE, orphan.message_id))
    assert request is not None
    assert (request.asks, request.taken_at) == (0, None), request
    assert request.due_at is not None
    ahead = request.due_at - datetime.now(UTC)
    assert timedelta(seconds=280) <= ahead <= timedelta(seconds=300), ahead
    assert pool.thread().model_calls == 0
    assert pool.log("turns").count(looked) == 1


def test_a_turn_never_taken_stops_at_its_budget_is_dead_lettered_and_replays(
    make_pool: Callable[..., TurnPool],
) -> None:
    # Given an agent that never takes its message, a budget of 3 asks, a 2 s grace, and Sentry
    with SentryCapture(key="turnkey") as sentry:
        pool = make_pool(
            "tests.worker.turn_apps:never_takes",
            ACTONCE_TURN_MAX_ASKS="3",
            ACTONCE_TURN_BACKOFF_S="0.2",
            ACTONCE_TURN_GRACE_S="2",
            ACTONCE_SENTRY_DSN=sentry.dsn,
        )
        pool.serve("turns")
        # When a run sends it a message
        pool.request(ask=True)
        pool.wait_for(lambda: pool.run_status() == "succeeded" or None, "run succeeded")
        # Then after 3 asks the request is dead-lettered turn_not_taken, listed by `dead list`
        listed = pool.wait_for(lambda: pool.dead_listed("turn_not_taken"), "turn_not_taken letter")
        [message_id] = pool.thread().rule_messages
        [line] = [line for line in listed.splitlines() if "turn_not_taken" in line]
        assert f"turn {message_id}" in line and "attempts=3" in line, listed
        # and the task that gave up ended FAILURE, naming the reason and ids, no content
        failed = pool.wait_for(lambda: _turn_failures(pool), "the turn task's FAILURE")
        assert len(failed) == 1, failed
        [(task_id, error)] = failed
        assert f"turn_not_taken: message {message_id}" in error, error
        assert _task_state(pool, task_id) == "FAILURE"
        # and the letter was reported to Sentry, once
        events = sentry.wait_for(lambda found: _turn_reports(found) >= 1, "a Sentry report")
        assert _turn_reports(events) == 1, events
        # and the model was called once per ask, no more, while the dispatcher keeps sweeping
        [request] = pool.requests()
        assert request.asks == 3 and request.taken_at is None
        assert pool.thread().model_calls == 3
        assert (pool.thread().turns, pool.thread().replies) == (0, 0)
        letter_id = line.split()[0]
        # When an operator replays the letter while the broker does not answer
        down = pool.command("dead", "replay", letter_id, ACTONCE_BROKER_URL="redis://127.0.0.1:1/0")
        # Then it fails in one line, and the letter and the request are as they were
        assert down.returncode == 1, down
        [said] = [each for each in down.stderr.splitlines() if each.startswith("Error:")]
        assert "does not answer" in said and "nothing was replayed" in said, down.stderr
        assert letter_id in pool.actonce("dead", "list")
        assert [each.asks for each in pool.requests()] == [3]
        # When an operator replays the letter
        replayed = pool.actonce("dead", "replay", letter_id)
        assert f"turn for message {message_id} announced" in replayed, replayed
        # Then the turn gets a fresh budget of 3 asks, then a second letter and a second FAILURE
        pool.wait_for(
            lambda: (
                (
                    pool.actonce("dead", "list").count("turn_not_taken") == 1
                    and letter_id not in pool.actonce("dead", "list")
                )
                or None
            ),
            "a second turn_not_taken letter",
        )
        pool.wait_for(lambda: len(_turn_failures(pool)) == 2 or None, "a second FAILURE")
        assert pool.thread().model_calls == 6
        assert "turn_not_taken" in pool.actonce("dead", "list", "--all")
        sentry.wait_for(lambda found: _turn_reports(found) == 2, "a second Sentry report")


def test_an_announcement_in_the_back_off_spends_no_ask_and_the_dispatcher_waits_for_due(
    make_pool: Callable[..., TurnPool],
) -> None:
    # Given an agent that never takes its message, 2 asks 15 s apart, and a 1 s grace
    pool = make_pool(
        "tests.worker.turn_apps:never_takes",
        ACTONCE_TURN_MAX_ASKS="2",
        ACTONCE_TURN_BACKOFF_S="15",
        ACTONCE_TURN_GRACE_S="1",
    )
    pool.serve("turns")
    # When a run sends, and its turn is asked for once
    pool.request(ask=True)
    pool.wait_for(lambda: "outcome=not_taken asks=1" in pool.log("turns") or None, "an ask")
    first = pool.wait_for(lambda: _asked(pool, 1), "the first ask")
    assert first.asked_at is not None and first.due_at is not None
    assert pool.thread().model_calls == 1
    # and a second turn worker starts, and the first is SIGKILLed in the back-off, its retry
    # (held by it until it was due) lost with it
    pool.worker("turns2", "actonce.turns")
    pool.kill("turns")
    # and the same turn is announced again while the back-off runs
    celery = make_celery(Settings.from_env(pool.env))
    send_turn(celery, first)
    celery.close()
    # Then that announcement ends quietly, asking nothing: one ask, one model call
    pool.wait_for(lambda: "outcome=not_due asks=1" in pool.log("turns2") or None, "not_due")
    assert _asked(pool, 1) is not None and pool.thread().model_calls == 1
    # And the dispatcher announces the lost turn again only once it is due: the second ask,
    # its budget's last, is made no sooner than the first's back-off allows
    pool.wait_for(lambda: len(_turn_failures(pool, "turns2")) == 1 or None, "FAILURE", 90)
    second = _asked(pool, 2)
    assert second is not None and second.asked_at is not None
    assert second.asked_at >= first.due_at
    announced = _reannounced(pool, first.message_id)
    assert announced and min(announced) >= first.due_at, (announced, first.due_at)
    assert pool.thread().model_calls == 2
    assert pool.actonce("dead", "list").count("turn_not_taken") == 1


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisHandle]:
    """A private `redis-server` for one test that restarts it: the session's is shared, and this
    process's kombu keeps pooled connections to it by URL, which a restart would leave dead."""
    handle = find_or_start_redis(None, directory=tmp_path / "own-redis")
    try:
        yield handle
    finally:
        handle.stop()


def test_a_turn_running_when_redis_restarts_goes_on_and_is_answered_once(
    own_redis: RedisHandle, make_pool: Callable[..., TurnPool], tmp_path: Path
) -> None:
    # Given a turn agent whose model call waits for a release, and a pool of real processes
    release = tmp_path / "release"
    pool = make_pool(
        "tests.worker.turn_apps:held",
        ACTONCE_BROKER_URL=own_redis.url,
        **{RELEASE_FILE: str(release)},
    )
    pool.serve("turns")
    # When a run sends, and Redis restarts (empty) while its turn is in the model call
    pool.request(ask=True)
    pool.wait_for(lambda: pool.thread().model_calls == 1 or None, "the turn in its model call")
    own_redis.restart()
    pool.wait_for(
        lambda: "Connection to broker lost" in pool.log("turns") or None, "the broker's loss"
    )
    release.touch()
    # Then the turn goes on to its reply: one message, one turn, one reply, one model call,
    # nothing abandoned, and the request is taken
    pool.wait_for(lambda: pool.replied_and_ended(1, 1), "the turn's reply and its end")
    pool.wait_for(lambda: all(r.taken_at for r in pool.requests()) or None, "request taken")
    seen = pool.thread()
    assert (len(seen.rule_messages), seen.turns, seen.ended, seen.replies) == (1, 1, 1, 1)
    assert seen.model_calls == 1
    # and the worker said nothing of Celery's default to come, which actonce opts out of
    assert "Terminating it instead" not in pool.log("turns")
    assert "CPendingDeprecationWarning" not in pool.log("turns"), pool.log("turns")


def _held_turns_waited_2s(make: Callable[..., TurnPool], release: Path) -> TurnPool:
    """A dispatcher and an attempts worker whose turns wait 2 s, and whose turn agent's model
    call holds until `release` exists; no turn worker yet."""
    pool = make(
        "tests.worker.turn_apps:held", ACTONCE_TURN_WAIT_S="2", **{RELEASE_FILE: str(release)}
    )
    pool.serve()
    return pool


def test_a_turn_past_its_wait_on_a_prefork_child_is_stopped_and_the_child_serves_on(
    make_pool: Callable[..., TurnPool], tmp_path: Path
) -> None:
    # Given a prefork turn worker that waits 2 s for a turn, and a turn agent whose model call
    # holds until released: a prefork child's loop runs only while one of its tasks does
    release = tmp_path / "release"
    pool = _held_turns_waited_2s(make_pool, release)
    pool.worker("turns", "actonce.turns")
    # When a run sends, and its turn is still in the model call when the wait runs out
    pool.request(ask=True)
    pool.wait_for(lambda: pool.thread().model_calls == 1 or None, "the turn in its model call")
    # Then the turn is stopped, not frozen in the idle child: artifactr records its end, the
    # worker says why, and its message counts as taken, as for a turn whose worker died
    pool.wait_for(lambda: pool.thread().ended == 1 or None, "the turn's recorded end", 30)
    assert "still running after 2.0s (ACTONCE_TURN_WAIT_S): stopped" in pool.log("turns")
    pool.wait_for(lambda: all(r.taken_at for r in pool.requests()) or None, "request taken")
    # And the child serves the thread's next turn to its reply
    release.touch()
    pool.request(key="turns-next", ask=True)
    pool.wait_for(lambda: pool.replied_and_ended(1, 2), "the next turn's reply and its end")
    seen = pool.thread()
    assert (len(seen.rule_messages), seen.turns, seen.ended, seen.model_calls) == (2, 2, 2, 2)


def test_a_turn_past_its_wait_on_a_threads_worker_goes_on_to_its_reply(
    make_pool: Callable[..., TurnPool], tmp_path: Path
) -> None:
    # Given a threads turn worker that waits 2 s for a turn: its loop runs between tasks
    release = tmp_path / "release"
    pool = _held_turns_waited_2s(make_pool, release)
    threads = ("-P", "threads", "-c", "2", "-Q", "actonce.turns", "-n", f"turns-{os.getpid()}@%h")
    pool.start("turns", "worker", *threads)
    pool.wait_for(lambda: "ready." in pool.log("turns") or None, "turns ready", 60)
    # When a run sends, and its turn is still in the model call once its task has ended
    pool.request(ask=True)
    pool.wait_for(lambda: pool.thread().model_calls == 1 or None, "the turn in its model call")
    pool.wait_for(lambda: "outcome=taken" in pool.log("turns") or None, "the turn task's end")
    assert pool.thread().ended == 0
    release.touch()
    # Then the turn goes on in the process's loop to its reply, and nothing was stopped
    pool.wait_for(lambda: pool.replied_and_ended(1, 1), "the turn's reply and its end")
    seen = pool.thread()
    assert (seen.turns, seen.ended, seen.model_calls) == (1, 1, 1)
    assert "ACTONCE_TURN_WAIT_S): stopped" not in pool.log("turns")


def test_an_attempt_running_when_redis_restarts_goes_on_and_spends_one_attempt(
    own_redis: RedisHandle, make_pool: Callable[..., TurnPool]
) -> None:
    # Given a pool of real processes on a Redis of this test's own
    pool = make_pool("tests.worker.turn_apps:counted", ACTONCE_BROKER_URL=own_redis.url)
    pool.serve()
    # When Redis restarts (empty) while an attempt sleeps after its first write
    pool.request(slow_s=4)
    pool.wait_for(lambda: pool.run_status() == "running" or None, "the attempt under way")
    own_redis.restart()
    pool.wait_for(
        lambda: "Connection to broker lost" in pool.log("attempts") or None, "the broker's loss"
    )
    # Then the attempt goes on to succeed: one attempt spent, not a retry after a kill
    pool.wait_for(lambda: pool.run_status() == "succeeded" or None, "run succeeded")
    run = pool.the_run()
    assert run is not None and run.attempts == 1, run
    assert "Terminating it instead" not in pool.log("attempts")


def test_a_turn_whose_store_goes_away_retries_and_is_taken_once(
    postgres_url: str, make_pool: Callable[..., TurnPool]
) -> None:
    # Given a pool on PostgreSQL whose run sent a message; its turn announced, not yet taken
    pool = make_pool("tests.worker.turn_apps:counted", ACTONCE_DATABASE_URL=postgres_url)
    pool.serve()
    pool.request(ask=True)
    pool.wait_for(lambda: pool.run_status() == "succeeded" or None, "run succeeded")
    pool.wait_for(lambda: pool.requests() or None, "the turn request")
    # and no dispatcher left to announce it again: only the task's own retry can take it
    pool.kill("dispatcher")

    async def a_turn_worker_starts() -> None:
        pool.start("turns", "worker", "-c", "1", "-Q", "actonce.turns")

    # When the turn requests are locked, a turn worker's read waits on the lock, and the
    # database drops that connection
    pool.runtime.run(
        drop_the_waiting_connection(postgres_url, TURN_REQUESTS.name, a_turn_worker_starts)
    )

    # Then the task retries, and one turn takes the message: one reply, one model call
    pool.wait_for(lambda: all(r.taken_at for r in pool.requests()) or None, "request taken")
    assert re.search(
        r"turn task_id=\S+: a store went away \(\w+\); retrying in 1s", pool.log("turns")
    ), pool.log("turns")
    seen = pool.thread()
    assert (len(seen.rule_messages), seen.turns, seen.replies, seen.model_calls) == (1, 1, 1, 1)
    assert "raised unexpected" not in pool.log("turns"), pool.log("turns")


# ─── how ──────────────────────────────────────────────────────────────────────


def _asked(pool: TurnPool, asks: int) -> TurnRequest | None:
    """The pool's one request once it has been asked for `asks` times, else None."""
    requests = pool.requests()
    return requests[0] if len(requests) == 1 and requests[0].asks == asks else None


_FAILURE_LINE = re.compile(
    r"Task actonce\.take_turn\[([^\]]+)\] raised expected: TurnNotTaken\((.*)\)"
)


def _turn_failures(pool: TurnPool, *names: str) -> list[tuple[str, str]]:
    """The turn tasks that ended FAILURE with `TurnNotTaken`, by their workers' logs: task id
    and error."""
    text = "".join(pool.log(name) for name in (names or ("turns",)))
    return [(m.group(1), m.group(2)) for m in _FAILURE_LINE.finditer(text)]


def _task_state(pool: TurnPool, task_id: str) -> str:
    """A task's state in the result backend."""
    celery = make_celery(Settings.from_env(pool.env))
    try:
        return str(celery.AsyncResult(task_id).state)
    finally:
        celery.close()


def _turn_reports(events: list[dict[str, Any]]) -> int:
    """How many of Sentry's events report a `turn_not_taken` dead letter."""
    return sum(
        1
        for event in events
        if event.get("tags", {}).get("dead_letter") == "true"
        and event.get("tags", {}).get("reason") == "turn_not_taken"
    )


def _reannounced(pool: TurnPool, message_id: str, dispatcher: str = "dispatcher") -> list[datetime]:
    """When `dispatcher` announced `message_id`'s turn again, by its log lines' times."""
    found = []
    for line in pool.log(dispatcher).splitlines():
        if f"turn re-announced message_id={message_id}" in line:
            found.append(_logged_at(line))
    return found


def _logged_at(line: str) -> datetime:
    """The time a log line of `actonce`'s (`[%(asctime)s: …`, local time) was written, in UTC."""
    stamp = line[1 : line.index(": ")]
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").astimezone(UTC)


def test_a_turn_waits_between_asks_no_longer_than_a_retry_may_wait(
    make_pool: Callable[..., TurnPool],
) -> None:
    # Given an agent that never takes its message, a budget of 2 asks, and a first back-off
    # (120 s) past how far ahead the intake lets a retry be due (ACTONCE_MAX_RETRY_DELAY_S=1
    # plus the lease and a minute)
    pool = make_pool(
        "tests.worker.turn_apps:never_takes",
        ACTONCE_TURN_MAX_ASKS="2",
        ACTONCE_TURN_BACKOFF_S="120",
        ACTONCE_MAX_RETRY_DELAY_S="1",
    )
    pool.serve("turns")
    # When a run sends it a message
    pool.request(ask=True)
    # Then the second ask comes a second after the first, its retry not refused by the intake:
    # the budget is spent within seconds and dead-lettered turn_not_taken, the only letter
    listed = pool.wait_for(lambda: pool.dead_listed("turn_not_taken"), "turn_not_taken letter", 30)
    assert len(listed.splitlines()) == 1 and "eta_out_of_range" not in listed, listed
    [request] = pool.requests()
    assert request.asks == 2 and request.taken_at is None
    assert pool.thread().model_calls == 2


def test_a_turn_whose_thread_another_turn_holds_waits_without_spending_an_ask(
    make_pool: Callable[..., TurnPool], tmp_path: Path
) -> None:
    # Given two turn workers, and an agent whose model call holds until released
    release = tmp_path / "release"
    pool = make_pool(
        "tests.worker.turn_apps:held",
        ACTONCE_TURN_BACKOFF_S="0.5",
        **{RELEASE_FILE: str(release)},
    )
    pool.serve("turns", "turns2")
    # When one run's turn holds the thread in its model call, and a second run asks in it
    pool.request(key="first", ask=True)
    pool.wait_for(lambda: pool.thread().model_calls == 1 or None, "the first turn in its model")
    pool.request(key="second", ask=True)
    # Then the second's turn task finds the thread busy, spends no ask, and retries
    busy = pool.wait_for(lambda: _busy(pool), "a busy turn")
    [first] = [r for r in pool.requests() if r.message_id != busy]
    assert first.asks == 1 and pool.thread().model_calls == 1
    # When the first turn is released, both messages are taken, within one ask each: the second
    # by a turn of its own, or by the first, whose run took it in before it ended (artifactr's)
    release.touch()
    pool.wait_for(lambda: all(r.taken_at for r in pool.requests()) or None, "both taken")
    pool.wait_for(lambda: pool.thread().replies >= 1 or None, "a reply")
    assert all(r.asks <= 1 for r in pool.requests()), pool.requests()
    assert "turn_not_taken" not in pool.actonce("dead", "list")


def _busy(pool: TurnPool) -> str | None:
    """The message whose turn task found its thread busy and spent no ask, once one did."""
    logs = pool.log("turns") + pool.log("turns2")
    found = re.search(r"turn message_id=(\S+) outcome=busy asks=0", logs)
    return found.group(1) if found else None


def test_a_turn_worker_killed_mid_turn_leaves_its_message_taken_and_unanswered(
    make_pool: Callable[..., TurnPool], tmp_path: Path
) -> None:
    # Given a turn worker whose agent's model call holds until released, and a 2 s grace
    release = tmp_path / "release"
    pool = make_pool(
        "tests.worker.turn_apps:held", ACTONCE_TURN_GRACE_S="2", **{RELEASE_FILE: str(release)}
    )
    pool.serve("turns")
    # When a run sends, and its turn's worker is SIGKILLed, child and all, in the model call
    pool.request(ask=True)
    pool.wait_for(lambda: pool.thread().model_calls == 1 or None, "the turn in its model call")
    assert (pool.thread().turns, pool.thread().ended) == (1, 0)
    pool.kill("turns")
    release.touch()  # every later model call answers at once
    # and another turn worker starts
    pool.worker("turns-after", "actonce.turns")
    # Then the limit the docs state (docs/turns.md, "The limit"): the turn had started, so
    # artifactr counts the message taken; the request is marked so, and no turn answers it
    pool.wait_for(lambda: all(r.taken_at for r in pool.requests()) or None, "request taken", 90)
    [request] = pool.requests()
    assert request.asks == 1, request
    seen = pool.thread()
    assert (seen.turns, seen.replies, seen.model_calls) == (1, 0, 1), seen
    assert pool.run_status() == "succeeded"
    # When the rule sends the thread's next message
    pool.request(key="turns-next", ask=True)
    # Then its turn, once the dead worker's claim on the thread lapsed, records the killed turn
    # abandoned and answers the next message alone: two turns, one reply, two model calls
    pool.wait_for(lambda: pool.replied_and_ended(1, 2), "the next message's reply", 150)
    seen = pool.thread()
    assert (len(seen.rule_messages), seen.turns, seen.replies, seen.model_calls) == (2, 2, 1, 2)
    assert seen.ends == ["failed:abandoned", "completed"], seen
    pool.wait_for(lambda: all(r.taken_at for r in pool.requests()) or None, "both taken")
    assert "turn_not_taken" not in pool.actonce("dead", "list")


def test_a_dispatcher_killed_and_replaced_sends_every_due_run_and_untaken_turn_once(
    make_pool: Callable[..., TurnPool],
) -> None:
    # Given a dispatcher (a 2 s grace, sent marks living 5 s) and a worker for attempts only,
    # every task-sent event the pool publishes heard from the start
    # (room in the queue for every run fair share would otherwise hold back, as the test counts
    # them there while no attempts worker serves)
    pool = make_pool(
        "tests.worker.turn_apps:counted",
        ACTONCE_TURN_GRACE_S="2",
        ACTONCE_FAIR_QUEUED_PER_CHILD="100",
    )
    broker = redis.Redis.from_url(pool.env["ACTONCE_BROKER_URL"])
    events: list[dict[str, Any]] = []
    with celery_events(Settings.from_env(pool.env), events):
        pool.serve()
        # When two runs send messages, their turns announced while no turn worker serves
        for key in ("turn-0", "turn-1"):
            pool.request(key=key, ask=True)
        pool.wait_for(lambda: _succeeded(pool, 2), "the sending runs")
        untaken = pool.wait_for(lambda: _all_requested(pool, 2), "their turn requests")
        # and, the attempts worker gone, three runs are sent and wait in the queue
        pool.kill("attempts")
        for key in ("queued-0", "queued-1", "queued-2"):
            pool.request(key=key)
        pool.wait_for(lambda: broker.llen("actonce.attempts") == 3 or None, "3 sent")
        queued = {run.id for run in pool.runs() if run.status != "succeeded"}
        # and the dispatcher is SIGKILLed, the turns' announcements are lost (as a Redis
        # restart loses them), and two events arrive with no dispatcher to evaluate them
        pool.kill("dispatcher")
        killed_at = time.monotonic()
        broker.delete("actonce.turns")
        for key in ("late-0", "late-1"):
            pool.request(key=key)
        # When another dispatcher starts
        pool.start("dispatcher2", "dispatch")
        # Then it evaluates the late events and sends their runs, and sends the queued runs
        # again neither while they wait, past the marks' lifetime, nor after
        pool.wait_for(lambda: broker.llen("actonce.attempts") == 5 or None, "5 queued", 60)
        pool.wait_for(
            lambda: (time.monotonic() - killed_at > 8 and _marked(broker, queued)) or None,
            "the queued runs' marks renewed past their lifetime",
        )
        assert broker.llen("actonce.attempts") == 5
        # and announces each lost turn again, once
        for request in untaken:
            pool.wait_for(
                lambda request=request: (
                    _reannounced(pool, request.message_id, "dispatcher2") or None
                ),
                f"{request.message_id} re-announced",
            )
        # When an attempts worker and a turn worker start
        pool.worker("attempts2", "actonce.attempts")
        pool.worker("turns", "actonce.turns")
        # Then every run succeeds in one attempt, each sent once
        runs = pool.wait_for(lambda: _succeeded(pool, 7), "seven runs succeeded", 90)
        assert all(run.attempts == 1 for run in runs), runs
        sent = _sent_attempts(events)
        assert {run.id: sent.count(run.id) for run in runs} == {run.id: 1 for run in runs}
        # and each message is taken once, within one ask: by a turn of its own, or by the first
        # turn in the thread, which takes in every message posted before it (artifactr's)
        pool.wait_for(lambda: all(r.taken_at for r in pool.requests()) or None, "both taken", 60)
        assert all(r.asks <= 1 for r in pool.requests()), pool.requests()
        seen = pool.wait_for(lambda: _turns_ended(pool), "the turns' replies and ends")
        assert len(seen.rule_messages) == 2 and 1 <= seen.turns <= 2, seen
        assert seen.replies == seen.model_calls == seen.turns, seen
        for request in untaken:
            assert len(_reannounced(pool, request.message_id, "dispatcher2")) == 1
    broker.close()


def _turns_ended(pool: TurnPool) -> Turns | None:
    """The thread's turns once at least one ran and each has ended with its reply."""
    seen = pool.thread()
    return seen if seen.turns and seen.ended == seen.replies == seen.turns else None


def _succeeded(pool: TurnPool, count: int) -> list[Run] | None:
    """The workspace's runs once `count` of them exist and all succeeded."""
    runs = pool.runs()
    return runs if len(runs) == count and all(r.status == "succeeded" for r in runs) else None


def _all_requested(pool: TurnPool, count: int) -> list[TurnRequest] | None:
    """The workspace's turn requests once there are `count`, none taken."""
    found = pool.requests()
    return found if len(found) == count and not any(r.taken_at for r in found) else None


def _marked(broker: redis.Redis, run_ids: set[str]) -> bool:
    """Whether each of `run_ids` still has a sent mark."""
    keys = [key.decode() for key in broker.keys("actonce:sent:*")]
    return all(any(f":{run_id}:" in key for key in keys) for run_id in run_ids)


def _sent_attempts(events: list[dict[str, Any]]) -> list[str]:
    """The run id of each attempt message the pool's task-sent events announced."""
    found = []
    for event in list(events):
        if event.get("type") == "task-sent" and event.get("name") == ATTEMPT_TASK:
            named = re.search(r"'run_id': '([^']+)'", str(event.get("kwargs")))
            assert named, event
            found.append(named.group(1))
    return found
