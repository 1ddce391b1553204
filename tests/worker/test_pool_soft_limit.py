"""Celery's time limits in a prefork child, through the door: real `actonce worker` and
`actonce dispatch` processes, on either event loop.

The soft limit (`ACTONCE_SOFT_TIME_LIMIT_S`, here 3 s) cancels the task's coroutine; the task is
delivered again and settles on what the stores hold; the hard limit (60 s) never comes, so the
child that met the soft limit is the one that serves on. A run whose every attempt meets it is
dead-lettered once the rule's attempts run out, its one write made once. An action that blocks
its thread is out of the soft limit's reach: the hard limit (5 s there) kills its child, and the
dispatcher's sweep sends the run again. Before, uvloop logged the soft limit as an error in a
callback and the task ran on (an attempt sleeping 20 s then succeeded at its first attempt), and
asyncio's loop let it out as the task's FAILURE, leaving a turn frozen.
"""

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import pytest
from turn_apps import RELEASE_FILE
from turn_pools import TurnPool, pool_maker

from lab.redis import RedisHandle

pytestmark = pytest.mark.slow

REDIS_DB: Final = 15
"""The private Redis's database these pools use: no other module's."""

LIMITS: Final = {"ACTONCE_SOFT_TIME_LIMIT_S": "3", "ACTONCE_TIME_LIMIT_S": "60"}
"""A soft limit a test waits for, and a hard limit it never meets."""

LOOPS: Final = ["uvloop", "asyncio"]
"""The event loops a child may run (`ACTONCE_EVENT_LOOP`); the signal lands differently in each."""

NOT_HANDLED: Final = ("Hard time limit", "Exception in callback", "raised unexpected")
"""What a worker logs when a soft limit was not turned into a cancellation."""


@pytest.fixture
def make_pool(tmp_path: Path, redis_server: RedisHandle) -> Iterator[Callable[..., TurnPool]]:
    """Build a pool's stores and runtime for a definition and settings; processes start later."""
    with pool_maker(tmp_path, redis_server, REDIS_DB) as make:
        yield make


@pytest.mark.parametrize("loop", LOOPS)
def test_an_attempt_past_its_soft_limit_is_cancelled_and_its_run_succeeds_next_attempt(
    make_pool: Callable[..., TurnPool], loop: str
) -> None:
    # Given a prefork worker whose tasks have a 3 s soft limit, on `loop`
    pool = make_pool("tests.worker.turn_apps:counted", ACTONCE_EVENT_LOOP=loop, **LIMITS)
    pool.serve()
    child = pool.child_of("attempts")
    # When a run's first attempt sleeps 20 s after its first write (the notice)
    pool.request(slow_s=20)
    # Then the attempt is cancelled at the soft limit, its task delivered again, and the run
    # succeeds at its second attempt (the first recorded abandoned), long before the sleep ends
    pool.wait_for(lambda: pool.run_status() == "succeeded" or None, "run succeeded", 15)
    run = pool.the_run()
    assert run is not None and run.attempts == 2, run
    log = pool.log("attempts")
    assert "stopped at its soft time limit (ACTONCE_SOFT_TIME_LIMIT_S=3s)" in log, log
    assert f"run_id={run.id} task_id=" in log, log
    # and its one notice was posted once: the second attempt found it made
    assert len(pool.notices()) == 1, pool.notices()
    # And no hard limit came: the same child served on
    assert not any(needle in log for needle in NOT_HANDLED), log
    assert pool.child_of("attempts") == child


