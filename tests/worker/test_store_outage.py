"""A store that goes away, for real: the task retries instead of failing, and the intake holds
what it cannot letter without spinning.

A dead run's letter is written after the run's outcome is committed. If the database drops the
task's connection in between, nothing would ever send that finished run again: the task must
retry, and its next delivery write the letter. `make chaos` lost one letter so when it crashed
its database (on 508c087); here the cut is made deterministic. The test holds the dead-letter
table locked, waits until the worker's insert waits on the lock, and terminates that backend.

A message the intake refuses while the whole database is away (every connection terminated, new
ones refused) cannot be lettered: it is held in Redis and tried again with a back-off, while the
worker's main process stays idle; its letter is written once the database returns, and the pool
serves the next run.
"""

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Final

import psutil
import pytest
import redis
from pools import (
    POOL_ENV,
    TENANT,
    Pool,
    broker_url,
    database_away,
    drop_the_waiting_connection,
    running_pool,
    wait_until,
)

from actonce.worker.dead_letters.store import TABLE_NAME, intake_letter_id
from actonce.worker.intake.transport import HELD_KEY
from actonce.worker.settings import ATTEMPTS_QUEUE, STORES
from demo.definition import WorkRequested
from demo.feed import request_work
from lab.postgres import PostgresHandle
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> Iterator[Pool]:
    """A pool on a PostgreSQL database of its own: one worker, one child, a dispatcher."""
    env = {**POOL_ENV, "ACTONCE_BROKER_URL": broker_url(redis_server, 14)}
    base: Path = tmp_path_factory.mktemp("outage")
    with running_pool("postgres", env, base, postgres_database, workers=1, concurrency=1) as pool:
        yield pool


def test_a_connection_lost_before_the_dead_letter_is_retried_and_the_letter_kept(
    pool: Pool,
) -> None:
    scene = pool.scene("outage")

    async def a_run_dies() -> None:
        event = WorkRequested(key="cut", die=True)
        await request_work(pool.runtime.reflexr, TENANT, scene.workspace_id, event)

    # Given the dead-letter table locked, when a run dies and its task's write of the letter
    # waits on the lock, and the database drops that connection
    url = pool.env["ACTONCE_DATABASE_URL"]
    pool.run(drop_the_waiting_connection(url, TABLE_NAME, a_run_dies))

    # Then the run is dead once, its letter is kept, and the task retried before it failed
    (run,) = scene.settled()
    assert (run.status, run.attempts) == ("dead", 1), run
    letter = scene.letter_of(run.id, timeout_s=20)
    assert letter.task_id is not None
    task_id = letter.task_id
    wait_until(lambda: pool.final_state(task_id) == "FAILURE", "the task to fail")
    assert pool.task_states(task_id) == ["RETRY", "FAILURE"], pool.worker_log()
    assert "a store went away (DBAPIError); retrying in 1s" in pool.worker_log()
    pool.assert_alive()


NOT_KEPT: Final = "could not dead-letter a message refused from actonce.attempts"
"""The worker's warning for each try of the store that failed to keep a refused message's letter."""

IDLE_CPU: Final = 0.15
"""The most of one core the worker's processes may use, on average, while a message is held:
a worker that popped, tried and put the message back in a loop used a whole one."""


def test_a_message_refused_while_the_database_is_away_is_held_without_spinning_and_lettered_once(
    pool: Pool, postgres_server: PostgresHandle
) -> None:
    scene = pool.scene("intake-outage")
    broker = redis.Redis.from_url(pool.env["ACTONCE_BROKER_URL"])
    worker_pid = pool.local.pid("worker0")
    assert worker_pid is not None
    worker = psutil.Process(worker_pid)
    item = f"not a message {uuid.uuid4().hex}".encode()
    url = pool.env["ACTONCE_DATABASE_URL"]

    with database_away(postgres_server, url):
        # When a message the intake refuses arrives while the database is away
        broker.lpush(ATTEMPTS_QUEUE, item)

        # Then the worker tries to letter it, fails, and holds it in Redis, off the queue
        wait_until(
            lambda: NOT_KEPT in pool.worker_log() and broker.zcard(HELD_KEY) == 1,
            "the refused message to be held after a failed try",
        )
        # And while the database stays away, its processes stay idle: sampled every 0.25 s
        # over 6 s, the message never back on the queue for long, the store tried with back-off
        used = cpu_while_held(worker, broker, seconds=6.0)
        assert used < IDLE_CPU, f"the worker used {used:.2f} of a core while the store was away"
        tries = pool.worker_log().count(NOT_KEPT)
        assert 1 <= tries <= 4, f"{tries} tries in ~7 s: 1 s doubling gives at most 4"

    # When the database returns (this process's connections were cut too: make new ones)
    for store in STORES:
        pool.run(pool.runtime.engine(store).dispose())

    # Then its letter is written, once, and nothing stays held
    letter_id = intake_letter_id(item)
    letter = pool.letter(lambda found: found.id == letter_id, timeout_s=60)
    assert (letter.reason, letter.queue, letter.raw_message()) == (
        "malformed_message",
        ATTEMPTS_QUEUE,
        item,
    )
    wait_until(lambda: broker.zcard(HELD_KEY) == 0, "nothing to be held")
    assert pool.worker_log().count(f"dead letter {letter_id} ") == 1, pool.worker_log()[-4000:]
    assert "the dead-letter store answers again" in pool.worker_log()
    # And the pool serves the next run, with the same processes
    scene.request("after-the-outage")
    (run,) = scene.settled(timeout_s=90)
    assert run.status == "succeeded", run
    assert [found.id for found in pool.letters()].count(letter_id) == 1
    pool.assert_alive()
    assert pool.local.pid("worker0") == worker_pid


def cpu_while_held(worker: psutil.Process, broker: redis.Redis, seconds: float) -> float:
    """Return the share of one core the worker and its children used over `seconds`, sampled
    every 0.25 s; fail if the held message was found off the hold at two samples in a row (a
    message popped and pushed back in a loop is seen on its queue)."""
    processes = [worker, *worker.children(recursive=True)]

    def used() -> float:
        total = 0.0
        for process in processes:
            times = process.cpu_times()
            total += times.user + times.system
        return total

    started, began = time.monotonic(), used()
    off_hold = 0
    while (elapsed := time.monotonic() - started) < seconds:
        off_hold = off_hold + 1 if broker.zcard(HELD_KEY) == 0 else 0
        assert off_hold < 2, "the refused message is off the hold: popped again and again?"
        time.sleep(0.25)
    return (used() - began) / elapsed