@pytest.mark.parametrize("loop", LOOPS)
def test_a_turn_past_its_soft_limit_is_stopped_and_its_child_serves_the_next(
    make_pool: Callable[..., TurnPool], tmp_path: Path, loop: str
) -> None:
    # Given a prefork turn worker whose tasks have a 3 s soft limit, on `loop`, that would wait
    # a minute for a turn, and a turn agent whose model call holds until released
    release = tmp_path / "release"
    pool = make_pool(
        "tests.worker.turn_apps:held",
        ACTONCE_EVENT_LOOP=loop,
        ACTONCE_TURN_WAIT_S="50",
        **LIMITS,
        **{RELEASE_FILE: str(release)},
    )
    pool.serve("turns")
    child = pool.child_of("turns")
    # When a run sends, and its turn is still in the model call at the soft limit
    pool.request(ask=True)
    pool.wait_for(lambda: pool.thread().model_calls == 1 or None, "the turn in its model call")
    # Then the turn is stopped, not frozen: artifactr records its end, the worker says why, and
    # the task's next delivery finds the message taken, as for a turn whose worker died
    pool.wait_for(lambda: pool.thread().ended == 1 or None, "the turn's recorded end", 20)
    pool.wait_for(lambda: all(r.taken_at for r in pool.requests()) or None, "request taken")
    log = pool.log("turns")
    assert "still running at the task's soft time limit: stopped" in log, log
    assert "stopped at its soft time limit (ACTONCE_SOFT_TIME_LIMIT_S=3s)" in log, log
    # And the same child, never killed, serves the thread's next turn to its reply
    release.touch()
    pool.request(key="turns-next", ask=True)
    pool.wait_for(lambda: pool.replied_and_ended(1, 2), "the next turn's reply and its end")
    seen = pool.thread()
    assert (len(seen.rule_messages), seen.turns, seen.ended, seen.model_calls) == (2, 2, 2, 2)
    assert not any(needle in pool.log("turns") for needle in NOT_HANDLED), pool.log("turns")
    assert pool.child_of("turns") == child


def test_a_run_whose_every_attempt_meets_the_soft_limit_is_dead_lettered_once_they_run_out(
    make_pool: Callable[..., TurnPool],
) -> None:
    # Given a prefork worker whose tasks have a 3 s soft limit, and a rule (3 attempts) whose
    # action posts its notice, then sleeps a minute at every attempt
    pool = make_pool("tests.worker.turn_apps:stuck", **LIMITS)
    pool.serve()
    child = pool.child_of("attempts")
    # When a run fires
    pool.request()
    # Then each attempt is cancelled at the soft limit and recorded abandoned, and once the
    # rule's three attempts ran out the run is dead, and dead-lettered, long before any sleep ends
    pool.wait_for(lambda: pool.run_status() == "dead" or None, "run dead", 40)
    run = pool.the_run()
    assert run is not None and run.attempts == 3, run
    listed = pool.wait_for(lambda: pool.dead_listed(run.id), "the run's dead letter")
    assert "attempts_exhausted" in listed and "attempts=3" in listed, listed
    shown = pool.actonce("dead", "show", "--detail", listed.split()[0])
    assert "abandoned" in shown, shown
    log = pool.log("attempts")
    assert log.count("stopped at its soft time limit (ACTONCE_SOFT_TIME_LIMIT_S=3s)") == 3, log
    # and its notice, written at every attempt, was posted once
    assert len(pool.notices()) == 1, pool.notices()
    # And no hard limit came: the same child served every attempt
    assert not any(needle in log for needle in NOT_HANDLED), log
    assert pool.child_of("attempts") == child


def test_an_attempt_that_blocks_its_thread_is_killed_at_the_hard_limit_and_its_run_succeeds(
    make_pool: Callable[..., TurnPool],
) -> None:
    # Given a prefork worker whose tasks have a 2 s soft and a 5 s hard limit, and a rule whose
    # first attempt posts its notice, then blocks its thread (no cancellation reaches it)
    pool = make_pool(
        "tests.worker.turn_apps:blocking", ACTONCE_SOFT_TIME_LIMIT_S="2", ACTONCE_TIME_LIMIT_S="5"
    )
    pool.serve()
    child = pool.child_of("attempts")
    # When a run fires
    pool.request()
    # Then the hard limit kills the child, a new one takes its place, and once the run's lease
    # lapsed the dispatcher sends it again: it succeeds at its second attempt
    pool.wait_for(lambda: pool.run_status() == "succeeded" or None, "run succeeded", 40)
    run = pool.the_run()
    assert run is not None and run.attempts == 2, run
    log = pool.log("attempts")
    assert "Hard time limit (5s) exceeded" in log, log
    assert pool.child_of("attempts") != child
    # and its notice, written by both attempts, was posted once
    assert len(pool.notices()) == 1, pool.notices()
